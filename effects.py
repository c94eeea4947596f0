"""The effect ledger: write down what you are about to do to the outside world before doing it.

A node that changes another system (opens a ticket, charges a card, sends an email) calls
Effect.perform instead of the provider. Each effect is one row, keyed by its idempotency key, in
the workflow's own database, and it moves through these states:

    requested -> confirmed   the answer came back: a receipt is kept, never overwritten
              -> failed      the provider refused it (a business answer: nothing was done)
              -> unknown     sent, and no answer: done or not, nobody here can tell
              -> released    nothing was done: the connection was refused (the Effect's
                             not_sent decides what proves it), or the provider answered with an
                             error that did nothing (a wrong address's 404): send again

`requested` is committed before the request leaves. A process that dies after the provider
committed and before the answer was recorded (the crash window) leaves that row behind, and the
next attempt does not send blindly:

    confirmed            the receipt's answer is returned; the provider is not called at all
    requested, unknown   the provider is asked by key (Effect.lookup) and what it made is adopted.
                         Sent again only on evidence: the provider honours the key (keyed: a
                         resend is answered with the first result), or a lookup finds nothing
                         settle_s after the last send (the provider may commit late). Else the
                         row stays unknown and Unsettled names the command to look with; a
                         person settles it (Ledger.settle, reconcile)
    another request under the same key: Conflict, never a second effect
    a live process is performing it   InFlight: it holds the key's lock (Postgres: an advisory
                         lock; SQLite: an fcntl lock on the file's -lease file), which the
                         operating system drops when the process dies

The ledger's row and LangGraph's checkpoint are two commits, even in one SQLite file. The ledger
has a connection of its own; so has SqliteSaver (SqliteSaver.from_conn_string opens one, and
SqliteSaver.cursor commits on it: langgraph/checkpoint/sqlite/__init__.py), and LangGraph hands
each node's writes to it from a background executor (PregelLoop.put_writes calls self.submit:
langgraph/pregel/_loop.py). PostgresSaver's connection is autocommit (PostgresSaver.
from_conn_string, langgraph/checkpoint/postgres/__init__.py; plumbing.open_postgres does the
same), the ledger's another. A crash between the receipt and the checkpoint (failpoint
after-receipt, which perform passes once it has kept a receipt it did not have, so a replay never
meets it; or a node's own after-ack) re-runs the node; the node finds the receipt and the provider
hears nothing. A crash between the provider's answer and the receipt (after-send) leaves
`requested`: the lookup's case. So does a crash after the intent and before the request left
(after-intent), which nothing here can tell from one after it left: the same evidence decides.

Standard library only, and psycopg for a Postgres ledger (open_ledger imports it only for a
postgresql:// URL), OpenTelemetry only with TRACE set; importing this module changes nothing.
"""

import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NamedTuple

import tracing
from failpoints import fail

STATES = ("requested", "confirmed", "failed", "unknown", "released")
TABLES = ("effects", "effect_transitions", "effect_receipts", "effect_extras")
OPENING = threading.RLock()  # a Ledger's first connection in a process is opened under it
LEASES = {}  # this process's lease files: path -> (descriptor, {key: the Ledger holding it})
SETTLED = ("confirmed", "failed")  # final: a later attempt returns (or raises) what they say
OPEN = ("requested", "unknown")  # a request may be out there: never send blindly
SETTLE_S = 60.0  # an Effect's default settle_s: a provider commits what it accepted within it
LEASE_S = 300.0  # a SQLite lease's default length (LEDGER_LEASE_S in workflow.main): past it a
#   performer still alive (a request hung past every timeout) no longer keeps others out; its
#   late answer still becomes the receipt, or an extra (effect_extras) if another made one too
KEYED = "hmac-sha256:"  # how a receipt's integrity hash made with LEDGER_RECEIPT_KEY begins
RECEIPTS = {"key": None, "unkeyed": "refuse"}  # key_receipts() sets them, from a program's main()


