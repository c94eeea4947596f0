"""The outbox, and the relay that delivers its messages to the receiver at least once.

A node's only effect is a row in its own database; this process sends it.

    the node    Outbox.put(message_id, "/tickets", body): one INSERT ... ON CONFLICT DO NOTHING
                into the table `outbox`, in the workflow's database (CHECKPOINT_DB, beside the
                ledger's tables). A re-run of the node writes the same message id again, and
                that changes nothing.
    the relay   for each pending row: count the delivery, POST the body with the message id
                as its Idempotency-Key, then mark the row published, the receiver's answer kept.

The node sends nothing, so a kill anywhere in it leaves either no row (the resumed node writes
it) or the row (the resumed node finds it). The relay has a window of its own: killed after the
receiver answered and before the row is marked, it leaves the row pending, and the next relay
sends it again. The receiver must make that redelivery harmless: its keyed POST /tickets is an
inbox (the message id UNIQUE, the ticket made in the same transaction that records the id,
receiver.TicketStore.keyed), and it answers a redelivery with the first outcome (200, the same
ticket_id, created false).

One relay at a time delivers an outbox: a round holds the outbox's relay lock, which the
system drops when its holder dies (a lock on the file CHECKPOINT_DB-relay.lock on SQLite, a
Postgres advisory lock on the relay's session), so a second relay at the same time sends
nothing, and the next relay after a kill sends at once. (Not a row lock, FOR UPDATE SKIP
LOCKED: that lasts only as long as its transaction, and the delivery count must commit before
the POST leaves. Not a lease in the row: it outlives a killed relay, and the redelivery would
wait for it.) A row the relay cannot read (its payload not JSON, say) is quarantined: kept,
marked `quarantined` with the reason, listed by --show, said on stderr, counted by `labs/workers.py
metrics` (outbox_messages{state="quarantined"}), and skipped, so the rows after it are still
delivered.

What it does not buy: there is no transaction across the two databases. The relay still
delivers at least once, never exactly once; exactly one effect comes from the receiver keeping
the message id (for at least as long as a message can wait in the outbox: lab 14). A provider
you do not own gets the same redelivery: it needs to honour a key, or have a lookup, as before.

    python -m labs.relay              deliver what is pending, then again every RELAY_POLL_S, until
                                 SIGTERM (exit 0) or Ctrl-C (exit 130); a Postgres that goes
                                 away is waited for (reconnecting with backoff, as labs/workers.py)
    python -m labs.relay --once       deliver what is pending now and exit: 0, 1 when the receiver
                                 refused a message (a 4xx: kept as refused, not sent again; a
                                 404 or 405 is a wrong API_URL: the row stays pending) or one
                                 was quarantined, 3 when it could not be reached (the rows stay
                                 pending); 0 and a line when another relay is delivering
    python -m labs.relay --show       list the outbox, oldest first
    --crash-at before-publish    SIGKILL once the delivery is counted, before the POST
    --crash-at after-publish     SIGKILL after the receiver's answer, before the row is marked

Output is one JSON object per line, keys sorted, as workflow.py's.

Configuration (environment, read in main()):
    API_URL, CHECKPOINT_DB, API_TIMEOUT_S, API_ATTEMPTS   as workflow.py reads them
    RELAY_POLL_S     1 (seconds between the end of a round and the next, without --once)
    FAILPOINTS       "" (all off): before-publish, after-publish (see failpoints.py)
    TRACE            "" (off): otlp or a file, as workflow.py reads it (tracing.py)
"""

import fcntl
import json
import os
import random
import signal
import sqlite3
import sys
import threading
import time
import urllib.error
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NamedTuple

import checkpoints
import commandline
import effects
import exitcodes
import failpoints
import providers
import tracing
import workflow
from exitcodes import EXIT_HTTP_ERROR, EXIT_NO_ANSWER, EXIT_USAGE, UserError, emit
from failpoints import fail
from labs import inbox
from labs.threads import LABS, RELAY

