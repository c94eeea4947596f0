"""The receiver's SQLite database: one connection, one writer, commits that survive a power cut.

ReceiverDatabase is what a keyed store stands on (api.TicketStore): the tables its SCHEMA
names, BEGIN IMMEDIATE transactions under one lock, and a database file that was deleted,
damaged or filled told apart from a busy one, each as the error a client must hear. A file that
another program made is refused before anything is written to it. Standard library only.
"""

import os
import sqlite3
import sys
import threading
from collections import Counter
from contextlib import closing, contextmanager
from pathlib import Path

BUSY_TIMEOUT_S = 2.0  # seconds to wait for the database before answering 503; twice this is
#                       still under the workflow's 5 s request timeout, so the client hears
#                       "busy, retry" instead of timing out with the outcome unknown.
DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}  # SQLite's codes for a damaged file


class ReceiverDatabase:
    """One SQLite connection behind a lock: SQLite has one writer at a time anyway.

    SCHEMA, COLUMNS and KEYED say which tables a store makes, what they hold and which are
    keyed by an operation key (table: noun); a subclass names its own."""

    SCHEMA = ()
    COLUMNS = {}
    KEYED = {}

    def __init__(self, path, busy_timeout_s=BUSY_TIMEOUT_S, retention_s=None, metrics=None):
        """metrics: where counted_on_commit goes once a transaction commits (None: nowhere)."""
        self.path, self.lock, self.busy_timeout_s = Path(path), threading.Lock(), busy_timeout_s
        self.retention_s, self.metrics = retention_s, metrics  # retention: keyretention.py
        refuse_another_programs_file(self.path, type(self))  # read-only: opening it writes
        self.db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # WAL with synchronous=FULL: an acknowledged ticket survives a power cut, at one sync
        # of the WAL file per commit (the rollback journal syncs more: four per commit).
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        if sys.platform == "darwin":  # macOS fsync() does not reach the platter; F_FULLFSYNC does
            self.db.execute("PRAGMA fullfsync=ON")
        self.create_tables()
        self.identity = file_identity(self.path)  # the file the connection has open
        self.gone, self.counted_on_commit = False, Counter()
        self.damage, self.full = None, False  # SQLite's word for the damage met; disk full now

    def create_tables(self):
        for statement in self.SCHEMA:
            self.db.execute(statement)

    @classmethod
    def makes_table(cls, table, columns, unique):
        """Whether a table found in RECEIVER_DB is one this store makes: its columns, and the
        UNIQUE index on operation_key that keeps one row per key."""
        return columns == cls.COLUMNS.get(table) and unique

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT under the lock; any exception rolls back. What the
        transaction counted (counted_on_commit) goes to the metrics once it committed."""
        with self.locked():
            self.db.execute("BEGIN IMMEDIATE")
            self.counted_on_commit.clear()
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT may have rolled back already
                    self.db.execute("ROLLBACK")
                raise
            self.full = False  # it committed: the disk has space again
            for name, count in self.counted_on_commit.items() if self.metrics else ():
                self.metrics.add(name, count)

    @contextmanager
    def locked(self):
        """Hold the connection's lock, waiting at most the busy timeout for it, on a database
        file that is still the one at RECEIVER_DB.

        Reads and writes share the one connection, so a read waits behind a write here. While
        one request waits for a database that another process has locked, the others queue
        here; with the bound, a request waits at most twice the busy timeout (here, then in
        SQLite) before its 503.
        """
        if not self.lock.acquire(timeout=self.busy_timeout_s):
            raise sqlite3.OperationalError("waited too long for the ticket store")
        try:
            self.check_usable()
            yield
        except sqlite3.Error as error:
            if (heard := self.as_clients_hear(error)) is error:
                raise
            raise heard from error
        finally:
            self.lock.release()

    def check_usable(self):
        """Raise StoreGone once the path names another file, or none: a deleted database stays
        readable and writable through an open connection, and would answer from the dead.
        Raise StoreDamaged once a request (or the pruner) met damage in the file: it is not
        read again."""
        if self.damage is not None:
            raise StoreDamaged(self.path, self.damage, first=False)
        if file_identity(self.path) == self.identity:
            return
        first, self.gone = not self.gone, True
        raise StoreGone(
            f"the ticket database {self.path} was deleted or replaced while the receiver ran; "
            "restart the receiver to serve from a fresh one",
            first,
        )

    def as_clients_hear(self, error):
        """SQLite's error as what the client must hear: StoreDamaged for a damaged file,
        DiskFull for a full disk, else the error itself (busy, locked, ...)."""
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
        if code in DAMAGED:
            first, self.damage = self.damage is None, str(error)
            return StoreDamaged(self.path, self.damage, first)
        if code == sqlite3.SQLITE_FULL:
            first, self.full = not self.full, True
            return DiskFull(self.path, str(error), first)
        return error

    def close(self, wait_s=0.2):
        """Close unless a request holds the connection; the process is exiting either way."""
        if self.lock.acquire(timeout=wait_s):  # SIGTERM must not wait out a locked database
            self.db.close()
            self.lock.release()


class StoreGone(sqlite3.OperationalError):
    """RECEIVER_DB no longer names the file the receiver has open (deleted, or replaced)."""

    def __init__(self, message, first):
        super().__init__(message)
        self.first = first  # the first request to notice: it logs the line


class StoreDamaged(sqlite3.DatabaseError):
    """SQLite found the database file damaged (SQLITE_CORRUPT, SQLITE_NOTADB): no retry helps."""

    def __init__(self, path, damage, first):
        super().__init__(
            f"the ticket database {path} is damaged ({damage}); nothing was committed. An "
            "operator must act: restore the file from a backup or move it away, then restart "
            "the receiver"
        )
        self.first = first  # the first request to meet it: it logs the line


class DiskFull(sqlite3.OperationalError):
    """The disk (or SQLite's max_page_count) leaves the database no space to grow (SQLITE_FULL)."""

    def __init__(self, path, reason, first):
        super().__init__(
            f"the disk holding the ticket database {path} is full ({reason}); nothing was "
            "committed: free space there, then retry the same request with the same "
            "Idempotency-Key"
        )
        self.first = first  # the first request since the last commit: it logs the line


UNUSABLE = (StoreGone, StoreDamaged, DiskFull)  # said once in the log, to every client


class NotTheReceivers(ValueError):
    """RECEIVER_DB names a database another program made (or a table the receiver cannot use)."""


def refuse_another_programs_file(path, store_class):
    """Raise NotTheReceivers unless path is missing, empty, or holds only tables the store
    makes (store_class.makes_table); read-only (mode=ro): the file is not changed.

    Opening it for the receiver would write to it (journal_mode=WAL, CREATE TABLE) and then
    serve another program's data, or, in LangGraph's checkpoint file, mix two programs' state.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    # With no WAL beside it the file holds it all: immutable=1 reads it without creating the
    # -shm and -wal files a read-only connection to a WAL database would leave next to it.
    wal = path.with_name(path.name + "-wal").exists()
    uri = path.resolve().as_uri() + ("?mode=ro" if wal else "?mode=ro&immutable=1")
    with closing(sqlite3.connect(uri, uri=True)) as db:
        tables = [
            name
            for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")  # SQLite's own (sqlite_sequence, sqlite_stat1)
        ]
        if foreign := [name for name in tables if name not in store_class.COLUMNS]:
            whose = (
                ": LangGraph's checkpoint tables (this is a CHECKPOINT_DB file?)"
                if {"checkpoints", "writes"} <= set(foreign)
                else ""
            )
            raise NotTheReceivers(
                f"it holds tables that are not the receiver's ({', '.join(sorted(foreign)[:5])}"
                f"{whose}); set RECEIVER_DB to the receiver's own file or a new one. "
                "Nothing was written to it"
            )
        for table in tables:
            columns = {row[1] for row in db.execute(f'PRAGMA table_info("{table}")')}
            unique = [  # the indexes that keep one row per key
                index
                for index in db.execute(f'PRAGMA index_list("{table}")')
                if index[2]
                and [c[2] for c in db.execute(f'PRAGMA index_info("{index[1]}")')]
                == ["operation_key"]
            ]
            if not store_class.makes_table(table, columns, bool(unique)):
                unique = unique or table not in store_class.KEYED  # a table of rows without keys
                raise NotTheReceivers(
                    f"its {table} table is not the receiver's (columns {', '.join(sorted(columns))}"
                    f"{'' if unique else ', no UNIQUE operation_key'}); set RECEIVER_DB to the "
                    "receiver's own file or a new one. Nothing was written to it"
                )


def file_identity(path):
    """(device, inode) of the file at path, or None when there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino
