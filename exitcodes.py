"""What a program of the core says: its exit codes, the errors a user can fix (one line on
stderr and an exit code each), and its output, one JSON object per line. commandline.py turns
every error into its line; each code says beside it when it is used."""

import contextvars
import dataclasses
import json
import shlex
import sys

EXIT_HTTP_ERROR = 1  # the receiver answered with an error (http_error shows it)
EXIT_USAGE = 2  # a usage or configuration mistake: one line on stderr
EXIT_NO_ANSWER = 3  # the receiver (or a Postgres CHECKPOINT_DB) could not be reached, or a
#                     Postgres CHECKPOINT_DB stopped answering mid-run (a restart)
EXIT_THREAD = 4  # resume or state of an unknown thread, or start of one that exists
EXIT_CHECKPOINT_WRITE = 74  # the SQLite CHECKPOINT_DB cannot be written: read-only, its disk
#                             full, or an open file no longer writable (EX_IOERR); resume once
#                             it can be
EXIT_UNSETTLED = 6  # an effect may have happened and no evidence says not: look, reconcile it
EXIT_LEDGER_DAMAGED = 7  # a ledger row fails its own check (a receipt changed, forged or gone,
#                          effects.Damaged): this code will not use it, and sends nothing for it
EXIT_DRAINED = 75  # stopped cleanly on SIGTERM, checkpoint saved: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_KILLED = 137  # a `kill` failpoint: SIGKILL is signal 9, and a shell reports 128 + 9


class UserError(Exception):
    """A mistake the user can fix: one line on stderr and this exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class Unreachable(UserError):
    """The connection was refused: nothing was sent, so the same request may be tried again."""


class NoAnswer(UserError):
    """The request was sent and no answer came back: it may or may not have taken effect."""


@dataclasses.dataclass(frozen=True)
class Typed:
    """How a program is typed in a shell: its native command and, for a program that also runs
    through Docker, the same program there (the words before its arguments). A hint names the
    whole command with it, as the exit-6 "look with" line does:

        python -m app resume --thread t (Docker: docker compose run --rm app resume --thread t)
    """

    native: str
    docker: str = ""

    @classmethod
    def of(cls, prog, docker=""):
        """A parser's prog as typed: `python workflow.py` for a script, `python -m app` for a
        module (`python -m app` names itself app)."""
        return cls(f"python {prog}" if prog.endswith(".py") else f"python -m {prog}", docker)

    def __call__(self, words):
        docker = f" (Docker: {self.docker} {words})" if self.docker else ""
        return f"{self.native} {words}{docker}"


# The running program's Typed: run_action (commandline.py) sets it from its parser, so a line
# raised deep in the ledger names the program that printed it. A context variable: LangGraph's
# executors copy it into the threads that run the nodes.
TYPED = contextvars.ContextVar("typed", default=Typed.of("workflow.py"))  # noqa: B039 (frozen)


# The words that go on from the run in hand ("resume --thread t", or a subcommand's own resume):
# run_action sets them for a graph command, so the ledger's line can name its resume; None for
# a program that runs it again itself (a queue's workers retry the job).
GOING_ON = contextvars.ContextVar("going_on", default=None)


def command(words):
    """The whole command that runs words (a subcommand and its switches) in this program, as
    printed in a hint: what a user pastes into a shell."""
    return TYPED.get()(words)


def looking(words, aside=""):
    """An effect's look_with (effects.Effect) that names a command of the running program:
    WORDS with {key} filled in (quoted for a shell), as command() types it, then aside."""
    return lambda key: command(words.format(key=shlex.quote(key))) + aside.format(key=key)


def resume_command():
    """The whole command that goes on from the run in hand (its resume), or what to do."""
    words = GOING_ON.get()
    return command(words) if words else "run it again"


def emit(event, **values):
    """One JSON line, in one write: print() writes the text and its newline apart when output is
    unbuffered, and two processes on one pipe (the drill's child and its resume) could splice."""
    sys.stdout.write(json.dumps({"event": event, **values}, sort_keys=True) + "\n")
    sys.stdout.flush()


def announce(name, action):
    """Say which failpoint fires, before it kills or stops the process."""
    if action == "kill":
        emit("crash", at=name)
    elif action == "term":
        emit("sigterm", at=name)
