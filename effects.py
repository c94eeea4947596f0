"""The effect ledger: write down what you are about to do to the outside world before doing it.

A node that changes another system (opens a ticket, charges a card, sends an email) calls
Effect.perform instead of the provider. Each effect is one row, keyed by its idempotency key, in
the workflow's own database, and it moves through these states:

    requested -> confirmed   the answer came back: a receipt is kept, never overwritten
              -> failed      the provider refused it (a business answer: nothing was done)
              -> unknown     sent, and no answer: done or not, nobody here can tell
              -> released    provably never left (the connection was refused): send again
    proposed -> authorized -> requested   an effect that waits for a person first

`requested` is committed before the request leaves. A process that dies after the provider
committed and before the answer was recorded (the crash window) leaves that row behind, and the
next attempt does not send blindly:

    confirmed            the receipt's answer is returned; the provider is not called at all
    requested, unknown   the provider is asked by key (Effect.lookup) and what it made is adopted;
                         it made nothing: the request goes again with the same key. A provider
                         with no lookup: Unsettled, and a person settles it (Ledger.settle)
    another request under the same key: Conflict, never a second effect
    a live process is performing it   InFlight (Postgres: it holds the key's advisory lock)

The ledger's row and LangGraph's checkpoint are two commits, even in one SQLite file. The ledger
has a connection of its own; so has SqliteSaver (SqliteSaver.from_conn_string opens one, and
SqliteSaver.cursor commits on it: langgraph/checkpoint/sqlite/__init__.py), and LangGraph hands
each node's writes to it from a background executor (PregelLoop.put_writes calls self.submit:
langgraph/pregel/_loop.py). PostgresSaver's connection is autocommit (PostgresSaver.
from_conn_string, langgraph/checkpoint/postgres/__init__.py; workflow.open_postgres does the
same), the ledger's another. A crash between the receipt and the checkpoint (failpoint
after-ack) re-runs the node; the node finds the receipt and the provider hears nothing. A crash
between the provider's answer and the receipt (after-send) leaves `requested`: the lookup's case.

Standard library only, and psycopg for a Postgres ledger (open_ledger imports it only for a
postgresql:// URL), OpenTelemetry only with LAB_TRACE set; importing this module changes nothing.
"""

import dataclasses
import hashlib
import hmac
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NamedTuple

import tracing
from failpoints import fail

STATES = ("proposed", "authorized", "requested", "confirmed", "failed", "unknown", "released")
TABLES = ("effects", "effect_transitions", "effect_receipts")
OPENING = threading.RLock()  # a Ledger's first connection in a process is opened under it
SETTLED = ("confirmed", "failed")  # final: a later attempt returns (or raises) what they say
OPEN = ("requested", "unknown")  # a request may be out there: never send blindly
KEYED = "hmac-sha256:"  # how a receipt's integrity hash made with LEDGER_RECEIPT_KEY begins
RECEIPTS = {"key": None, "unkeyed": "refuse"}  # key_receipts() sets them, from a program's main()