POINTS = ("before-publish", "after-publish")  # this program's failpoints
COLUMNS = {
    "outbox": {"message_id", "destination", "payload", "state", "deliveries"}
}  # from the start
NOT_REFUSALS = (404, 405, 503)  # no such route (a wrong API_URL), or busy: not the message's fault
POLL_S = 1.0  # seconds from the end of one round to the next: a message written meanwhile
#               waits that long, plus the round it finds in progress
RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.5, 8.0  # backoff while Postgres is away (as labs/workers.py)
OUTBOX = """CREATE TABLE IF NOT EXISTS outbox (
    message_id TEXT PRIMARY KEY,  -- the Idempotency-Key the relay sends: one row per message
    destination TEXT NOT NULL,  -- the receiver's route, /tickets
    payload TEXT NOT NULL,  -- the body, canonical JSON
    thread TEXT,  -- the LangGraph thread whose node wrote it
    state TEXT NOT NULL DEFAULT 'pending',  -- pending, published, refused, quarantined
    deliveries INTEGER NOT NULL DEFAULT 0,  -- POSTs started, each counted before it leaves
    answer TEXT,  -- the receiver's answer (published), refusal (refused), or why the row
    --              cannot be read (quarantined), JSON
    created_at REAL NOT NULL,
    published_at REAL
)"""


class Message(NamedTuple):
    message_id: str
    destination: str
    payload: dict
    thread: str | None
    state: str
    deliveries: int
    answer: dict | None


