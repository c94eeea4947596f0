"""The lines a stopped command prints, with what is true and the command that goes on: after a
provider's error answer, a checkpoint that cannot be written, a lost Postgres, a Ctrl-C."""

import json
import os
import shlex
import sqlite3
import sys

from checkpoints import open_checkpointer, thread_config
from exitcodes import (
    EXIT_CHECKPOINT_WRITE,
    EXIT_HTTP_ERROR,
    EXIT_NO_ANSWER,
    EXIT_USAGE,
    TYPED,
    emit,
)
from httpguard import NO_SUCH_PATH
from providers import BUSY_TRIES_PER_ATTEMPT, DID_NOTHING, RECEIVER_ANSWERS

UNWRITABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL}  # SQLite's primary result codes
# and the extended ones of an open file that can no longer be written: made immutable (chattr +i
# gives SQLITE_IOERR_WRITE at the commit, seen with SQLite 3.40), or a disk that fails its writes
UNWRITABLE_IO = {
    sqlite3.SQLITE_IOERR_WRITE,
    sqlite3.SQLITE_IOERR_FSYNC,
    sqlite3.SQLITE_IOERR_DIR_FSYNC,
    sqlite3.SQLITE_IOERR_TRUNCATE,
}


def unwritable(error):
    """True for a SQLite error that says the file cannot be written (not: cannot be read)."""
    code = getattr(error, "sqlite_errorcode", 0)
    return (code & 0xFF) in UNWRITABLE or code in UNWRITABLE_IO


def read_only_files(checkpoint_db):
    """CHECKPOINT_DB's files that this process cannot write now: the database and the -wal,
    -shm and -journal files beside it. SQLite makes those with the database's permissions
    (os_unix.c: findCreateFileMode, unixOpenSharedMemory), so a database made writable again
    can leave them read-only, and the next save fails the same way."""
    names = [checkpoint_db] + [f"{checkpoint_db}{end}" for end in ("-wal", "-shm", "-journal")]
    return [name for name in names if os.path.exists(name) and not os.access(name, os.W_OK)]


def lost_postgres(error):
    """True for psycopg's OperationalError (a connection lost, a server restarting), without
    importing psycopg: commands on SQLite never load it."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(error, psycopg.OperationalError)


def resume_hint(args, settings, when):
    """A run that stopped before its effect was saved (no receiver, an error answer, a receiver
    busy past every try) has saved its thread already (prepare ran): typed again, start would
    say the thread exists. Name the command that goes on from it; for a request sent without a
    key (args.look_first), the list to look at first: the resume sends it again, and an earlier
    try (a run killed after its answer), or another provider's error answer, may have made it."""
    if not args.graph_command or not (values := saved(args, settings)):
        return ""  # not a run, no checkpoint, or none that can be read
    if look := args.look_first(values):
        return (
            f"; the run is saved: {when}, look at the receiver first, {typed_for(args)(look)}: "
            f"it sends no key, so {args.resume} sends it again if a try went through"
        )
    return f"; the run is saved: {when}, {going_on(args)}"


def going_on(args):
    """The whole command that goes on from args.thread (its resume, or approve's answer), as
    its program is typed (its parser's Typed; else the running program's)."""
    return typed_for(args)(going_on_words(args))


def typed_for(args):
    """How args' program is typed: its parser's Typed, else the running program's."""
    return getattr(args, "typed", None) or TYPED.get()


def going_on_words(args):
    """Its words: "resume --thread t", or args.resume's ("approve --thread t")."""
    return f"{args.resume} --thread {shlex.quote(str(args.thread))}"


def default_thread(args, error):
    """ " (no --thread given: 'demo' is its default)", for a line that finds no such thread: a
    name the user never typed. (One that exists, they made with that default.)"""
    if args.thread_defaulted and str(error).startswith(f"no thread {args.thread!r}"):
        return f" (no --thread given: {args.thread!r} is its default)"
    return ""


def saved(args, settings):
    """The thread's saved values ({} when it has no checkpoint); None when that cannot be told."""
    try:
        with open_checkpointer(settings.checkpoint_db) as saver:
            found = saver.get_tuple(thread_config(args.thread))
    except Exception:  # noqa: BLE001 (a second failure must not hide the first)
        return None
    return found.checkpoint["channel_values"] if found else {}


def interrupted_hint(args, settings, unknown_when=None):
    """What is true after Ctrl-C: a graph command may have sent its request; was it saved?
    unknown_when: what to say when that cannot be told (a lost CHECKPOINT_DB)."""
    if not args.graph_command:
        return ""
    hint = "; a request in flight may have taken effect"
    found = saved(args, settings)
    if found is None:
        if unknown_when:
            return f"{hint}; {unknown_when}, {going_on(args)}"
        return hint
    if found:
        return f"{hint}; {resume_or_warning(args, found)}"
    return f"{hint}; thread {args.thread!r} has no checkpoint yet: start it again"