@dataclasses.dataclass(frozen=True)
class Effect:
    """One kind of effect, declared once: what it sends, how it is looked up, what it answers.

    send(client, request, key) -> the provider's answer (a dict); not_sent(error) is true for
    an error that proves the request never left (a refused connection); refused(error) -> the
    provider's refusal (a dict) when the error is a business "no" (nothing was done), else None.
    lookup(client, key) -> the answer the key made, or None when it made nothing; None (the
    attribute) for a provider that offers no lookup (an email, an SMS).
    external_id(answer) -> the provider's id for what it made, kept in the receipt.
    """

    name: str
    send: Callable
    external_id: Callable
    lookup: Callable | None = None
    not_sent: Callable = lambda error: False
    refused: Callable = lambda error: None

    def perform(self, ledger, key, request, client, thread=None):
        """The effect's Outcome, made at most once per key: from the receipt when there is one."""
        with ledger.performing(key):  # Postgres: InFlight while a live process performs key
            # LAB_TRACE: a span with the key, how it was made and the ledger's state (tracing.py)
            with tracing.effect(self.name, key, ledger) as traced:
                return traced(self.perform_claimed(ledger, key, request, client, thread))

    def perform_claimed(self, ledger, key, request, client, thread=None):
        record = ledger.claim(key, self.name, request, thread)
        if record.state == "confirmed":
            return Outcome(record.answer, "receipt")  # a replay: the provider is not called
        if record.state == "failed":
            raise Refused(key, record.refusal)
        if record.reopened and (found := self.look_up(ledger, key, client)) is not None:
            return found  # an earlier attempt's request had taken effect: adopted
        try:
            answer = self.send(client, request, key)
        except Exception as error:
            if self.not_sent(error):
                ledger.move(key, "released", f"not sent: {error}")
                raise
            if (refusal := self.refused(error)) is not None:
                ledger.refuse(key, refusal)
                raise Refused(key, refusal) from error
            ledger.move(key, "unknown", f"no answer: {type(error).__name__}: {error}")
            if self.lookup is None:
                raise
            # Sent, no answer: ask the provider by key at once; it made nothing: one more try,
            # with the same key, which a keyed provider answers with what the first one made.
            if (found := self.look_up(ledger, key, client)) is not None:
                return found
            answer = self.send(client, request, key)
        except BaseException:  # Ctrl-C, a drain: the request may have left
            ledger.move(key, "unknown", "interrupted while the request was out")
            raise
        # The provider has committed it and the ledger does not know yet: the window a kill
        # here leaves is closed by the lookup of the next attempt (or a person, without one).
        fail("after-send")
        return Outcome(ledger.confirm(key, answer, self.external_id(answer), "answered"), "sent")

    def look_up(self, ledger, key, client):
        """The Outcome adopted from the provider's answer under key, or None: it made nothing."""
        if self.lookup is None:
            ledger.move(key, "unknown", "no lookup: a person must settle it")
            raise Unsettled(key, self.name)
        if (found := self.lookup(client, key)) is None:
            return None
        return Outcome(
            ledger.confirm(key, found, self.external_id(found), "adopted by lookup"), "adopted"
        )


class Outcome(NamedTuple):
    answer: dict  # the provider's, or the receipt's on a replay
    how: str  # sent, receipt (the provider was not called), adopted (found by lookup)


def declared(namespace):
    """The effects declared in a module's namespace (vars(module)), by name."""
    return {v.name: v for v in namespace.values() if isinstance(v, Effect)}


def reconcile(ledger, effects, client):
    """[(Record, what happened)] for each effect that may be out there (requested, unknown):
    asked by key where its provider has a lookup; effects: declared(...) of the program."""
    done = []
    for record in ledger.unsettled():
        try:
            with ledger.performing(record.key):  # a live process's request may still be out
                done.append(reconcile_one(ledger, record, effects.get(record.effect), client))
        except InFlight:
            done.append((record, "in flight"))
    return done


def reconcile_one(ledger, record, effect, client):
    """(record, what happened) for one open effect, asked by key where it has a lookup."""
    if effect is None or effect.lookup is None:
        if record.state != "unknown":
            ledger.move(record.key, "unknown", "reconcile: no lookup, a person must settle it")
        return record, "needs a person"
    if (found := effect.lookup(client, record.key)) is not None:
        ledger.confirm(record.key, found, effect.external_id(found), "reconcile: adopted")
        return record, "confirmed"
    ledger.move(record.key, "released", "reconcile: the provider has nothing under it")
    return record, "not sent"


class LedgerError(Exception):
    """A ledger refusal: one line that says what to do."""


class Conflict(LedgerError):
    """The key was claimed for another request: a new operation needs a new key."""


