"""How a command of the core runs: its parser (one line for a usage mistake), its settings from
the environment (ProgramSettings), and run_action, which runs the parsed command and turns every
error a user can meet into one line on stderr and its exit code (exitcodes.py), with the hint
that says how a stopped run goes on (hints.py); the graph commands and reconcile's."""

import argparse
import atexit
import dataclasses
import gc
import os
import signal
import sqlite3
import sys
import threading
import urllib.error

import corrections
import effects
import exitcodes
import failpoints
import tracing
from checkpoints import open_checkpointer, require_thread, thread_config
from exitcodes import (
    EXIT_DRAINED,
    EXIT_HTTP_ERROR,
    EXIT_INTERRUPTED,
    EXIT_LEDGER_DAMAGED,
    EXIT_THREAD,
    EXIT_UNSETTLED,
    EXIT_USAGE,
    Typed,
    Unreachable,
    UserError,
    announce,
    emit,
)
from failpoints import fail
from hints import (
    default_thread,
    going_on_words,
    interrupted_hint,
    lost_postgres,
    report_database_error,
    report_http_error,
    report_lost_postgres,
    resume_hint,
)
from providers import number


@dataclasses.dataclass(frozen=True)
class ProgramSettings:
    """The environment's settings, checked. providers: the program's, each configured."""

    checkpoint_db: str = "data/workflow/checkpoints.sqlite"
    providers: tuple = ()  # a subclass names its Provider declarations here
    failpoints: str = ""
    trace: str = ""  # TRACE
    lease_s: float = effects.LEASE_S  # LEDGER_LEASE_S: how long a SQLite lease keeps others out
    receipt_key: str = dataclasses.field(default="", repr=False)  # LEDGER_RECEIPT_KEY: a secret
    receipt_unkeyed: str = "refuse"  # LEDGER_RECEIPT_UNKEYED

    @classmethod
    def from_environ(cls, environ):
        """The settings; a bad value is a UserError naming the variable."""
        return cls(
            checkpoint_db=environ.get("CHECKPOINT_DB", cls.checkpoint_db),
            providers=tuple(provider.configured(environ) for provider in cls.providers),
            failpoints=environ.get("FAILPOINTS", ""),
            trace=environ.get("TRACE", ""),
            lease_s=number(environ, "LEDGER_LEASE_S", effects.LEASE_S, float),
            receipt_key=environ.get("LEDGER_RECEIPT_KEY", ""),
            receipt_unkeyed=environ.get("LEDGER_RECEIPT_UNKEYED", cls.receipt_unkeyed),
        )

    def provider(self, name="API"):
        (found,) = [provider for provider in self.providers if provider.name == name]
        return found

    def client(self, headers=None, name="API"):
        return self.provider(name).client(headers)

    def clients(self):
        """{provider name: its client}, for a run's Context."""
        return {provider.name: provider.client() for provider in self.providers}

    api_url = property(lambda self: self.provider().url)  # API's settings, by their old names
    timeout_s = property(lambda self: self.provider().timeout_s)
    attempts = property(lambda self: self.provider().attempts)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        self.exit(
            EXIT_USAGE, f"{self.prog}: {message}{where_it_goes(self, message)} (see --help)\n"
        )


def where_it_goes(parser, message):
    """For "unrecognized arguments": the commands that do take the switch given (a switch of
    `hooks` typed on `start`), or that a split JSON value wants quotes; else ""."""
    words = message.removeprefix("unrecognized arguments: ").split()
    if not message.startswith("unrecognized arguments: "):
        return ""
    if any(w.startswith(("{", "[")) or w.endswith(("}", "]")) for w in words):
        return '; the shell split a JSON value at its spaces: quote it, like \'{"title": "t"}\''
    said = []
    for switch in (w.split("=")[0] for w in words if w.startswith("--")):
        names = [name for name, sub in commands(parser) if switch in sub._option_string_actions]
        shown = names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else [])
        if shown:
            listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
            said.append(f"{switch} is an option of {listed}")
    return f"; {'; '.join(said)}" if said else ""


