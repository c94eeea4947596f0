"""The ledger's storage: one row per effect, keyed by its idempotency key, in the workflow's
own database (a SQLite file, or Postgres: postgres_ledger.py), with its transitions, its receipt
(kept once, never overwritten, checked against its integrity hash) and its lease. effects.py
decides what to send; this file records it. Standard library only.
"""

import dataclasses
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from corrections import corrected
from ledger_tables import ADDED_COLUMNS, SCHEMA, digest_of, integrity_fault, wal

STATES = ("requested", "confirmed", "failed", "unknown", "released")
TABLES = ("effects", "effect_transitions", "effect_receipts", "effect_extras", "effect_corrections")
OPENING = threading.RLock()  # a Ledger's first connection in a process is opened under it
LEASES = {}  # this process's lease files: path -> (descriptor, {key: the Ledger holding it})
SETTLED = ("confirmed", "failed")  # final: a later attempt returns (or raises) what they say
OPEN = ("requested", "unknown")  # a request may be out there: never send blindly
LEASE_S = 300.0  # a SQLite lease's default length (LEDGER_LEASE_S): past it a live performer
#   (hung past every timeout) keeps no one out; its late answer is the receipt, or an extra


class LedgerError(Exception):
    """A ledger refusal: one line that says what to do."""


class Conflict(LedgerError):
    """The key was claimed for another request: a new operation needs a new key."""


class InFlight(LedgerError):
    """Another live process is performing the key right now: its answer is not in yet."""

    def __init__(self, key):
        super().__init__(
            f"effect {key!r} is being performed by another live process (it holds the key's "
            "lock); try again once it has finished: its receipt will be there"
        )
        self.key = key


class Damaged(LedgerError):
    """A ledger row fails its own check (a receipt changed, forged or gone): nothing is sent."""


class NotText(LedgerError, ValueError):
    """A request that is not Unicode text (a lone surrogate: bytes that were not UTF-8)."""


@dataclasses.dataclass(frozen=True)
class Record:
    key: str
    effect: str
    state: str
    request_hash: str
    note: str
    answer: dict | None = None  # the receipt's, once confirmed
    reopened: bool = False  # claim found it requested or unknown: an earlier attempt's
    refusal: dict | None = None  # the provider's no, once failed
    age_s: float = 0.0  # since its last transition
    since_sent_s: float = 0.0  # since the last request under the key may have left
    authorized: str | None = None  # what authorized its last send (Effect.authorize)