class Unsettled(LedgerError):
    """An earlier attempt may have made the effect and the provider cannot be asked."""

    def __init__(self, key, effect):
        super().__init__(
            f"effect {effect} {key!r} may have happened (an earlier attempt sent it and no "
            f"answer was recorded) and its provider has no lookup: look at what the provider "
            f"holds first, then reconcile --confirmed {key} if it happened, --not-sent {key} if "
            "it did not"
        )
        self.key = key


class InFlight(LedgerError):
    """Another live process is performing the key right now: its answer is not in yet."""

    def __init__(self, key):
        super().__init__(
            f"effect {key!r} is being performed by another live process (it holds the key's "
            "lock); try again once it has finished: its receipt will be there"
        )
        self.key = key


class Refused(LedgerError):
    """The provider said no (refusal: its answer), and the ledger recorded it as failed."""

    def __init__(self, key, refusal):
        super().__init__(f"effect {key!r} was refused: {refusal}")
        self.key, self.refusal = key, refusal


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


class Ledger:
    """The effects of one workflow database (a SQLite file or a Postgres connection)."""

    def claim(self, key, effect, request, thread=None):
        """Record the intent before the request leaves: a Record in state requested, or the
        row the key already has. One transaction under a write lock (SQLite BEGIN IMMEDIATE;
        Postgres INSERT ... ON CONFLICT, then the row locked FOR UPDATE), so two attempts
        cannot both take a fresh claim."""
        canonical, digest = request_hash(request)
        with self.transaction():
            row = self.row(key, lock=True)
            if (
                row is None
                and self.sql(
                    "INSERT INTO effects (key, effect, thread, request, request_hash, state, "
                    "updated_at) VALUES (?, ?, ?, ?, ?, 'requested', ?) ON CONFLICT DO NOTHING",
                    (key, effect, thread, canonical, digest, time.time()),
                ).rowcount
            ):
                self.transition(key, None, "requested", "claimed")
                return Record(key, effect, "requested", digest, "claimed")
            row = row or self.row(key, lock=True)  # another attempt inserted it first
            if row["request_hash"] != digest or row["effect"] != effect:
                raise Conflict(
                    f"key {key!r} was claimed for another {row['effect']} request; "
                    "use a new key for a new operation"
                )
            if row["state"] in ("authorized", "released", "proposed"):
                self.move_locked(key, row["state"], "requested", "claimed")
                return Record(key, effect, "requested", digest, "claimed")
            return self.record(row, reopened=row["state"] in OPEN)

    @contextmanager
    def performing(self, key):
        """Held while this process performs key. SQLite: nothing more than claim's lock."""
        yield

    def confirm(self, key, answer, external_id, how):
        """The receipt: kept once, never overwritten; the answer it holds."""
        with self.transaction():
            row = self.row(key, lock=True)
            if row["state"] == "confirmed":  # confirmed meanwhile: the first receipt stands
                return self.receipt(key)["answer"]
            answer_json = json.dumps(answer, sort_keys=True, separators=(",", ":"))
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
        """(how many effects are open, seconds since the oldest of them last moved; 0 with
        none): the requests whose answer was never recorded. Open is `unknown`, and every
        `requested`: a kill in the crash window leaves one (after-send), and so, for as long as
        its request is out, does a live run."""
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
        """The receipt of key (its integrity checked), or None."""
        row = self.sql("SELECT * FROM effect_receipts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        effect = self.row(key)
        fields = [key, effect["effect"], row["request_hash"], row["external_id"], row["answer"]]
        check_integrity(key, fields, row["integrity"])
        return {**dict(row), "answer": json.loads(row["answer"])}

    # helpers

    def __init__(self, path, busy_timeout_s=5.0):
        self.path, self.busy_timeout_s, self.conn, self.pid = path, busy_timeout_s, None, None

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
        self.sql(
            "UPDATE effects SET state = ?, note = ?, updated_at = ?, attempts = attempts + ? "
            "WHERE key = ?",
            (state, how, time.time(), int(state == "requested"), key),
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
        )


class PostgresLedger(Ledger):
    """The same ledger in Postgres, on a connection the caller opened (psycopg 3, dict rows).

    A claim inserts with ON CONFLICT DO NOTHING and then locks the row FOR UPDATE: a SELECT ...
    FOR UPDATE alone locks no row that does not exist yet, so two workers could both miss it."""

    db = None  # the caller's connection, not opened here

    def __init__(self, conn):
        self.db = conn
        with self.transaction():
            self.sql("SELECT pg_advisory_xact_lock(hashtext('effect ledger schema'))")
            for statement in POSTGRES_SCHEMA:
                self.sql(statement)

    def close(self):
        pass  # the caller's connection: the caller closes it

    @contextmanager
    def performing(self, key):
        """The key's session advisory lock, held from the claim to the receipt: a row found
        requested does not say whether its sender is alive (a worker whose lease another one
        took over may still be sending), the lock does: Postgres drops it with the session of a
        process that died. Taken: InFlight, and nothing is sent. A session's own lock is
        reentrant, so two performers need two connections."""
        ids = ("effect ledger", key)
        taken = "SELECT pg_try_advisory_lock(hashtext(?), hashtext(?)) AS taken"
        if not self.sql(taken, ids).fetchone()["taken"]:
            raise InFlight(key)
        try:
            yield
        finally:
            with suppress(Exception):  # a lost session has dropped the lock already
                self.sql("SELECT pg_advisory_unlock(hashtext(?), hashtext(?))", ids)

    @contextmanager
    def transaction(self):
        with self.db.transaction():
            yield

    def sql(self, statement, args=()):
        return self.db.execute(statement.replace("?", "%s"), args)

    def row(self, key, lock=False):
        lock_it = " FOR UPDATE" if lock else ""
        return self.sql("SELECT * FROM effects WHERE key = ?" + lock_it, (key,)).fetchone()


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

    options = "-c default_transaction_read_only=on"
    with psycopg.connect(target, autocommit=True, row_factory=dict_row, options=options) as conn:
        ledger = PostgresLedger.__new__(PostgresLedger)  # not __init__: it makes the tables
        ledger.db = conn
        yield ledger


@contextmanager
def open_ledger(target):
    """The ledger in the workflow's own database: a SQLite file, or a postgresql:// URL (its own
    autocommit connection, psycopg 3). Closed on exit."""
    if not str(target).startswith(("postgresql://", "postgres://")):
        ledger = Ledger(target)
    else:
        import psycopg
        from psycopg.rows import dict_row

        ledger = PostgresLedger(psycopg.connect(target, autocommit=True, row_factory=dict_row))
        ledger.close = ledger.db.close
    try:
        yield ledger
    finally:
        ledger.close()


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY,  -- the idempotency key: one row per effect
    effect TEXT NOT NULL,  -- its declaration's name (ticket, refund, email, ...)
    thread TEXT,  -- the LangGraph thread that asked for it
    request TEXT NOT NULL,  -- canonical JSON of what is sent
    request_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    note TEXT,  -- why it is in this state
    refusal TEXT,  -- the provider's answer when it said no (state failed)
    attempts INTEGER NOT NULL DEFAULT 1,
    updated_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_transitions (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL REFERENCES effects (key),
    from_state TEXT,
    to_state TEXT NOT NULL,
    how TEXT NOT NULL,
    at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_receipts (
    key TEXT PRIMARY KEY REFERENCES effects (key),
    external_id TEXT NOT NULL,  -- the provider's id for what it made
    answer TEXT NOT NULL,  -- the provider's answer, canonical JSON
    request_hash TEXT NOT NULL,
    integrity TEXT NOT NULL,  -- digest_of key, effect, request hash, external id, answer
    at REAL NOT NULL
)""",
    """CREATE TRIGGER IF NOT EXISTS receipts_are_kept BEFORE UPDATE ON effect_receipts
BEGIN SELECT RAISE(ABORT, 'a receipt is never overwritten'); END""",
    """CREATE TRIGGER IF NOT EXISTS receipts_stay BEFORE DELETE ON effect_receipts
BEGIN SELECT RAISE(ABORT, 'a receipt is never deleted'); END""",
)


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


def wal(conn, timeout_s):
    """PRAGMA journal_mode=WAL, waiting out another process that is making the same new file:
    SQLite answers "database is locked" at once there, without its busy wait (two forked
    processes opening a new ledger together met it a third of the time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def key_receipts(key="", unkeyed="refuse"):
    """LEDGER_RECEIPT_KEY and LEDGER_RECEIPT_UNKEYED, for the receipts this process writes and
    reads (a program's main() calls it; the defaults are the settings' own).

    No key (the default): a receipt's integrity hash is a plain sha256 of what it records (its
    key, effect, request hash, the provider's id and answer). It catches a receipt damaged, or
    edited by hand without its hash: not a forger, who can compute a sha256 as well as we can.
    A key: the hash is an HMAC-SHA256 under it, written as "hmac-sha256:<hex>". Someone who can
    write the ledger but does not know the key (a shared database, a copy restored from
    elsewhere) can neither forge a receipt nor change one; they can still delete rows, or put
    back an older copy of the whole file. A plain receipt is then refused, since a forger can
    write one too; one written before the key was set is read only with unkeyed="accept"
    (LEDGER_RECEIPT_UNKEYED=accept), for as long as such receipts may be read."""
    if unkeyed not in ("refuse", "accept"):
        raise ValueError(f"LEDGER_RECEIPT_UNKEYED={unkeyed!r} must be refuse or accept")
    RECEIPTS.update(key=key.encode() if key else None, unkeyed=unkeyed)


def digest_of(fields):
    """The integrity hash of a receipt's fields: keyed when LEDGER_RECEIPT_KEY is set."""
    text = json.dumps(fields, separators=(",", ":")).encode()
    if RECEIPTS["key"] is None:
        return hashlib.sha256(text).hexdigest()
    return KEYED + hmac.new(RECEIPTS["key"], text, hashlib.sha256).hexdigest()


def check_integrity(key, fields, integrity):
    """Damaged unless integrity is the hash of fields this process may accept (key_receipts)."""
    text = json.dumps(fields, separators=(",", ":")).encode()
    if integrity.startswith(KEYED):
        if RECEIPTS["key"] is None:
            why = "it was written with LEDGER_RECEIPT_KEY, which is not set here: set it"
        else:
            expected = KEYED + hmac.new(RECEIPTS["key"], text, hashlib.sha256).hexdigest()
            if hmac.compare_digest(expected, integrity):
                return
            why = "changed or forged, or written under another LEDGER_RECEIPT_KEY"
    elif RECEIPTS["key"] is not None and RECEIPTS["unkeyed"] != "accept":
        why = (
            "it has no LEDGER_RECEIPT_KEY hash (forged, or written before the key was set: "
            "LEDGER_RECEIPT_UNKEYED=accept reads those)"
        )
    elif hmac.compare_digest(hashlib.sha256(text).hexdigest(), integrity):
        return
    else:
        why = "changed or damaged since it was written"
    raise Damaged(f"the receipt of {key!r} does not match its integrity hash: {why}")


POSTGRES_SCHEMA = (
    *(
        statement.replace("REAL", "DOUBLE PRECISION").replace(
            "id INTEGER PRIMARY KEY", "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        )
        for statement in SCHEMA[:3]
    ),
    """CREATE OR REPLACE FUNCTION effect_receipts_are_kept() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'a receipt is never overwritten or deleted'; END $$""",
    """CREATE OR REPLACE TRIGGER receipts_are_kept BEFORE UPDATE OR DELETE ON effect_receipts
FOR EACH STATEMENT EXECUTE FUNCTION effect_receipts_are_kept()""",
)
