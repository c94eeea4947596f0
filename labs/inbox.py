"""The inbox: an event that a provider delivers again, or late, changes the state once.

A webhook arrives at least once: a provider that did not get a 2xx (a timeout, a crash after the
state change and before the answer) delivers the same event again, and events can overtake each
other. So the receiving side keeps two records, in the SAME database transaction as the state
change the event causes:

- the event's id in `inbox` (PRIMARY KEY): a second delivery of it finds the row and changes
  nothing;
- per subject (here: a ticket) its state and the version that set it, in `inbox_subjects`: an
  event with an older version is recorded as seen and ignored, so the state never goes back.

Either both the inbox row and the state change commit, or neither does: a kill between them
cannot leave an event applied and not recorded (its redelivery would apply it again) or
recorded and not applied (its redelivery would be ignored). What the event should cause outside
this database (a customer notification) is an effect: the caller performs it through the ledger
(effects.py), keyed by the event id, after the commit, on the first delivery and on every later
one that finds the event applied, so a kill after the commit is finished by the redelivery.

    with inbox.open_inbox(CHECKPOINT_DB) as box:
        seen = box.receive(event_id, subject, version, status)
        seen.first      # False: delivered before (nothing changed now)
        seen.applied    # True: the state holds this event's status (now or from before)
        box.state(subject)   # (status, version) or None

SQLite (BEGIN IMMEDIATE) and Postgres (INSERT ... ON CONFLICT, whose conflicting row Postgres
locks) both; the tables sit in the workflow's own database, beside the ledger's.
Standard library and effects.py only (psycopg for a postgresql:// URL); importing it changes
nothing.
"""

import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import NamedTuple

import effects

TABLES = ("inbox", "inbox_subjects")
COLUMNS = {  # the columns each table has had from the start (checkpoints.own_tables)
    "inbox": {"event_id", "subject", "version", "status", "applied"},
    "inbox_subjects": {"subject", "status", "version", "event_id"},
}
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS inbox (
    event_id TEXT PRIMARY KEY,  -- the provider's id for the event: one row however often it came
    subject TEXT NOT NULL,  -- what it is about (a ticket)
    version INTEGER NOT NULL,  -- the provider's version of the subject (monotonic per subject)
    status TEXT NOT NULL,
    applied INTEGER NOT NULL,  -- 1: it changed the state; 0: older than what was applied
    received_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS inbox_subjects (
    subject TEXT PRIMARY KEY,  -- the state the events change: one row per subject
    status TEXT NOT NULL,
    version INTEGER NOT NULL,  -- the version of the event that set it: only ever goes up
    event_id TEXT NOT NULL
)""",
)


class Seen(NamedTuple):
    """What receive() found: first (this delivery recorded the event), applied (the event's
    status is or was the subject's: False for an event older than one applied before it)."""

    first: bool
    applied: bool


class EventConflict(ValueError):
    """An event id delivered again with another subject, version or status: not a redelivery."""


class Inbox:
    """The inbox of one workflow database: a SQLite file (or, PostgresInbox, a connection)."""

    def receive(self, event_id, subject, version, status):
        """Record the event and apply it unless it is older than the subject's state: one
        transaction. A second delivery changes nothing and says what the first one did."""
        with self.transaction():
            fresh = self.sql(
                "INSERT INTO inbox (event_id, subject, version, status, applied, received_at) "
                "VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING",
                (event_id, subject, version, status, time.time()),
            ).rowcount
            if not fresh:  # delivered before: what the first delivery decided stands
                row = self.sql(
                    "SELECT subject, version, status, applied FROM inbox WHERE event_id = ?",
                    (event_id,),
                ).fetchone()
                if tuple(row[:3]) != (subject, version, status):
                    raise EventConflict(
                        f"event {event_id!r} was received before with another body "
                        f"({row[0]} v{row[1]} {row[2]}): not a redelivery"
                    )
                return Seen(first=False, applied=bool(row[3]))
            # The version compare is the upsert's own WHERE: an older (or as old) event leaves
            # the row as it is and changes no row (rowcount 0). On Postgres the conflicting row
            # is locked and the WHERE read again once a concurrent writer commits.
            changed = self.sql(
                "INSERT INTO inbox_subjects (subject, status, version, event_id) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (subject) DO UPDATE SET "
                "status = excluded.status, version = excluded.version, "
                "event_id = excluded.event_id WHERE inbox_subjects.version < excluded.version",
                (subject, status, version, event_id),
            ).rowcount
            if changed:
                self.sql("UPDATE inbox SET applied = 1 WHERE event_id = ?", (event_id,))
            return Seen(first=True, applied=bool(changed))

    def state(self, subject):
        """(status, version) the subject is in, or None before its first event."""
        row = self.sql(
            "SELECT status, version FROM inbox_subjects WHERE subject = ?", (subject,)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    # helpers

    def __init__(self, path, busy_timeout_s=5.0):
        self.lock = threading.RLock()  # one connection, used by one thread at a time
        self.db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        effects.wal(self.db, busy_timeout_s)  # as the ledger: it waits out a new file's maker
        self.db.execute("PRAGMA synchronous=FULL")  # a committed event survives a power cut
        with self.transaction():
            for statement in SCHEMA:
                self.db.execute(statement)

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE: the write lock first, so two deliveries of one event (two
        processes, or two threads here) cannot both miss the row and both apply it."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    def sql(self, statement, args=()):
        with self.lock:
            return self.db.execute(statement, args)

    def close(self):
        self.db.close()


class PostgresInbox(Inbox):
    """The same inbox in Postgres, on an autocommit connection the caller opened (psycopg 3).

    The event's INSERT ... ON CONFLICT DO NOTHING waits for a concurrent, uncommitted insert of
    the same id to commit or roll back (PostgreSQL's manual, "Index Uniqueness Checks"), so only
    one delivery records it; the subject's upsert locks the conflicting row even where its WHERE
    is false (the manual's INSERT, ON CONFLICT DO UPDATE), so two events of one subject compare
    their versions one after the other."""

    def __init__(self, conn):
        self.db, self.lock = conn, threading.RLock()
        with self.transaction():
            self.sql("SELECT pg_advisory_xact_lock(hashtext('inbox schema'))")
            for statement in SCHEMA:
                self.sql(statement.replace("REAL", "DOUBLE PRECISION"))

    @contextmanager
    def transaction(self):
        with self.lock, self.db.transaction():
            yield

    def sql(self, statement, args=()):
        with self.lock:
            return self.db.execute(statement.replace("?", "%s"), args)


@contextmanager
def open_inbox(target):
    """The inbox in the workflow's own database: a SQLite file, or a postgresql:// URL (its own
    autocommit connection). Closed on exit."""
    if not str(target).startswith(("postgresql://", "postgres://")):
        box = Inbox(target)
    else:
        import psycopg

        box = PostgresInbox(psycopg.connect(target, autocommit=True))
    try:
        yield box
    finally:
        box.close()
