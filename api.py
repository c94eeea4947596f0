"""The ticket receiver: the outside world that the workflow changes.

A small HTTP service (standard library only) that creates tickets and honours an
Idempotency-Key. The first request with a key creates a ticket; a repeat of the same request
gets the same ticket back; the same key with a different body is refused (409). The whole idea
is in TicketStore.keyed: the lookup and the insert share one transaction on a UNIQUE column, and
the ticket is committed before the answer is written. A caller that dies after the commit and
before it reads the answer (the crash window) can only find its ticket again by sending the
same key, or by looking the key up (GET /tickets?key=).

    GET  /health                 200 {"ok": true}; 503 once the database file was deleted,
                                 or once the receiver met damage in it
    GET  /metrics                200, the Prometheus text format: tickets created, replays,
                                 key conflicts, keys pruned, answers by status, durations
    GET  /tickets[?key=KEY]      200 {"tickets": [{"ticket_id", "key", "payload"}]}, in id order
    POST /tickets                body {"title": "..."} (1-200 characters), optional
                                 Idempotency-Key (1-200 visible ASCII characters):
                                 201 {"ticket_id", "created": true}   a new ticket
                                 200 {"ticket_id", "created": false}  the same key and body again
                                 409 {"code": "key_conflict"} the key was used for another
                                 body: send a new key
Every answer but /metrics is JSON, HEAD is GET without the body, and every refusal has an
"error" field that says what to do (a 409 also a "code" for programs): 400 (malformed, or a
header line holding a bare CR or another control character but tab), 404, 405, 408 (a body
not received within RECEIVER_REQUEST_TIMEOUT_S; a request line or headers that late get no
answer: the connection is closed), 411 (no Content-Length), 413 (body over 4096 bytes), 500 (a
bug: nothing was committed), and 503 with Retry-After: 1 (database busy, too many connections,
disk full: retry the same request with the same key; database deleted while running: restart
the receiver), or without Retry-After (the database file is damaged: an operator must restore
or move it; the receiver answers so from then on, and logs it once). Every answer is counted in
/metrics before its first byte is written.

Another service grows from this one without changing it: a subclass of TicketStore adds its
tables (SCHEMA, COLUMNS, KEYED) and methods, a subclass of Handler its routes (routes, make,
get, post) and counters, and main(store=..., handler=...) serves them.

Configuration (environment, read in main()):
    RECEIVER_DB                  data/receiver/receiver.sqlite: missing, empty, or a receiver's
                                 own; a file with other tables (another program's, LangGraph's
                                 checkpoints) is refused before anything is written to it
    HOST                         127.0.0.1 (compose sets 0.0.0.0)
    PORT                         8000
    RECEIVER_BUSY_TIMEOUT_S      2 (seconds to wait for the database before a 503)
    RECEIVER_REQUEST_TIMEOUT_S   5 (seconds a client has to send its whole request)
    RECEIVER_MAX_CONNECTIONS     256 (connections served at once; more get a quick 503)
    RECEIVER_KEY_RETENTION_S     unset: keys are kept for ever. Else seconds a key is honoured
                                 after its ticket was made; an older key is not, pruned yet or
                                 not: a request with it is new. Keys are pruned every
                                 min(retention, 60) seconds. Keep it longer than the longest a
                                 caller may wait before it retries (a crash, an approval).
    FAILPOINTS                   "" (none). Fault points for tests, never for a real service:
                                 after-commit=kill dies between the commit and the answer;
                                 before-commit=pause(PATH) holds a request read and not yet
                                 made (once per key and body: a resend passes).
    TRACE                        "" (off). otlp, or a file: a span per keyed POST, its parent
                                 the caller's traceparent (tracing.py; needs OpenTelemetry)
"""

import argparse
import json
import math
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import failpoints
import tracing
from failpoints import fail
from httpguard import (
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    Body,
    ClientError,
    GuardedHandler,
    GuardedServer,
    parse_json,
)

TICKETS = """CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,  -- NULL: sent without a key, or its key was pruned
    payload TEXT NOT NULL,
    created_at REAL  -- Unix time of the commit
)"""
KEY_AGE_INDEX = """CREATE INDEX IF NOT EXISTS {table}_keys_by_age ON {table} (created_at)
    WHERE operation_key IS NOT NULL"""