def commands(parser, prefix=""):
    """(name, parser) of every subcommand under parser, nested ones as "outbox start" (read
    from argparse's own records of them: _subparsers, _option_string_actions)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in getattr(action, "choices", {}).items():
            yield f"{prefix}{name}", sub
            yield from commands(sub, f"{prefix}{name} ")


def run_reconcile(args, settings):
    """The reconcile command: the ledger's open effects settled by effects.reconcile, each asked
    by key where its provider has a lookup, or as a person says (--confirmed KEY or KEY=ID,
    --not-sent KEY, --correct KEY=ID); then how many are still unknown, any extra effect a
    provider made under a key (a duplicate to undo), and every person's answer corrected."""
    with (
        open_checkpointer(settings.checkpoint_db),
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        said = settlements(args)
        done = effects.reconcile(
            ledger, args.effects, settings.clients(), said, getattr(args, "wait", False)
        )
        for record, now in done:
            if now == "corrected":  # the id it replaced, kept in the ledger, and the new one
                last = ledger.receipt(record.key)["corrections"][-1]
                emit("corrected", key=record.key, was=last["was"], now=last["now"], who=last["who"])
            elif said:
                emit("settled", key=record.key, state=now)
            else:
                emit("reconciled", effect=record.effect, key=record.key, now=now, was=record.state)
        unknown, oldest_s = ledger.stuck()
        emit("effects_unknown", count=unknown, oldest_s=round(oldest_s))
        if extras := ledger.extras():  # made and in no receipt: a duplicate to undo
            for key, external_id, how in extras:
                emit("effect_extra", key=key, external_id=external_id, how=how)
            emit("effects_extra", count=len(extras))
        for key, was, now, who in corrections.corrections(ledger):  # a person's answer, fixed
            emit("effect_corrected", key=key, was=was, now=now, who=who)


def settlements(args):
    """{key: (what the person said, the id they gave or None)}; a key named twice: UserError."""
    said = {}
    words = [("confirmed", args.confirmed), ("not-sent", args.not_sent)]
    for word, given in [*words, ("correct", getattr(args, "correct", []))]:
        for text in given:
            key, _, external_id = text.rpartition("=") if "=" in text else (text, "", "")
            if key in said:
                raise UserError(
                    f"nothing was settled: {key!r} is named twice (--{said[key][0]} and "
                    f"--{word}); say once what happened to it",
                    EXIT_THREAD,
                )
            if word == "not-sent" and external_id:
                raise UserError(
                    f"nothing was settled: --not-sent takes a key, not KEY=ID ({text!r})",
                    EXIT_USAGE,
                )
            said[key] = (word, external_id or None)
    return said


def ledger_exit(error):
    """The exit code of an effects.LedgerError."""
    if isinstance(error, effects.Unsettled):
        return EXIT_UNSETTLED
    if isinstance(error, effects.InFlight):  # another live process: as a thread it runs
        return EXIT_THREAD
    if isinstance(error, effects.Damaged):
        return EXIT_LEDGER_DAMAGED
    if isinstance(error, effects.NotText):
        return EXIT_USAGE
    if isinstance(error, effects.WordRefused):
        return EXIT_USAGE if error.usage else EXIT_THREAD
    return EXIT_HTTP_ERROR


def run_action(args, make_settings, points):
    """Run the parsed command: its settings (make_settings()), failpoints (the names in
    points), tracing, then args.run(args, settings). Every error a user can meet is one line on
    stderr and its exit code, never a traceback; a hint in it names the whole command, as this
    program is typed (args.typed, the parser's: exitcodes.command)."""
    typed = exitcodes.TYPED.set(getattr(args, "typed", None) or Typed.of(args.prog))
    words = going_on_words(args) if getattr(args, "graph_command", False) else None
    going_on = exitcodes.GOING_ON.set(words)
    try:
        return run_parsed(args, make_settings, points)
    finally:
        exitcodes.GOING_ON.reset(going_on)
        exitcodes.TYPED.reset(typed)


def run_parsed(args, make_settings, points):
    """run_action's work, with the program's Typed set."""
    args.thread_defaulted = isinstance(getattr(args, "thread", None), Defaulted)
    if args.thread_defaulted:
        args.thread = str(args.thread)  # a plain str for the savers' drivers
    settings = ProgramSettings()
    try:
        settings = make_settings()
        try:
            failpoints.configure(settings.failpoints, known=points, announce=announce)
            # A command that reads spans (writes_spans False) must not open TRACE's file: it
            # would create the file, and its folder, that it was asked to read.
            writes = getattr(args, "writes_spans", True)
            tracing.start(settings.trace if writes else "", "workflow")
        except (failpoints.FailpointSpecError, tracing.TracingError) as error:
            raise UserError(str(error), EXIT_USAGE) from None
        configure_receipts(settings)
        require_text(args)
        return args.run(args, settings) or 0
    except urllib.error.HTTPError as error:  # a provider answered with an error
        return report_http_error(args, settings, error)
    except effects.LedgerError as error:
        print(f"{args.prog}: {error}", file=sys.stderr)
        return ledger_exit(error)
    except UserError as error:
        unreachable = isinstance(error, Unreachable)
        hint = resume_hint(args, settings, "once the receiver answers") if unreachable else ""
        print(f"{args.prog}: {error}{default_thread(args, error)}{hint}", file=sys.stderr)
        return error.exit_code
    except sqlite3.DatabaseError as error:  # not a database, read-only, a locked file, ...
        return report_database_error(args, settings, error)
    except ModuleNotFoundError as error:  # a Python without requirements.txt's packages
        print(
            f"{args.prog}: {sys.executable} has no {error.name}; use the Python that has the "
            "requirements installed (natively .venv/bin/python) or Docker",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted{interrupted_hint(args, settings)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if not lost_postgres(error):
            raise
        return report_lost_postgres(args, settings, error)


def run_script(main, name, one_run=True):
    """`python NAME ...`: main()'s exit code; a Ctrl-C before main() took over (while it parsed
    the arguments) is one line and exit 130 too. (The script's own first lines catch one while
    Python imports it.) one_run: the command runs at most one graph and exits, so the cyclic
    garbage collector stays off: its passes over the many objects LangGraph's import makes find
    almost no garbage, and reference counting still frees the rest. A program that runs for
    long (a worker, the drill) passes False."""
    if one_run:
        gc.disable()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # main() has its own line for Ctrl-C
    ending = {}
    atexit.register(end_without_teardown, ending)  # the first registered: it runs last
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        end_if_stranded(code)
    ending["code"] = code
    sys.exit(code)


def end_without_teardown(ending):
    """The last exit handler of a script: end the process with main()'s code, skipping the
    interpreter's teardown of ~1,100 modules (LangGraph's and what it imports) object by object,
    about 0.4 s of CPU a command (measured in its commit's body). By then main() has committed
    and closed what it opened, non-daemon threads were joined, and every other exit handler ran
    (tracing's exporter sends its last spans in one). mypy's util.hard_exit ends the same way.
    An exit main() did not return (a traceback, argparse's own) takes the usual way."""
    if not isinstance(ending.get("code"), int):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a reader gone (`| head`): Python's own exit says so
        return
    os._exit(ending["code"])


def end_if_stranded(code):
    """After a Ctrl-C: end the process at once, with code, if a thread is left that nothing
    will stop. A KeyboardInterrupt that lands in ThreadPoolExecutor._adjust_thread_count
    (concurrent/futures/thread.py) between a worker's start() and its entry in _threads_queues
    leaves that worker waiting for work forever, and the interpreter's exit joins it forever.
    LangGraph runs a graph's tasks and saves on such an executor (BackgroundExecutor in
    langgraph/pregel/_executor.py submits to langchain_core's ContextThreadPoolExecutor,
    langchain_core/runnables/config.py). Else it returns: a normal exit."""
    import threading

    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def configure_receipts(settings):
    """LEDGER_RECEIPT_KEY and LEDGER_RECEIPT_UNKEYED for this process's ledger (effects.py)."""
    try:
        effects.key_receipts(settings.receipt_key, settings.receipt_unkeyed)
    except ValueError as error:
        raise UserError(str(error), EXIT_USAGE) from None


def require_text(args):
    """Refuse an argument that is not UTF-8 text (`--title $'bad\\xff'`): Python holds its bytes
    as lone surrogates, which no JSON, hash or database here can take. Before anything runs."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode()
            except UnicodeEncodeError:
                shown = text.encode("utf-8", "surrogateescape")
                raise UserError(
                    f"--{name.replace('_', '-')} {shown!r} is not UTF-8 text; nothing was run",
                    EXIT_USAGE,
                ) from None


class Defaulted(str):
    """A --thread the user did not type: its default, which an error line then says it is."""


def graph_parser(prog, description, declared, build_graph, run_graph, start_input):
    """A graph CLI's parser: start, resume, state and reconcile (of the effects in declared),
    for the graph build_graph(checkpointer) compiles, run by run_graph (workflow.run_graph);
    start_input(args): a new run's input. parser.actions holds its subcommands and parser.start
    the start command, for a caller to extend."""
    parser = Parser(prog=prog, description=description)
    parser.set_defaults(prog=prog, graph_command=False, resume="resume", look_first=lambda _: None)
    parser.set_defaults(typed=Typed.of(prog))  # how a hint names a command: exitcodes.command
    parser.set_defaults(effects=declared)  # what reconcile can look up
    parser.set_defaults(build_graph=build_graph, run_graph=run_graph, start_input=start_input)
    parser.actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    thread = dict(default=Defaulted("demo"), help="checkpoint thread id (default: demo)")
    for name, action in [("start", start_thread), ("resume", resume_thread)]:
        sub = parser.actions.add_parser(name, help=f"{name} a run")
        sub.set_defaults(run=action, graph_command=True)
        sub.add_argument("--thread", **thread)
        if name == "start":
            parser.start = sub
    sub = parser.actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=show_state)
    sub.add_argument("--thread", **thread)
    sub = parser.actions.add_parser("reconcile", help="settle the ledger's open effects")
    sub.set_defaults(run=run_reconcile)
    sub.add_argument("--confirmed", nargs="+", default=[], metavar="KEY", help="it happened")
    sub.add_argument("--not-sent", nargs="+", default=[], metavar="KEY", help="it did not")
    sub.add_argument(
        "--correct", nargs="+", default=[], metavar="KEY=ID", help="a person's answer was wrong"
    )
    sub.add_argument(
        "--wait", action="store_true", help="wait out the providers' settle time, then settle"
    )
    return parser


def start_thread(args, settings):
    return start_or_resume(args, settings, args.start_input(args))


def resume_thread(args, settings):
    return start_or_resume(args, settings, None)


def start_or_resume(args, settings, graph_input):
    """Start (graph_input) or resume (None) args.thread."""
    with (
        open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        graph = args.build_graph(saver)
        require_thread(graph, args.thread, graph_input is not None)
        final = args.run_graph(graph, graph_input, args.thread, settings.clients(), ledger)
    if final is None:
        return EXIT_DRAINED
    emit("done", **final)
    return 0


def show_state(args, settings):
    with open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = args.build_graph(saver).get_state(thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def invoke_draining(graph, graph_input, thread, context, durability="sync", metadata=None):
    """graph.invoke with context as runtime.context: its final values, or None if SIGTERM
    drained it. metadata: recorded in each checkpoint the run saves (LangGraph copies
    config["metadata"]).

    SIGTERM asks LangGraph to drain (RunControl.request_drain, LangGraph 1.2.0 and later: it came
    with langgraph#7274): the node in flight finishes, its result is saved, and the run stops at
    the next step boundary."""
    from langgraph.errors import GraphDrained
    from langgraph.runtime import RunControl

    config = {**thread_config(thread), "metadata": metadata or {}}
    control = RunControl()
    # Only the main thread receives signals (and may set a handler): an in-process caller on
    # another thread runs without one.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, lambda *_: control.request_drain("SIGTERM"))
    try:
        with tracing.run(thread) as span:
            try:
                final = graph.invoke(
                    graph_input, config, durability=durability, control=control, context=context
                )
            except GraphDrained as drained:  # a clean stop, not a failure: say so, and where
                tracing.drained(span, drained.reason)
                emit("drained", reason=drained.reason, next=list(graph.get_state(config).next))
                return None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    fail("after-checkpoint")
    return final