class Outbox:
    """The outbox table in the workflow's database, on the ledger's connection (effects.Ledger
    for a SQLite file, effects.PostgresLedger for Postgres): the same place, the same SQL."""

    def __init__(self, ledger):
        self.ledger = ledger
        with ledger.transaction():
            if isinstance(ledger, effects.PostgresLedger):  # two creators at once: one waits
                ledger.sql("SELECT pg_advisory_xact_lock(hashtext('outbox schema'))")
                ledger.sql(OUTBOX.replace("REAL", "DOUBLE PRECISION"))
            else:
                ledger.sql(OUTBOX)

    def put(self, message_id, destination, payload, thread=None):
        """Record the message; True if this wrote it, False if it was there already (a re-run
        of the node). The same id for another message is effects.Conflict: nothing written."""
        body, _ = effects.request_hash(payload)
        with self.ledger.transaction():
            written = self.ledger.sql(
                "INSERT INTO outbox (message_id, destination, payload, thread, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING",
                (message_id, destination, body, thread, time.time()),
            ).rowcount
            if written:
                return True
            row = self.row(message_id)
        if (row["destination"], row["payload"]) != (destination, body):
            raise effects.Conflict(
                f"message id {message_id!r} is in the outbox for another message; "
                "use a new id for a new operation"
            )
        return False

    def pending(self):
        """The messages not yet published, oldest first (a row that cannot be read is left
        out: relay_once quarantines it)."""
        return [m for m in map(readable, self.rows("WHERE state = 'pending' ")) if m]

    def quarantine(self, message_id, why):
        """Mark a row that cannot be read: kept as it is, never sent, listed by --show."""
        self.settle(message_id, "quarantined", {"error": f"cannot be read: {why}"})

    def messages(self):
        """Every message, oldest first (a quarantined row as it is: its payload the text)."""
        return [message(row, as_text=row["state"] == "quarantined") for row in self.rows()]

    @contextmanager
    def round(self):
        """Hold the outbox's relay lock for one round: yields False when another relay holds
        it. The system drops it when the holder dies: a killed relay's row goes out next."""
        if isinstance(self.ledger, effects.PostgresLedger):
            lock = "hashtext('outbox relay')"
            held = self.ledger.sql(f"SELECT pg_try_advisory_lock({lock}) AS held").fetchone()
            held = held["held"]  # the ledger's rows are dicts
            try:
                yield held
            finally:
                if held:
                    with suppress(Exception):  # a lost session has dropped it already
                        self.ledger.sql(f"SELECT pg_advisory_unlock({lock})")
            return
        fd = os.open(f"{self.ledger.path}-relay.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # the lock goes with it

    def delivering(self, message_id):
        """Count a delivery, committed before its POST leaves: a redelivery shows as 2."""
        self.ledger.sql(
            "UPDATE outbox SET deliveries = deliveries + 1 WHERE message_id = ?", (message_id,)
        )

    def published(self, message_id, answer):
        """Mark it published with the receiver's answer; a row marked already stays as it is
        (two relays delivered it: the receiver answered both with one outcome)."""
        self.settle(message_id, "published", answer)

    def refused(self, message_id, refusal):
        """The receiver refused it (a 4xx: it made nothing, and would refuse it again)."""
        self.settle(message_id, "refused", refusal)

    # helpers

    def settle(self, message_id, state, answer):
        self.ledger.sql(
            "UPDATE outbox SET state = ?, answer = ?, published_at = ? "
            "WHERE message_id = ? AND state = 'pending'",
            (state, json.dumps(answer, sort_keys=True), time.time(), message_id),
        )

    def row(self, message_id):
        return self.ledger.sql(
            "SELECT * FROM outbox WHERE message_id = ?", (message_id,)
        ).fetchone()

    def rows(self, where=""):
        query = f"SELECT * FROM outbox {where}ORDER BY created_at, message_id"
        return self.ledger.sql(query).fetchall()


def another_start(held):
    """The outbox start that writes a message when the outbox holds `held`: its defaults for the
    first; then a thread and an operation of its own (the lesson's are taken)."""
    if not held:
        return "outbox start"
    n = held + 1
    return f"outbox start --thread outbox-{n} --operation case-outbox-{n}:open-ticket:v1"


def readable(row):
    """message(row), or None when it cannot be read."""
    try:
        return message(row)
    except ValueError:
        return None


def message(row, as_text=False):
    """A row as a Message; ValueError when its payload or answer is not the JSON we wrote."""
    payload = row["payload"] if as_text else json.loads(row["payload"])
    if not as_text and not isinstance(payload, dict):
        raise ValueError("its payload is not a JSON object")
    answer = None if row["answer"] is None else json.loads(row["answer"])
    return Message(
        row["message_id"],
        row["destination"],
        payload,
        row["thread"],
        row["state"],
        row["deliveries"],
        answer,
    )


@contextmanager
def open_outbox(target):
    """The outbox in CHECKPOINT_DB (a SQLite path or a postgresql:// URL), closed on exit."""
    with effects.open_ledger(target) as ledger:
        yield Outbox(ledger)


def relay_once(outbox, client):
    """Deliver every pending message once: [(message_id, "published" | "refused")], or None
    when another relay holds the outbox (it is delivering them)."""
    with outbox.round() as mine:
        if not mine:
            return None
        done = []
        for row in outbox.rows("WHERE state = 'pending' "):
            try:
                each = message(row)
            except ValueError as error:  # one bad row must not stop the ones after it
                outbox.quarantine(row["message_id"], error)
                print(
                    f"labs.relay: message {row['message_id']!r} quarantined: it cannot be read "
                    f"({error}); kept in the outbox (--show lists it), never sent",
                    file=sys.stderr,
                    flush=True,
                )
                done.append((row["message_id"], "quarantined"))
                continue
            done.append((each.message_id, deliver(outbox, each, client)))
        return done


def deliver(outbox, message, client):
    """POST one message with its id as the key; mark it with the receiver's answer."""
    outbox.delivering(message.message_id)
    fail("before-publish")
    try:
        answer = client.call(message.destination, message.payload, message.message_id)
    except urllib.error.HTTPError as error:
        if error.code in NOT_REFUSALS or (refusal := providers.refusal(error)) is None:
            raise  # busy, a wrong API_URL, or not the receiver: the row stays pending
        outbox.refused(message.message_id, refusal)
        emit("refused", message_id=message.message_id, refusal=refusal)
        return "refused"
    emit("answered", message_id=message.message_id, **answer)
    # The receiver has committed it and the outbox still says pending: a relay killed here
    # (the relay's own window) leaves the row for the next one, which sends it again with the
    # same key, and the receiver answers with what the first delivery made.
    fail("after-publish")
    outbox.published(message.message_id, answer)
    return "published"


def serve(outbox, client, poll_s, stopping):
    """Rounds of relay_once until stopping is set; a failed round is one line on stderr and
    the next round tries again (its rows stayed pending). A lost Postgres session is raised
    (run_until_stopped reconnects)."""
    while not stopping.is_set():
        try:
            relay_once(outbox, client)
        except (UserError, urllib.error.HTTPError, sqlite3.OperationalError) as error:
            print(f"labs.relay: {describe(error)}; trying again", file=sys.stderr, flush=True)
        stopping.wait(poll_s)


def main(argv=None, environ=None):
    """The relay's CLI; returns the exit code."""
    parser = commandline.Parser(prog="labs.relay", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--once", action="store_true", help="deliver what is pending, then exit")
    what.add_argument("--show", action="store_true", help="list the outbox")
    parser.add_argument("--crash-at", choices=POINTS, help="where the relay dies (SIGKILL)")
    args = parser.parse_args(argv)
    checkpoints.own_tables({**inbox.COLUMNS, **COLUMNS})  # the lab's, beside the checkpoints
    environ, settings = os.environ if environ is None else environ, workflow.Settings()
    try:
        settings = workflow.Settings.from_environ(environ)
        poll_s = providers.number(environ, "RELAY_POLL_S", POLL_S, float)
        try:
            failpoints.configure(settings.failpoints, known=POINTS, announce=exitcodes.announce)
        except failpoints.FailpointSpecError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        try:  # TRACE: each delivery's POST a span with the message id as its key
            tracing.start(settings.trace, "relay")
        except tracing.TracingError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        points = {args.crash_at: "kill"} if args.crash_at else {}
        if not (args.show or args.once):
            with failpoints.scoped(points):
                return run_until_stopped(settings.checkpoint_db, settings.client(), poll_s)
        with failpoints.scoped(points), opened(settings.checkpoint_db) as outbox:
            if args.show:
                emit("outbox", messages=[shown(m) for m in outbox.messages()])
                return 0
            if args.once:
                done = relay_once(outbox, settings.client())
                if done is None:
                    emit("relayed", pending=len(outbox.pending()), published=0)
                    print(
                        "labs.relay: another relay is delivering this outbox now (one at a time): "
                        "this one sent nothing",
                        file=sys.stderr,
                    )
                    return 0
                published = sum(how == "published" for _, how in done)
                emit("relayed", pending=len(outbox.pending()), published=published)
                if not done:  # relay before any outbox start, or everything published
                    print(
                        f"labs.relay: nothing pending ({RELAY('--show')} lists the outbox; "
                        f"{LABS(another_start(len(outbox.rows())))} writes a message)",
                        file=sys.stderr,
                    )
                return EXIT_HTTP_ERROR if len(done) > published else 0
    except (UserError, urllib.error.HTTPError) as error:
        print(f"labs.relay: {describe(error)}", file=sys.stderr)
        return getattr(error, "exit_code", EXIT_HTTP_ERROR)
    except sqlite3.DatabaseError as error:
        print(f"labs.relay: CHECKPOINT_DB {settings.checkpoint_db!r}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(
            "labs.relay: interrupted; the message in flight, if any, stays pending", file=sys.stderr
        )
        return exitcodes.EXIT_INTERRUPTED


# helpers


def run_until_stopped(checkpoint_db, client, poll_s):
    """serve() until SIGTERM (exit 0: the message in flight is finished first). A Postgres
    that goes away (a restart) is reconnected to, with bounded exponential backoff and jitter,
    as labs/workers.py does; the first open failing is the command's error."""
    stopping, began, lost = threading.Event(), False, None
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        delay = RECONNECT_FIRST_S
        while not stopping.is_set():
            try:
                with opened(checkpoint_db) as outbox:
                    if lost is not None:
                        back = f"CHECKPOINT_DB is back after {time.monotonic() - lost:.1f} s"
                        print(f"labs.relay: {back}", file=sys.stderr, flush=True)
                        lost, delay = None, RECONNECT_FIRST_S
                    if not began:  # a loop that prints nothing until work comes: say so
                        print(
                            f"labs.relay: delivering the outbox every {poll_s:g} s until Ctrl-C "
                            "or SIGTERM (--once delivers what is pending, then exits)",
                            file=sys.stderr,
                            flush=True,
                        )
                    began = True
                    serve(outbox, client, poll_s, stopping)
            except UserError as error:  # opened(): Postgres is away (or was, mid-round)
                if not began or error.exit_code != EXIT_NO_ANSWER:
                    raise
                if lost is None:
                    lost = time.monotonic()
                    print(
                        f"labs.relay: lost the database ({error}); reconnecting",
                        file=sys.stderr,
                        flush=True,
                    )
                stopping.wait(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, RECONNECT_MAX_S)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


@contextmanager
def opened(checkpoint_db):
    """open_outbox, with workflow.py's checks: a SQLite file that is the workflow's (or new,
    its folder made), a Postgres that answers."""
    if not checkpoints.is_postgres(checkpoint_db):
        path = Path(checkpoint_db)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
        checkpoints.require_checkpoint_file(path)
        with open_outbox(checkpoint_db) as outbox:
            yield outbox
        return
    import psycopg

    try:
        with open_outbox(checkpoint_db) as outbox:
            yield outbox
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[0]
        raise UserError(f"cannot open CHECKPOINT_DB ({reason})", EXIT_NO_ANSWER) from None


def shown(message):
    return {k: v for k, v in message._asdict().items() if v is not None}


def describe(error):
    if isinstance(error, urllib.error.HTTPError):
        check = "; check API_URL" if error.code in (404, 405) else ""
        return f"{error.url} answered {error.code}{check}; the message stays pending"
    return str(error)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
