"""The checkpointer: LangGraph's SqliteSaver on CHECKPOINT_DB (a file that holds another
program's tables is refused before a byte is written), or PostgresSaver for a postgresql:// URL;
and the thread a command names, checked."""

import contextlib
import logging
import shlex
import sqlite3
import time
from pathlib import Path

from exitcodes import EXIT_NO_ANSWER, EXIT_THREAD, EXIT_USAGE, UserError, command
from ledger import TABLES
from ledger_tables import wal

NEW_FILE_WAIT_S = 5.0  # how long a new file's first open waits for another process making it


def thread_config(thread):
    return {"configurable": {"thread_id": thread}}


def require_thread(graph, thread, starting, hint=None):
    """start needs a new thread, resume an existing one; the thread's snapshot. hint: what a
    start of one that exists says to do (by default: its resume, or a new --thread)."""
    snapshot = graph.get_state(thread_config(thread))
    if starting and snapshot.values:
        resume = command(f"resume --thread {shlex.quote(thread)}")
        hint = hint or f"resume it: {resume}; or pick a new --thread"
        raise UserError(f"thread {thread!r} already exists; {hint}", EXIT_THREAD)
    if not starting and not snapshot.values:
        raise UserError(f"no thread {thread!r} to resume; check --thread", EXIT_THREAD)
    return snapshot


@contextlib.contextmanager
def open_checkpointer(checkpoint_db, saver_class=None):
    """LangGraph's saver for CHECKPOINT_DB, closed on exit: PostgresSaver for a postgresql://
    URL, else SqliteSaver (or saver_class, a SqliteSaver subclass) on that file."""
    if is_postgres(checkpoint_db):
        with open_postgres(checkpoint_db) as saver:
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(checkpoint_db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
    if require_checkpoint_file(path):
        with contextlib.closing(sqlite3.connect(path, timeout=NEW_FILE_WAIT_S)) as conn:
            wal(conn, NEW_FILE_WAIT_S)  # before SqliteSaver's setup, which would not wait
    with (saver_class or SqliteSaver).from_conn_string(str(path)) as saver:
        yield saver


def require_checkpoint_file(path):
    """Refuse, before SqliteSaver writes a byte (its setup switches the file to WAL and adds its
    tables), a file that holds tables of another program: the receiver's, or anyone's, and a
    table with one of our names whose columns are not ours (`effects` is a common name). The
    file is read on a read-only connection (mode=ro): the check itself writes nothing.

    -> True for a new file. Two commands may make it at once (two starts, the first ever): the
    second one's `PRAGMA journal_mode=WAL` (SqliteSaver.setup) meets the first one's write and
    answers "database is locked" at once, without the busy wait; so the caller switches a new
    file to WAL first, waiting that out (ledger_tables.wal)."""
    if not path.is_file() or path.stat().st_size == 0:
        return True  # a new file: SqliteSaver makes it
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        # At least the columns each of our tables was made with: ours may gain more (a
        # migration adds them on open), another program's table of that name lacks some.
        unlike = sorted(
            table
            for table, columns in OUR_COLUMNS.items()
            if table in tables
            and not columns <= {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        )
    finally:
        conn.close()
    foreign = sorted(t for t in tables - set(OUR_COLUMNS) if not t.startswith("sqlite_")) + unlike
    if foreign:
        raise UserError(
            f"CHECKPOINT_DB {str(path)!r} holds tables that are not LangGraph's checkpoints "
            f"({', '.join(foreign)}): another program's database; nothing was written to it. "
            "Point CHECKPOINT_DB at a file of its own",
            EXIT_USAGE,
        )


# The tables that may sit beside the checkpoints, and the columns each has had from the start (a
# subset, not the set). A program that keeps tables of its own there adds them (own_tables).


OUR_COLUMNS = {
    **{table: set() for table in TABLES},  # the ledger's; the ones below, checked
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint", "metadata"},
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"},
    # (SqliteSaver.setup's CREATE TABLEs, langgraph/checkpoint/sqlite/__init__.py)
    "effects": {"key", "effect", "request", "request_hash", "state"},
    "effect_transitions": {"key", "from_state", "to_state"},
    "effect_receipts": {"key", "external_id", "answer", "request_hash"},
}


def own_tables(columns):
    """Count these tables ({name: columns it has had from the start}) as ours too."""
    OUR_COLUMNS.update(columns)


def is_postgres(checkpoint_db):
    return checkpoint_db.startswith(("postgresql://", "postgres://"))


@contextlib.contextmanager
def open_postgres(url):
    """LangGraph's PostgresSaver on one connection, its tables created or migrated."""
    import psycopg  # Postgres users only: commands on SQLite never load it
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    # psycopg logs a lost connection once more as its pipeline closes ("error ignored
    # terminating ..."): main() says it in one line of its own (lost_postgres)
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)

    try:  # the settings PostgresSaver.from_conn_string uses
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as error:  # unreachable (OperationalError), or not a valid URL
        reason = str(error).strip().splitlines()[0]
        code = EXIT_NO_ANSWER if isinstance(error, psycopg.OperationalError) else EXIT_USAGE
        hint = "; CHECKPOINT_DB is set in your environment: unset it for the SQLite default"
        raise UserError(f"cannot open CHECKPOINT_DB ({reason}){hint}", code) from error
    with conn:
        saver = PostgresSaver(conn)
        # setup() creates or migrates the tables; the user must call it (PostgresSaver.setup's
        # docstring). Workers starting together would race on them: one at a time, under an
        # advisory lock. Not a blocking wait for it: setup's CREATE INDEX CONCURRENTLY waits for
        # every open transaction, a waiter's included.
        lock = "SELECT pg_try_advisory_lock(hashtext('langgraph setup')) AS locked"
        while not conn.execute(lock).fetchone()["locked"]:
            time.sleep(0.05)
        saver.setup()
        conn.execute("SELECT pg_advisory_unlock(hashtext('langgraph setup'))")
        yield saver