def resume_or_warning(args, values):
    """The command that goes on from a checkpoint whose request may have taken effect, or, for
    a run that sends it without a key, why none does so safely and what to look at first:
    args.look_first(values), the words of the listing that shows it (None: a keyed run)."""
    if look := args.look_first(values):  # a resume sends it again: nothing tells it from a new one
        return (
            f"it sends no key, so {args.resume} would send it again: look at the receiver "
            f"first, {typed_for(args)(look)}"
        )
    return f"resume it with: {going_on(args)}"


def report_http_error(args, settings, error):
    """main()'s lines for a provider's error answer (exit 1): http_error with its body; one
    line more for an answer that is not the receiver's JSON (another server), its 404 for a
    thing it does not hold (its reason, read_reason), one that made nothing (DID_NOTHING: the
    key is still free; check the address), and a 503 past every try."""
    body = error.read()
    try:
        body = json.loads(body)
    except ValueError:
        body = body.decode("utf-8", "replace")
    emit("http_error", status=error.code, body=body)
    name = getattr(error, "provider", "API")  # which provider answered: NAME_URL is its
    provider = settings.provider(name)
    url = provider.url
    if provider.answers is not RECEIVER_ANSWERS:  # someone else's service: its own words
        nothing = "; nothing was made, and the key is still free" * provider.answers.not_sent(error)
        hint = resume_hint(args, settings, f"once {provider.shown_as} takes it")
        print(
            f"{args.prog}: {provider.shown_as} at {name}_URL {url} answered {error.code}"
            f"{nothing}{hint}",
            file=sys.stderr,
        )
    elif not isinstance(body, dict):  # the receiver answers every error in JSON: another server
        hint = resume_hint(args, settings, f"once {name}_URL names the receiver")
        print(
            f"{args.prog}: the server at {url} answered {error.code} without the "
            f"receiver's JSON: {name}_URL (its port) names another program{hint}",
            file=sys.stderr,
        )
    elif (reason := read_reason(error.code, body)) is not None:  # its 404: what is missing
        print(
            f"{args.prog}: the receiver at {name}_URL {url} answered {error.code}: {reason}; "
            "nothing was made",
            file=sys.stderr,
        )
    elif error.code in DID_NOTHING:  # the receiver's JSON, and nothing made
        why = f"the receiver at {name}_URL {url} answered {error.code}"
        when = f"once {name}_URL names the receiver and lets you in"
        hint = resume_hint(args, settings, when)
        print(
            f"{args.prog}: {why}: nothing was made, and the key is still free; check "
            f"{name}_URL (its host, port and path) and its credentials{hint}",
            file=sys.stderr,
        )
    elif error.code == 503:  # busy past every try: rolled back each time: nothing committed
        tries = settings.provider(name).attempts * BUSY_TRIES_PER_ATTEMPT
        why = f"the receiver stayed busy (503) for {tries} tries; nothing was committed"
        hint = resume_hint(args, settings, "once the receiver can write")
        print(f"{args.prog}: {why}{hint}", file=sys.stderr)
    return EXIT_HTTP_ERROR


def read_reason(status, body):
    """The reason of the receiver's 404 for a thing it does not hold ("no ticket 99; check
    ticket_id"): its JSON "error". None for one that says the address is wrong (a path no route
    serves: API_URL's path), and for any other answer."""
    reason = body.get("error") if status == 404 else None
    if not isinstance(reason, str) or reason.startswith(NO_SUCH_PATH):
        return None
    return reason


def report_database_error(args, settings, error):
    """main()'s line for a SQLite error: exit 74 for a file that cannot be written (with the
    resume, once it can be), else exit 2 (not a database, a locked file, ...)."""
    where = f"{args.prog}: CHECKPOINT_DB {settings.checkpoint_db!r}: {error}"
    if not unwritable(error):
        print(where, file=sys.stderr)
        return EXIT_USAGE
    hint = ""
    if args.graph_command and (found := saved(args, settings)) is not None:
        hint = "; its request may have taken effect before the save failed"
        if getattr(error, "sent_nothing", False):  # effects.py: the intent was not written
            hint = "; its effect's intent could not be written, so this run sent nothing"
        if found:
            stuck = ", ".join(read_only_files(settings.checkpoint_db))
            stuck = f" (read-only now: {stuck})" if stuck else ""
            hint += f"; once CHECKPOINT_DB can be written{stuck}, {resume_or_warning(args, found)}"
    print(f"{where}{hint}", file=sys.stderr)
    return EXIT_CHECKPOINT_WRITE


def report_lost_postgres(args, settings, error):
    """main()'s line for a Postgres CHECKPOINT_DB that stopped answering (exit 3)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    hint = interrupted_hint(args, settings, "once CHECKPOINT_DB answers")
    print(
        f"{args.prog}: CHECKPOINT_DB stopped answering ({reason}); what it committed "
        f"stays (the checkpoints, the ledger's rows){hint}",
        file=sys.stderr,
    )
    return EXIT_NO_ANSWER