@dataclasses.dataclass(frozen=True)
class Effect:
    """One kind of effect, declared once: what it sends, how it is looked up, what it answers.

    send(client, request, key) -> the provider's answer (a dict); not_sent(error) is true for
    an error that proves nothing was done (a refused connection, an answer that did nothing);
    refused(error) -> the provider's refusal (a dict) when the error is a business "no"
    (nothing was done, and the key is spent), else None. Any other error, "in progress" (the
    IETF Idempotency-Key draft's 409) included, leaves the effect unknown. A provider declares
    these once for every effect sent to it (plumbing.Provider, plumbing.Effect).
    lookup(client, key) -> the answer the key made, or None when it made nothing; None (the
    attribute) for a provider that offers no lookup (an email, an SMS).
    external_id(answer) -> the provider's id for what it made, kept in the receipt;
    answer_of(external_id) -> the answer a person's id stands for, in the shape the node reads
    (reconcile --confirmed KEY=ID, for a provider without lookup); None: a person cannot.
    keyed: the provider honours the key (a resend under it is answered with the first result),
    so a request whose answer was lost may be sent again. The default, False, is the safe one:
    the ledger never sends it twice on its own.
    settle_s: how long the provider may take to commit what it accepted; a lookup that finds
    nothing sooner after the last send is no proof (SETTLE_S by default).
    look_with: the command (or address) that shows what the provider holds, for the line that
    asks a person to look ({key} is filled in).
    """

    name: str
    send: Callable
    external_id: Callable
    lookup: Callable | None = None
    not_sent: Callable = lambda error: False
    refused: Callable = lambda error: None
    keyed: bool = False
    settle_s: float = None  # SETTLE_S
    answer_of: Callable | None = None
    look_with: str = "the provider's own records"

    def perform(self, ledger, key, request, client, thread=None):
        """The effect's Outcome, made at most once per key: from the receipt when there is one."""
        with ledger.performing(key):  # InFlight while another live process performs key
            # TRACE: a span with the key, how it was made and the ledger's state (tracing.py)
            with tracing.effect(self.name, key, ledger) as traced:
                done = traced(self.perform_claimed(ledger, key, request, client, thread))
        if done.how != "receipt":  # a receipt kept just now, the node not returned: a kill here
            fail("after-receipt")  # leaves it for the re-run node (a replay does not come here)
        return done

    def perform_claimed(self, ledger, key, request, client, thread=None):
        record = ledger.claim(key, self.name, request, thread)
        if record.state == "confirmed":
            return Outcome(record.answer, "receipt")  # a replay: the provider is not called
        if record.state == "failed":
            raise Refused(key, record.refusal)
        if record.reopened:  # an earlier attempt's request may be out there: evidence first
            if (found := self.look_up(ledger, key, client)) is not None:
                return found  # it had taken effect: adopted
            if (why := self.may_resend(record)) is None:
                ledger.move(key, "unknown", "no evidence it was not sent: a person must look")
                raise Unsettled(key, self, record.since_sent_s)
            ledger.move(key, "requested", f"sent again: {why}")
        fail("after-intent")  # the intent committed, nothing sent yet: a kill leaves requested
        sent = time.monotonic()  # the stop below says how long after it the lookup found nothing
        for again in (False, True):  # a keyed provider's lost answer: once more under the key
            try:
                answer = self.send(client, request, key)
                break
            except Exception as error:
                if self.not_sent(error):  # only proof: the request never left, or did nothing
                    ledger.move(key, "released", f"not done: {error}")
                    raise
                if (refusal := self.refused(error)) is not None:  # a business no: final
                    ledger.refuse(key, refusal)
                    raise Refused(key, refusal) from error
                # Anything else (a timeout, a reset, a 5xx, "in progress"): it may have been
                # made, or may still be. Unknown, until a lookup or a person says.
                ledger.move(key, "unknown", f"no answer: {type(error).__name__}: {error}")
                if (found := self.look_up(ledger, key, client)) is not None:
                    return found  # it committed before the answer was lost
                if not self.keyed or again:  # a resend now could be a second effect: stop
                    raise Unsettled(key, self, time.monotonic() - sent, error) from error
                # The provider honours the key: the same request under it gets the first result
                # (or "in progress" while the first is still being processed: unknown again).
                ledger.move(key, "requested", "sent again: the provider honours the key")
            except BaseException:  # Ctrl-C, a drain: the request may have left
                ledger.move(key, "unknown", "interrupted while the request was out")
                raise
        # The provider has committed it and the ledger does not know yet: the window a kill
        # here leaves is closed by the lookup of the next attempt (or a person, without one).
        fail("after-send")
        return Outcome(ledger.confirm(key, answer, self.external_id(answer), "answered"), "sent")

    def look_up(self, ledger, key, client):
        """The Outcome adopted from the provider's answer under key, or None: it holds nothing
        (or cannot be asked)."""
        if self.lookup is None or (found := self.lookup(client, key)) is None:
            return None
        return Outcome(
            ledger.confirm(key, found, self.external_id(found), "adopted by lookup"), "adopted"
        )

    def may_resend(self, record):
        """Why the evidence allows a resend of record (requested or unknown, nothing found by
        lookup), or None: it may have been made, and nobody can tell yet."""
        if self.keyed:
            return "the provider honours the key"
        if self.lookup is not None and record.since_sent_s >= self.settled_after_s:
            return f"the lookup found nothing {record.since_sent_s:.1f} s after the last send"
        return None

    @property
    def settled_after_s(self):
        return SETTLE_S if self.settle_s is None else self.settle_s


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
                record = ledger.get(record.key)  # as it is now that nobody else performs it
                if record.state in OPEN:
                    done.append(reconcile_one(ledger, record, effects.get(record.effect), client))
        except InFlight:
            done.append((record, "in flight"))
    return done