class Ledger:
    """The effects of one workflow database (a SQLite file or a Postgres connection)."""

    def claim(self, key, effect, request, thread=None):
        """Record the intent before the request leaves: a Record in state requested, or the
        row the key already has (a released one takes a changed request; else Conflict). One
        transaction under a write lock (SQLite BEGIN IMMEDIATE; Postgres INSERT ... ON CONFLICT,
        then FOR UPDATE): two attempts never both take a fresh claim. Owner: owner, lease_until."""
        canonical, digest = request_hash(request)
        now = time.time()
        with self.transaction():
            row = self.row(key, lock=True)
            if (
                row is None
                and self.sql(
                    "INSERT INTO effects (key, effect, thread, request, request_hash, state, "
                    "updated_at, sent_at, owner, lease_until) "
                    "VALUES (?, ?, ?, ?, ?, 'requested', ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (key, effect, thread, canonical, digest, now, now, self.owner,
                     now + self.lease_s),
                ).rowcount
            ):  # fmt: skip
                self.transition(key, None, "requested", "claimed")
                return Record(key, effect, "requested", digest, "claimed")
            row = row or self.row(key, lock=True)  # another attempt inserted it first
            changed, released = row["request_hash"] != digest, row["state"] == "released"
            if row["effect"] != effect or (changed and not released):
                raise Conflict(
                    f"key {key!r} was claimed for another {row['effect']} request; "
                    "use a new key for a new operation"
                )
            if released:  # nothing was sent under it (proven): it may take a new request
                how = "claimed: request changed while released" if changed else "claimed"
                self.sql(
                    "UPDATE effects SET request = ?, request_hash = ? WHERE key = ?",
                    (canonical, digest, key),
                )
                self.move_locked(key, row["state"], "requested", how)
                return Record(key, effect, "requested", digest, how)
            if row["state"] in OPEN:
                self.sql(
                    "UPDATE effects SET owner = ?, lease_until = ? WHERE key = ?",
                    (self.owner, now + self.lease_s, key),
                )
            return self.record(row, reopened=row["state"] in OPEN)

    @contextmanager
    def performing(self, key):
        """Held while this process performs key: the key's lock (an fcntl lock on one byte of
        the file's -lease file, the byte the key's hash names), dropped by the OS when its
        process dies, so the resume after a kill takes it at once, in another container on the
        same volume too. Taken by another live process: InFlight, unless its lease on an open
        row (lease_until, LEASE_S after its claim) ran out: then this process goes on, the
        evidence rule decides what it sends, the late holder's answer the receipt or an extra."""
        with self.lease_lock(key) as held:
            if not held:  # another holder, claiming or sending: out unless its lease ran out
                row = self.row(key)
                if (
                    row is None
                    or row["state"] not in OPEN
                    or (row["lease_until"] or 0) > time.time()
                ):
                    raise InFlight(key)
            yield

    def confirm(self, key, answer, external_id, how):
        """The receipt: kept once, never overwritten; the answer it holds. A second external id
        for the key (a lost race, a lease taken over, a person's late word) is kept as an extra:
        something the provider made that the receipt does not name, to be undone."""
        answer_json = json.dumps(answer, sort_keys=True, separators=(",", ":"))
        with self.transaction():
            row = self.row(key, lock=True)
            if row["state"] == "confirmed":  # confirmed meanwhile: the first receipt stands
                first = self.receipt(key)
                if first["external_id"] != str(external_id):
                    self.sql(
                        "INSERT INTO effect_extras (key, external_id, answer, how, at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (key, str(external_id), answer_json, how, time.time()),
                    )
                return first["answer"]
            fields = [key, row["effect"], row["request_hash"], str(external_id), answer_json]
            self.sql(
                "INSERT INTO effect_receipts (key, external_id, answer, request_hash, "
                "integrity, at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key,
                    str(external_id),
                    answer_json,
                    row["request_hash"],
                    digest_of(fields),
                    time.time(),
                ),
            )
            self.move_locked(key, row["state"], "confirmed", how)
        return answer

    def authorize(self, key, authorized):
        """Keep on key's row what authorized the send about to leave (an approval's name)."""
        with self.transaction():
            self.sql("UPDATE effects SET authorized = ? WHERE key = ?", (authorized, key))

    def extras(self):
        """[(key, external_id, how)]: what a provider made under a key beyond its receipt."""
        rows = self.sql("SELECT key, external_id, how FROM effect_extras ORDER BY id").fetchall()
        return [(row["key"], row["external_id"], row["how"]) for row in rows]

    def refuse(self, key, refusal):
        """Failed: the provider's refusal kept, final like a receipt."""
        with self.transaction():
            row = self.row(key, lock=True)
            self.sql("UPDATE effects SET refusal = ? WHERE key = ?", (json.dumps(refusal), key))
            self.move_locked(key, row["state"], "failed", "refused")

    def move(self, key, state, how):
        """A transition recorded with its time and why."""
        with self.transaction():
            row = self.row(key, lock=True)
            self.move_locked(key, row["state"], state, how)

    def settle(self, key, how, answer=None, external_id=None):
        """A person's answer where no lookup can tell: confirmed (with the provider's answer and
        id they found), or, with answer None, not sent (released: the next attempt sends it)."""
        if answer is None:
            return self.move(key, "released", f"settled: not sent ({how})")
        return self.confirm(key, answer, external_id, f"settled: confirmed ({how})")

    def unsettled(self, older_than_s=0.0):
        """The rows a person may have to look at: unknown, or requested longer than that."""
        cutoff = time.time() - older_than_s
        rows = self.sql(
            "SELECT * FROM effects WHERE state = 'unknown' OR (state = 'requested' AND "
            "updated_at <= ?) ORDER BY updated_at",
            (cutoff,),
        ).fetchall()
        return [self.record(row) for row in rows]

    def stuck(self):
        """(how many effects are open, seconds since the oldest last moved; 0 with none): every
        `unknown` and `requested` (a kill after-send leaves one, so does a live run's send)."""
        by_state, oldest_s = self.counts()
        return sum(by_state[state] for state in OPEN), oldest_s

    def counts(self):
        """({state: how many effects}, every state in STATES; the oldest open one's age in
        seconds, 0 with none), in one read."""
        rows = self.sql(
            "SELECT state, COUNT(*) AS n, MIN(updated_at) AS oldest FROM effects GROUP BY state"
        ).fetchall()
        by_state = dict.fromkeys(STATES, 0) | {row["state"]: row["n"] for row in rows}
        opened = [row["oldest"] for row in rows if row["state"] in OPEN]
        return by_state, (max(0.0, time.time() - min(opened)) if opened else 0.0)

    def get(self, key):
        """The Record of key, or None."""
        row = self.row(key)
        return None if row is None else self.record(row)

    def history(self, key):
        """[(from, to, how)] of key, oldest first."""
        rows = self.sql(
            "SELECT from_state, to_state, how FROM effect_transitions WHERE key = ? ORDER BY id",
            (key,),
        )
        return [(row["from_state"], row["to_state"], row["how"]) for row in rows.fetchall()]

    def receipt(self, key):
        """The receipt of key (its integrity checked), as corrected (corrections.py), or None."""
        row = self.sql("SELECT * FROM effect_receipts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        effect = self.row(key)
        fields = [key, effect["effect"], row["request_hash"], row["external_id"], row["answer"]]
        if (why := integrity_fault(fields, row["integrity"])) is not None:
            raise Damaged(f"the receipt of {key!r} does not match its integrity hash: {why}")
        return corrected(self, key, {**dict(row), "answer": json.loads(row["answer"])})

    # helpers

    def __init__(self, path, busy_timeout_s=5.0, lease_s=LEASE_S):
        self.path, self.busy_timeout_s, self.conn, self.pid = path, busy_timeout_s, None, None
        self.lease_s = lease_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"  # the lease's holder

    @contextmanager
    def lease_lock(self, key):
        """True while this Ledger holds key's lock, False when another holder has it. fcntl
        locks belong to a process, and closing any descriptor of the file drops them all: so one
        descriptor per file and process (LEASES), and a table of which Ledger holds which key,
        so two Ledgers of one process exclude each other as two processes do."""
        path = os.path.abspath(f"{self.path}-lease")
        offset = int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")
        with OPENING:
            if LEASES.get("pid") != os.getpid():  # a forked child holds none of its parent's
                for inherited in [v[0] for k, v in LEASES.items() if k != "pid"]:
                    os.close(inherited)  # the child's copy: the parent's locks stay
                LEASES.clear()
                LEASES["pid"] = os.getpid()
            if path not in LEASES:  # opened while this process holds a key of it
                try:
                    LEASES[path] = (os.open(path, os.O_RDWR | os.O_CREAT, 0o644), {})
                except OSError as error:
                    raise LedgerError(
                        f"cannot open the ledger's lease file {path}: {error}"
                    ) from None
            fd, holders = LEASES[path]
            taken = False  # by this call: released by this call
            if key not in holders:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
                    holders[key] = self
                    taken = True
                except OSError:  # another process holds it (EAGAIN or EACCES)
                    if not holders:
                        os.close(LEASES.pop(path)[0])
            held = holders.get(key) is self
        try:
            yield held
        finally:
            if taken:
                with OPENING:
                    del holders[key]
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
                    if not holders:  # no lock of this process left on it: closing loses none
                        os.close(LEASES.pop(path)[0])

    @property
    def db(self):
        """This process's connection, opened on first use: a forked child (effectdrill's crash
        runs) opens its own rather than share its parent's, which SQLite forbids."""
        with OPENING:  # two threads meeting a new process here open one connection, not two
            if self.pid != os.getpid():
                self.open()
        return self.conn

    def open(self):
        """One connection for the process's threads (LangGraph runs sync nodes in a pool), used
        by one thread at a time, under self.lock; the tables made if they are not there."""
        self.lock = threading.RLock()
        self.conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self.pid = os.getpid()
        self.conn.row_factory = sqlite3.Row
        wal(self.conn, self.busy_timeout_s)  # as SqliteSaver sets it on the same file
        self.conn.execute("PRAGMA synchronous=FULL")  # a receipt survives a power cut
        with self.transaction():
            for statement in SCHEMA:
                self.conn.execute(statement)
            have = {row["name"] for row in self.conn.execute("PRAGMA table_info(effects)")}
            for column, kind in ADDED_COLUMNS:  # a ledger file made before they were
                if column not in have:
                    self.conn.execute(f"ALTER TABLE effects ADD COLUMN {column} {kind}")

    def close(self):
        if self.conn is not None and self.pid == os.getpid():
            self.conn.close()
        self.conn = self.pid = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE: the write lock first, so a lookup and its insert cannot interleave
        with another process's (nor, under self.lock, with another thread's)."""
        db = self.db
        with self.lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def sql(self, statement, args=()):
        db = self.db
        with self.lock:
            return db.execute(statement, args)

    def row(self, key, lock=False):  # SQLite's BEGIN IMMEDIATE already holds the lock
        return self.sql("SELECT * FROM effects WHERE key = ?", (key,)).fetchone()

    def move_locked(self, key, was, state, how):
        if state not in STATES:
            raise ValueError(f"no state {state!r}")
        now, sending = time.time(), state == "requested"
        self.sql(
            "UPDATE effects SET state = ?, note = ?, updated_at = ?, attempts = attempts + ?, "
            "sent_at = CASE WHEN ? THEN ? ELSE sent_at END WHERE key = ?",
            (state, how, now, int(sending), sending, now, key),
        )
        self.transition(key, was, state, how)

    def transition(self, key, was, state, how):
        self.sql(
            "INSERT INTO effect_transitions (key, from_state, to_state, how, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (key, was, state, how, time.time()),
        )

    def record(self, row, reopened=False):
        answer = None
        if row["state"] == "confirmed":
            if (receipt := self.receipt(row["key"])) is None:
                raise Damaged(
                    f"effect {row['key']!r} is confirmed and its receipt is missing: the ledger "
                    "was changed outside this program; nothing was sent. Ask the provider what "
                    "it holds under the key, or restore the ledger from a copy"
                )
            answer = receipt["answer"]
        return Record(
            row["key"],
            row["effect"],
            row["state"],
            row["request_hash"],
            row["note"] or "",
            answer,
            reopened,
            None if row["refusal"] is None else json.loads(row["refusal"]),
            time.time() - row["updated_at"],
            time.time() - (row["sent_at"] or row["updated_at"]),
            dict(row).get("authorized"),  # None in a ledger read before the column was added
        )


class LedgerReader(Ledger):
    """A SQLite ledger opened to read only (mode=ro): nothing is created or written, not even
    its tables. A file that does not exist is an error, not a new file."""

    def open(self):
        self.lock = threading.RLock()
        uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
        self.conn = sqlite3.connect(
            uri, uri=True, timeout=self.busy_timeout_s, check_same_thread=False
        )
        self.pid = os.getpid()
        self.conn.row_factory = sqlite3.Row


def request_hash(request):
    """(canonical JSON, its sha256): the same request however it was spelled. NotText for a
    string that cannot be UTF-8 (a lone surrogate: Python's stand-in for an argument's bytes
    that were not UTF-8), which neither the hash nor the database could store."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        encoded = canonical.encode()
    except UnicodeEncodeError as error:
        bad = canonical[error.start : error.end].encode("utf-8", "surrogateescape")
        raise NotText(f"the request holds bytes that are not UTF-8 text ({bad!r})") from None
    return canonical, hashlib.sha256(encoded).hexdigest()