BUSY_TIMEOUT_S = 2.0  # seconds to wait for the database before answering 503; twice this is
#                       still under the workflow's 5 s request timeout, so the client hears
#                       "busy, retry" instead of timing out with the outcome unknown.
POINTS = ("before-commit", "after-commit")  # this program's failpoints
COUNTERS = {  # name -> its help text; a service with more routes adds its own
    "tickets_created": "POSTs that created a ticket (answered 201).",
    "idempotent_replays": "POSTs answered 200 with what their key made before.",
    "key_conflicts": "POSTs refused 409: a key sent again with another body.",
    "keys_pruned": "Keys forgotten past RECEIVER_KEY_RETENTION_S (their tickets stay).",
}
PRUNE_EVERY_S = 60.0  # seconds between prunes at most (less when the retention is shorter)
PRUNE_BATCH = 500  # keys forgotten per transaction; requests take their turn between batches
EXPIRED = "IFNULL(created_at < ?, 0)"  # SQL: the row's key is past the retention (? = cutoff)


class TicketStore:
    """One SQLite connection behind a lock: SQLite has one writer at a time anyway.

    SCHEMA, COLUMNS and KEYED say which tables it makes, what they hold and which are keyed by
    an operation key (table: noun); a subclass extends them for tables of its own."""

    SCHEMA = (TICKETS,)
    COLUMNS = {"tickets": {"id", "operation_key", "payload", "created_at"}}
    KEYED = {"tickets": "ticket"}

    def keyed(self, table, key, canonical, columns=None, check=None):
        """Return (id, created) of the row in table that key made, or of a new one; raise
        KeyConflict (409) for a key made for another body.

        The lookup and the insert share one BEGIN IMMEDIATE transaction (it takes the write
        lock first), so two requests with the same key cannot both miss the lookup and both
        insert. COMMIT returns before the caller writes its answer. check(), when given, runs
        in the same transaction before a new row is made, and may refuse it (a ClientError).
        """
        columns = columns or {}
        with self.transaction():
            prior = None
            if key is not None:
                self.forget_expired(key, table)  # a key past the retention is not honoured
                prior = self.db.execute(
                    f"SELECT id, payload FROM {table} WHERE operation_key = ?", (key,)
                ).fetchone()
            if prior is None:
                if check is not None:
                    check()
                names = ", ".join(["operation_key", "payload", "created_at", *columns])
                marks = ", ".join("?" * (3 + len(columns)))
                cursor = self.db.execute(
                    f"INSERT INTO {table} ({names}) VALUES ({marks})",
                    (key, canonical, time.time(), *columns.values()),
                )
                return cursor.lastrowid, True
            if prior[1] == canonical:
                return prior[0], False
            raise KeyConflict(
                409,
                f"Idempotency-Key {key!r} was already used for {self.KEYED[table]} {prior[0]} "
                "with a different body; send a new key for a new operation",
            )

    def create(self, key, canonical):
        """A ticket: (ticket_id, created)."""
        return self.keyed("tickets", key, canonical)

    def tickets(self, key=None):
        """All tickets, or the one made with key; a key past the retention shows as null."""
        rows = self.listed("tickets", "payload", key)
        return [{"ticket_id": i, "key": k, "payload": json.loads(p)} for i, k, p in rows]

    def prune(self):
        """Forget every key past the retention, PRUNE_BATCH to a transaction; return how many.

        The tickets stay: only their keys go, so the same key makes a new ticket.
        """
        pruned = 0
        for table in self.KEYED:
            while True:
                with self.transaction():
                    batch = self.db.execute(
                        f"UPDATE {table} SET operation_key = NULL WHERE id IN (SELECT id FROM "
                        f"{table} WHERE operation_key IS NOT NULL AND {EXPIRED} LIMIT ?)",
                        (self.cutoff(), PRUNE_BATCH),
                    ).rowcount
                    self.pruned_here += batch
                pruned += batch
                if batch < PRUNE_BATCH:
                    break
        return pruned

    # helpers

    def __init__(self, path, busy_timeout_s=BUSY_TIMEOUT_S, retention_s=None, metrics=None):
        self.path, self.lock, self.busy_timeout_s = Path(path), threading.Lock(), busy_timeout_s
        self.retention_s, self.metrics = retention_s, metrics or Metrics(COUNTERS)
        refuse_another_programs_file(self.path, type(self))  # read-only: opening it writes
        self.db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # WAL with synchronous=FULL: an acknowledged ticket survives a power cut, at one
        # sync of the WAL file per commit. `strace -f -e trace=fsync,fdatasync` over ten
        # commits (SQLite 3.40, Linux ext4) counted 10 fdatasync calls in WAL mode and 40 in
        # SQLite's default rollback-journal mode: the journal twice, its folder, the database.
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        if sys.platform == "darwin":  # macOS fsync() does not reach the platter; F_FULLFSYNC does
            self.db.execute("PRAGMA fullfsync=ON")
        self.create_tables()
        self.identity = file_identity(self.path)  # the file the connection has open
        self.gone, self.pruned_here = False, 0
        self.damage, self.full = None, False  # SQLite's word for the damage met; disk full now

    def create_tables(self):
        """SCHEMA's tables, and an index by age of each keyed table's keys (for the pruner)."""
        for statement in self.SCHEMA:
            self.db.execute(statement)
        for table in self.KEYED:
            self.db.execute(KEY_AGE_INDEX.format(table=table))

    @classmethod
    def ours(cls, table, columns, unique):
        """Whether a table found in RECEIVER_DB is one this store makes: its columns, and the
        UNIQUE index on operation_key that keeps one row per key."""
        return columns == cls.COLUMNS.get(table) and unique

    def cutoff(self):
        """Keys made before this Unix time are past the retention (-inf: kept for ever)."""
        return -math.inf if self.retention_s is None else time.time() - self.retention_s

    def forget_expired(self, key, table="tickets"):
        """Inside a transaction: prune key now if it is past the retention."""
        if self.retention_s is not None:
            self.pruned_here += self.db.execute(
                f"UPDATE {table} SET operation_key = NULL WHERE operation_key = ? AND {EXPIRED}",
                (key, self.cutoff()),
            ).rowcount

    def listed(self, table, column, key=None):
        """(id, key, column) of every row of table, or of the one made with key, in id order;
        a key past the retention shows as None."""
        sql = f"SELECT id, CASE WHEN {EXPIRED} THEN NULL ELSE operation_key END, {column} "
        sql, args = sql + f"FROM {table}", (self.cutoff(),)
        if key is not None:
            sql, args = sql + f" WHERE operation_key = ? AND NOT {EXPIRED}", (*args, key, *args)
        with self.locked():
            return self.db.execute(sql + " ORDER BY id", args).fetchall()

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT under the lock; any exception rolls back. The keys it
        pruned (pruned_here) are counted once it committed."""
        with self.locked():
            self.db.execute("BEGIN IMMEDIATE")
            self.pruned_here = 0
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT may have rolled back already
                    self.db.execute("ROLLBACK")
                raise
            self.full = False  # it committed: the disk has space again
            self.metrics.add("keys_pruned", self.pruned_here)

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
            if (told := self.told_apart(error)) is error:
                raise
            raise told from error
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

    def told_apart(self, error):
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


class Handler(GuardedHandler):
    """The routes; httpguard.GuardedHandler turns their results and refusals into answers.

    A keyed POST goes through post(): the key read, make() called, the result counted and
    logged, then the answer. A subclass adds a keyed route by extending routes and make()."""

    routes = {"/health": "GET, HEAD", "/tickets": "GET, HEAD, POST", "/metrics": "GET, HEAD"}

    @tracing.serves  # with TRACE: a span, joined to the caller's by its traceparent header
    def post(self, path):
        body = self.read_body()
        # Whitespace around a header value is not part of it (RFC 9110, 5.5).
        key = parse_key([v.strip(" \t") for v in self.headers.get_all("Idempotency-Key", [])])
        noun = self.server.store.KEYED[path.lstrip("/")]
        tracing.note({tracing.KEY: key})
        # Read, not yet made: a request still at the provider (a test holds it here, once per
        # body, to kill its sender there; a resend under the key passes and finds the key).
        fail("before-commit", once_per=(key, body))  # body: the bytes read
        try:
            made, created = self.make(path, key, body)
        except KeyConflict:
            tracing.note({"receiver.conflict": True})
            self.server.metrics.add("key_conflicts")
            self.log_line(f"conflict key={key}")
            raise
        self.server.metrics.add(f"{noun}s_created" if created else "idempotent_replays")
        tracing.note({"receiver.replay": not created, f"{noun}.id": made})
        self.log_line(f"{'created' if created else 'replayed'} key={key} {noun}={made}")
        # The ticket is committed BEFORE the answer is written. A crash from here on leaves
        # a ticket the caller never heard about: the effect gap. Only the key lets the
        # caller's retry find it again instead of creating a second one.
        fail("after-commit")
        return (201 if created else 200), {f"{noun}_id": made, "created": created}

    def make(self, path, key, body):
        """What a keyed POST to path makes, or made before under key: (id, created)."""
        return self.server.store.create(key, parse_ticket(body))

    def get(self, path):
        if path == "/health":
            self.server.store.check_usable()  # up, serving RECEIVER_DB, no damage met in it
            return 200, {"ok": True}
        if path == "/metrics":
            return 200, Body(PROMETHEUS_TEXT, self.server.metrics.render().encode())
        return 200, {"tickets": self.server.store.tickets(self.query_key())}

    def query_key(self):
        """The ?key= of a GET, or None; any other query parameter is refused (400)."""
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if set(query) - {"key"}:
            raise ClientError(400, "the only query parameter is ?key=IDEMPOTENCY-KEY")
        return parse_key(query.get("key"), where="?key=")

    # helpers

    counters = COUNTERS  # what /metrics counts (Metrics)
    log_prefix = "receiver"
    max_body_bytes = 4096  # bytes: the largest valid body (200 title characters, each outside
    #                        the BMP and escaped as a 12-byte surrogate pair) is ~2.4 KiB;
    #                        anything bigger is not a ticket.

    unavailable_errors = (sqlite3.Error,)  # locked past the busy timeout, disk full, deleted...

    def unavailable(self, error):
        if isinstance(error, StoreGone | StoreDamaged | DiskFull):
            if error.first:  # one line in the log, however many requests meet it
                self.log_line(f"unavailable: {error}")
            return str(error)
        self.log_line(f"unavailable: {error}")
        return "ticket store busy or unavailable; retry with the same Idempotency-Key"

    def retryable(self, error):
        return not isinstance(error, StoreDamaged)  # no retry mends a damaged file

    def refused(self, error):
        if self.command == "POST" and not isinstance(error, KeyConflict):  # post() logs those
            self.log_line(f"rejected {error.status}: {error.message}")


def main(
    argv=None,
    store=TicketStore,
    handler=Handler,
    known=POINTS,
    prog="api.py",
    doc=None,
    epilog=None,
):
    """Serve until SIGTERM or Ctrl-C; the exit code. A service built on this one passes its own
    store and handler classes, its failpoints (known), and for --help its name, docstring and
    settings (epilog; default: this docstring's Configuration)."""
    doc = doc or __doc__
    argparse.ArgumentParser(
        prog=prog,
        description=f"{doc.splitlines()[0]} It takes no arguments: settings come from the "
        "environment.",
        epilog=epilog or __doc__[__doc__.index("Configuration") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    try:
        server, where, points = open_server(os.environ, store, handler, known)
    except ConfigError as error:
        print(f"receiver: {error}", file=sys.stderr)
        return error.exit_code
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds serve_forever below
    print(f"receiver: {where}", file=sys.stderr)
    stop_pruning = threading.Event()
    if (retention_s := server.store.retention_s) is not None:
        every_s = min(retention_s, PRUNE_EVERY_S)
        pruner = threading.Thread(
            target=prune_forever, args=(server.store, every_s, stop_pruning), daemon=True
        )
        pruner.start()
        print(f"receiver: keys kept {retention_s:g} s, pruned every {every_s:g} s", file=sys.stderr)
    if points:
        on = ", ".join(f"{name}={action}" for name, action in points.items())
        print(f"receiver: WARNING failpoints on: {on}; never in a real service", file=sys.stderr)
    code = 0
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    finally:
        stop_pruning.set()
        server.server_close()
        server.store.close()
        print("receiver: stopped", file=sys.stderr)
    return code


# helpers: the store and its metrics


class KeyConflict(ClientError):
    """A key sent again with another body (409): counted as key_conflicts."""

    code = "key_conflict"


class StoreGone(sqlite3.OperationalError):
    """RECEIVER_DB no longer names the file the receiver has open (deleted, or replaced)."""

    def __init__(self, message, first):
        super().__init__(message)
        self.first = first  # the first request to notice: it logs the line


DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}  # SQLite's codes for a damaged file


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


def prune_forever(store, every_s, stop):
    """The pruner's thread: prune now and then until stop is set; a failure is one log line."""
    while not stop.wait(every_s):
        try:
            if pruned := store.prune():
                keys = "key" if pruned == 1 else "keys"
                print(f"receiver: pruned {pruned} {keys} past the retention", file=sys.stderr)
        except (StoreGone, StoreDamaged, DiskFull) as error:  # the requests say so; one line
            if error.first:
                print(f"receiver: unavailable: {error}", file=sys.stderr)
        except sqlite3.Error as error:  # busy, say: the next round tries again
            print(f"receiver: pruning failed: {error}", file=sys.stderr)


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format
DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#                     seconds, from accepting a connection to its answer ready to be written:
#                     a loopback request takes about a millisecond, a busy database up to 2 x 2 s


class Metrics:
    """What this receiver process did since it started, as Prometheus counters (GET /metrics).

    The counters start at 0 with each process, as Prometheus expects of a counter; the
    tickets themselves are in the database. No label carries a key: one series per status.
    """

    def __init__(self, counters):
        self.lock, self.counters = threading.Lock(), counters
        self.counts = dict.fromkeys(counters, 0)
        self.codes = Counter()  # status -> answers
        self.buckets = [0] * (len(DURATION_BUCKETS_S) + 1)  # the last: slower than them all
        self.duration_sum_s = 0.0

    def add(self, name, count=1):
        with self.lock:
            self.counts[name] += count

    def answered(self, status, seconds):
        bucket = next((i for i, le in enumerate(DURATION_BUCKETS_S) if seconds <= le), -1)
        with self.lock:
            self.codes[status] += 1
            self.buckets[bucket] += 1
            self.duration_sum_s += seconds

    def render(self):
        with self.lock:
            lines = []
            for name, text in self.counters.items():
                lines += metric(f"receiver_{name}_total", "counter", text)
                lines.append(f"receiver_{name}_total {self.counts[name]}")
            text = "Answers, by status (each counted just before it is written)."
            lines += metric("receiver_requests_total", "counter", text)
            lines += [
                f'receiver_requests_total{{code="{c}"}} {n}' for c, n in sorted(self.codes.items())
            ]
            name = "receiver_request_duration_seconds"
            text = "Seconds from a connection accepted to its answer, ready to be written."
            lines += metric(name, "histogram", text)
            total = 0
            for le, count in zip(
                [*map(str, DURATION_BUCKETS_S), "+Inf"], self.buckets, strict=True
            ):
                total += count
                lines.append(f'{name}_bucket{{le="{le}"}} {total}')
            lines += [f"{name}_sum {self.duration_sum_s!r}", f"{name}_count {total}"]
        return "\n".join(lines) + "\n"


def metric(name, kind, text):
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


class NotTheReceivers(ValueError):
    """RECEIVER_DB names a database another program made (or a table the receiver cannot use)."""


def refuse_another_programs_file(path, store=TicketStore):
    """Raise NotTheReceivers unless path is missing, empty, or holds only tables the store makes
    (store.ours); read-only (mode=ro): the file is not changed, whatever it holds.

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
        if foreign := [name for name in tables if name not in store.COLUMNS]:
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
            if not store.ours(table, columns, bool(unique)):
                unique = unique or table not in store.KEYED  # a table of rows without keys
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


# helpers: input validation

MAX_TITLE_CHARS = 200  # characters: a ticket title, not a document.
MAX_KEY_CHARS = 200  # characters: space for "case-id:step:intent:version" keys or a hash.
KEY_PATTERN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_CHARS}}}")  # visible ASCII, so
#                        keys print, log and compare the same everywhere.


class DuplicateName(ValueError):
    """A JSON object that names a field twice: which value counts is up to each parser."""


def unique_names(pairs):
    seen = set()
    for name, _ in pairs:
        if name in seen:
            raise DuplicateName(json.dumps(name, ensure_ascii=True))
        seen.add(name)
    return dict(pairs)


def parse_ticket(body):
    """Validate a POST /tickets body; return its canonical JSON (sorted keys, no spaces)."""
    title = parse_object(body, '{"title": "..."}', "title")["title"]
    if not isinstance(title, str) or not 1 <= len(title) <= MAX_TITLE_CHARS:
        raise ClientError(400, f"title must be a string of 1-{MAX_TITLE_CHARS} characters")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell half a UTF-16 pair ("\ud800"): not a character
        raise ClientError(400, "title has a lone surrogate escape; send real characters") from None
    return canonical({"title": title})


def parse_object(body, example, *fields):
    """The JSON object in body, which must have exactly these fields."""
    try:
        payload = parse_json(body, example, unique_names, DuplicateName)
    except DuplicateName as error:
        raise ClientError(400, f"body names {error} twice; send it once") from None
    if not isinstance(payload, dict):
        raise ClientError(400, f"body must be a JSON object like {example}")
    if set(payload) != set(fields):
        names = " and ".join(f'"{name}"' for name in fields)
        what = "one field" if len(fields) == 1 else "the fields"
        raise ClientError(400, f"body must have exactly {what}, {names}")
    return payload


def canonical(payload):
    """Sorted keys, no spaces: the same body however it was spelled."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_key(values, where="Idempotency-Key"):
    """None when absent; the key when exactly one valid key was sent."""
    if not values:
        return None
    if len(values) > 1:
        raise ClientError(400, f"send {where} once, not {len(values)} times")
    if not KEY_PATTERN.fullmatch(values[0]):
        raise ClientError(
            400, f"{where} must be 1-{MAX_KEY_CHARS} visible ASCII characters (no spaces)"
        )
    return values[0]


# helpers: the command line

EXIT_CONFIG, EXIT_CANNOT_LISTEN = 2, 3  # a bad setting / RECEIVER_DB; the port is taken
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT (128 + 2); SIGTERM is a clean 0


class ConfigError(Exception):
    """A setting that cannot work: one line on stderr, exit EXIT_CONFIG or as given."""

    def __init__(self, message, exit_code=EXIT_CONFIG):
        super().__init__(message)
        self.exit_code = exit_code


def setting(environ, name, default, kind=float, low=0, high=float("inf")):
    """The variable's value, which must lie strictly between low and high."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low < value < high:
        what = "a whole number" if kind is int else "a number"
        limits = f"above {low:g}" + (f" and below {high:g}" if high < float("inf") else "")
        raise ConfigError(f"{name}={text!r} must be {what} {limits}")
    return value


def open_server(environ, store_class=TicketStore, handler=Handler, known=POINTS):
    """Read the settings, open the store and the listening socket; ConfigError if one fails."""
    db_path = environ.get("RECEIVER_DB", "data/receiver/receiver.sqlite")
    host = environ.get("HOST", "127.0.0.1")
    port = setting(environ, "PORT", 8000, int, -1, 65536)
    busy_timeout_s = setting(environ, "RECEIVER_BUSY_TIMEOUT_S", BUSY_TIMEOUT_S)
    request_timeout_s = setting(environ, "RECEIVER_REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S)
    max_connections = setting(environ, "RECEIVER_MAX_CONNECTIONS", MAX_CONNECTIONS, int)
    retention_s = setting(environ, "RECEIVER_KEY_RETENTION_S", None)
    spec = environ.get("FAILPOINTS", "")
    try:
        points = failpoints.parse(spec, known)
    except failpoints.FailpointSpecError as error:
        raise ConfigError(str(error)) from None
    try:
        tracing.start(environ.get("TRACE", ""), "receiver")
    except tracing.TracingError as error:
        raise ConfigError(str(error)) from None
    try:
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        metrics = Metrics(handler.counters)
        store = store_class(db_path, busy_timeout_s, retention_s, metrics)
    except (OSError, sqlite3.Error, NotTheReceivers) as error:
        raise ConfigError(f"RECEIVER_DB {db_path!r} cannot be used: {error}") from None
    try:
        server = GuardedServer(
            (host, port), handler, request_timeout_s, max_connections, metrics.answered
        )
    except OSError as error:
        store.close()
        reason = error.strerror or str(error)
        hint = "stop what uses it, or set PORT to a free one" if port else "check HOST"
        raise ConfigError(
            f"cannot listen on {host}:{port} ({reason}); {hint}", EXIT_CANNOT_LISTEN
        ) from None
    server.store, server.metrics = store, metrics
    failpoints.configure(spec, known)
    where = f"listening on {host}:{server.server_port}, tickets in {db_path}"
    return server, where, points


if __name__ == "__main__":
    sys.exit(main())