def reconcile_one(ledger, record, effect, client):
    """(record, what happened) for one open effect, asked by key where it has a lookup. Nothing
    found is proof only settle_s after the last send (or for a keyed provider, which answers a
    resend with the first result): released then, else it stays open."""
    if effect is None or effect.lookup is None:
        if record.state != "unknown":
            ledger.move(record.key, "unknown", "reconcile: no lookup, a person must settle it")
        return record, "needs a person"
    if (found := effect.lookup(client, record.key)) is not None:
        ledger.confirm(record.key, found, effect.external_id(found), "reconcile: adopted")
        return record, "confirmed"
    if (why := effect.may_resend(record)) is None:
        if record.state != "unknown":
            ledger.move(record.key, "unknown", "reconcile: nothing found yet, may commit late")
        return record, "too soon to tell"
    ledger.move(record.key, "released", f"reconcile: nothing under it ({why})")
    return record, "not sent"


class LedgerError(Exception):
    """A ledger refusal: one line that says what to do."""


class Conflict(LedgerError):
    """The key was claimed for another request: a new operation needs a new key."""


class Unsettled(LedgerError):
    """An earlier attempt may have made the effect, and nothing here can tell yet."""

    def __init__(self, key, effect, since_sent_s=0.0, error=None):
        look = effect.look_with.format(key=key)
        said = f" ({type(error).__name__}: {error})" if error else ""
        if effect.keyed:  # "in progress", or no answer: the key gets the first result later
            why = f"{where(effect, 'its provider')} honours the key and has not given its result"
            why += f" yet{said}"
            then = (
                f"resume once {effect.settled_after_s:g} s have passed since the last send (the "
                "provider answers the key with its first result)"
            )
        elif effect.lookup is None:
            why = f"{where(effect, 'its provider')} has no lookup{said}"
            then = (
                f"reconcile --confirmed {key}=ID if it happened, --not-sent {key} if it did not "
                f"(taken {effect.settled_after_s:g} s after the last send)"
            )
        else:
            who = where(effect, "the provider")
            why = (
                f"the lookup found nothing {since_sent_s:.1f} s after the last send, and {who} "
                f"may take {effect.settled_after_s:g} s to commit"
            )
            then = "reconcile (it asks the provider again)"
        super().__init__(
            f"effect {effect.name} {key!r} may have happened (sent, and no answer was recorded) "
            f"and {why}: look with {look}, then {then}"
        )
        self.key = key


def where(effect, otherwise):
    """How a line names an effect's provider: the name it declares (plumbing.Effect), else
    otherwise ("the provider")."""
    name = getattr(effect, "provider", "")
    return str(getattr(name, "name", name) or otherwise)


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
    since_sent_s: float = 0.0  # since the last request under the key may have left