@contextmanager
def read_ledger(target):
    """The ledger of target (a SQLite file, or a postgresql:// URL) to read from, closed on
    exit: SQLite read-only (LedgerReader), Postgres on a read-only session; no table made."""
    if not str(target).startswith(("postgresql://", "postgres://")):
        with LedgerReader(target) as ledger:
            yield ledger
        return
    import psycopg
    from psycopg.rows import dict_row

    from postgres_ledger import PostgresLedger

    options = "-c default_transaction_read_only=on"
    with psycopg.connect(target, autocommit=True, row_factory=dict_row, options=options) as conn:
        ledger = PostgresLedger.__new__(PostgresLedger)  # not __init__: it makes the tables
        ledger.db = conn
        yield ledger


@contextmanager
def open_ledger(target, lease_s=LEASE_S):
    """The ledger in the workflow's own database: a SQLite file, or a postgresql:// URL (its own
    autocommit connection, psycopg 3). Closed on exit."""
    if not str(target).startswith(("postgresql://", "postgres://")):
        ledger = Ledger(target, lease_s=lease_s)
    else:
        import psycopg
        from psycopg.rows import dict_row

        from postgres_ledger import PostgresLedger

        conn = psycopg.connect(target, autocommit=True, row_factory=dict_row)
        ledger = PostgresLedger(conn, lease_s)
        ledger.close = ledger.db.close
    try:
        yield ledger
    finally:
        ledger.close()