class Ledger:
    """The effects of one workflow database (a SQLite file or a Postgres connection)."""

    def claim(self, key, effect, request, thread=None):
        """Record the intent before the request leaves: a Record in state requested, or the
        row the key already has. One transaction under a write lock (SQLite BEGIN IMMEDIATE;
        Postgres INSERT ... ON CONFLICT, then the row locked FOR UPDATE), so two attempts
        cannot both take a fresh claim. The row names its owner and lease (owner, lease_until)."""
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
            if row["request_hash"] != digest or row["effect"] != effect:
                raise Conflict(
                    f"key {key!r} was claimed for another {row['effect']} request; "
                    "use a new key for a new operation"
                )
            if row["state"] == "released":
                self.move_locked(key, row["state"], "requested", "claimed")
                return Record(key, effect, "requested", digest, "claimed")
            if row["state"] in OPEN:
                self.sql(
                    "UPDATE effects SET owner = ?, lease_until = ? WHERE key = ?",
                    (self.owner, now + self.lease_s, key),
                )
            return self.record(row, reopened=row["state"] in OPEN)

    @contextmanager
    def performing(self, key):
        """Held while this process performs key: the key's lock (an fcntl lock on one byte of
        the file's -lease file, the byte the key's hash names), which the operating system
        drops when its process dies, so the resume after a kill takes it at once, in another
        container on the same volume too. Taken by another live process: InFlight, unless its
        lease on an open row (lease_until, LEASE_S after its claim) ran out: then this process
        goes on, the evidence rule decides what it sends, and the late holder's answer becomes
        the receipt or an extra."""
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
        )


class PostgresLedger(Ledger):
    """The same ledger in Postgres, on a connection the caller opened (psycopg 3, dict rows).

    A claim inserts with ON CONFLICT DO NOTHING and then locks the row FOR UPDATE: a SELECT ...
    FOR UPDATE alone locks no row that does not exist yet, so two workers could both miss it."""

    db = None  # the caller's connection, not opened here

    def __init__(self, conn, lease_s=LEASE_S):
        self.db, self.lease_s = conn, lease_s  # the lease: its owner shown; the lock decides
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        with self.transaction():
            self.sql("SELECT pg_advisory_xact_lock(hashtext('effect ledger schema'))")
            for statement in POSTGRES_SCHEMA:
                self.sql(statement)
            for column, kind in ADDED_COLUMNS:
                kind = kind.replace("REAL", "DOUBLE PRECISION")
                self.sql(f"ALTER TABLE effects ADD COLUMN IF NOT EXISTS {column} {kind}")

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
def open_ledger(target, lease_s=LEASE_S):
    """The ledger in the workflow's own database: a SQLite file, or a postgresql:// URL (its own
    autocommit connection, psycopg 3). Closed on exit."""
    if not str(target).startswith(("postgresql://", "postgres://")):
        ledger = Ledger(target, lease_s=lease_s)
    else:
        import psycopg
        from psycopg.rows import dict_row

        conn = psycopg.connect(target, autocommit=True, row_factory=dict_row)
        ledger = PostgresLedger(conn, lease_s)
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
    """CREATE TABLE IF NOT EXISTS effect_extras (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL REFERENCES effects (key),
    external_id TEXT NOT NULL,  -- a second thing the provider made under the key: undo it
    answer TEXT NOT NULL,
    how TEXT NOT NULL,
    at REAL NOT NULL
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


ADDED_COLUMNS = (  # added to effects since it was first made: ALTER TABLE where missing
    ("sent_at", "REAL"),  # when the last request under the key may have left
    ("owner", "TEXT"),  # the lease's holder: host:pid:ledger
    ("lease_until", "REAL"),  # past it, a holder still alive keeps nobody out
)

POSTGRES_SCHEMA = (
    *(
        statement.replace("REAL", "DOUBLE PRECISION").replace(
            "id INTEGER PRIMARY KEY", "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        )
        for statement in SCHEMA[:4]
    ),
    """CREATE OR REPLACE FUNCTION effect_receipts_are_kept() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'a receipt is never overwritten or deleted'; END $$""",
    """CREATE OR REPLACE TRIGGER receipts_are_kept BEFORE UPDATE OR DELETE ON effect_receipts
FOR EACH STATEMENT EXECUTE FUNCTION effect_receipts_are_kept()""",
)
