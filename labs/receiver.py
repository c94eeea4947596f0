"""The lab's receiver: api.py's ticket service, and what the lessons add to it.

api.py is the core (tickets, a UNIQUE key, one transaction committed before the answer, a
lookup by key); the starter takes it unchanged. This file extends it, by subclassing only
(api.py never imports this one), with what labs 06, 13 and 15 need:

    GET  /refunds[?key=KEY]      200 {"refunds": [{"refund_id", "ticket_id", "key"}]}
    POST /refunds                body {"ticket_id": N}, optional Idempotency-Key: a refund of
                                 ticket N (a saga's compensation), keyed like a ticket: 201,
                                 200, 409 as for a ticket; 404 no ticket N. Without a key every
                                 request is one more refund.
    GET  /reservations[?key=KEY] 200 {"reservations": [{"reservation_id", "key", "ticket_id",
                                 "seats"}]}: the saga's lookup by key
    POST /reservations           body {"ticket_id": N, "seats": S}, optional Idempotency-Key:
                                 201, 200, 409 as above; 404 no ticket N; 409 {"code":
                                 "no_capacity"}: more seats than the SEATS left, nothing reserved
    GET  /payments[?reference=R][&settled=1]  200 {"payments": [{"payment_id", "reference",
                                 "amount"}], "pending"}: what is committed (under reference R);
                                 pending: accepted, not committed yet; settled=1 first waits
                                 (at most SETTLE_WAIT_S) until none is pending (lab 15)
    POST /payments               body {"reference": "R", "amount": N}: 201 {"payment_id",
                                 "reference", "amount"}, lab 15's stand-in for a card provider:
                                 no key read, so every request is one more charge; failpoint
                                 payment-commit=sleep(S) commits it S seconds late
    GET  /messages               200 {"messages": [{"message_id", "to", "text"}]}
    POST /messages               body {"to": "...", "text": "..."}: 201 {"message_id"}, lab 15's
                                 stand-in for an email service: no key read, no lookup, so
                                 every request is one more message
    POST /webhooks[?wait=S]      body {"url": "http://HOST:PORT/PATH"}: the one subscriber to
                                 tickets' progress (it replaces the last), then a delivery
                                 round of every event not yet delivered: 200 {"delivered",
                                 "pending"} (lab 18); 400 a url that is not plain http(s),
                                 whose host one parser could read another way than the
                                 sender (webhooks.parse_url), or whose host is not in
                                 WEBHOOK_ALLOWED_HOSTS: not stored, the subscriber stays
    POST /progress[?wait=S]      body {"ticket_id": N, "statuses": [...]} (opened, in_progress,
                                 resolved), optional Idempotency-Key: each status that
                                 changes the ticket's (not the one it has) one event
                                 {"event_id", "ticket_id", "status", "version"} (version: 1,
                                 2, ... per ticket), committed, then a delivery round:
                                 200 {"events", "delivered", "pending"}; 404 no
                                 ticket N. The same key and body again: the events it made
                                 the first time, none made now; another body: 409
A webhook is a POST of one event's JSON to the subscriber, signed as Standard Webhooks says
(httpguard.signed_headers: webhook-id is the event id), delivered at least once by the
receiver's one sender thread (webhooks.Deliveries), apart from the requests: an answer that is
not a 2xx (or none, or a redirect, which is never followed) is retried WEBHOOK_ATTEMPTS times,
WEBHOOK_RETRY_S apart; an event still not delivered then stays pending, and so do the ones
after it, until the next POST /webhooks or /progress asks for a round. One round at a time, in
event order. A request answers once its own write is committed ("delivered": 0), or, with
?wait=S (whole seconds, at most 60), once the round it asked for is over: what that round
delivered and what is still pending. A subscriber that never answers delays only the
deliveries; a committed /progress answers 200 whatever its round met.
The routes of api.py (/health, /metrics, /tickets) answer as it says; /metrics also counts
refunds and reservations created and messages sent. A tickets table made before created_at was
kept (an older lab's file) gets the column when the receiver opens it.

Run it as `python -m labs.receiver` (compose.yaml's api service and every guide do); its settings
are
api.py's, two of its own (below), and FAILPOINTS knows more points (below).
"""

import json
import os
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import api
import httpguard
from api import ConfigError, parse_key, parse_object
from failpoints import fail
from httpguard import ClientError
from labs import webhooks

POINTS = (
    *api.POINTS,
    "before-answer",
    "before-body",
    "redeliver",
    "reorder",
    "payment-commit",
)  # this program's failpoints
FAILPOINTS_ADDED = """\
                                 labs/receiver.py adds two (lab 06): before-answer=drop-answer
                                 commits,
                                 then hangs up unanswered; before-body=pause(PATH) writes the
                                 status line and headers (the answer is counted already), then
                                 holds the body until a test releases PATH (failpoints.unpause);
                                 both once for each Failpoint-Token request header value.
                                 And two for webhooks (lab 18): redeliver=on delivers each
                                 event a second time after its 2xx; reorder=on delivers the
                                 pending events newest first.
                                 And one for payments (lab 15): payment-commit=sleep(S) holds
                                 each POST /payments S seconds before its commit.
    WEBHOOK_ALLOWED_HOSTS        localhost,127.0.0.0/8,::1: the hosts a subscriber's url may
                                 name, comma-separated host names, IP addresses and networks
                                 (CIDR). A receiver that calls any url it is given lets its
                                 callers reach whatever it can reach (SSRF)
    WEBHOOK_SECRET               the lab's own (httpguard.DEFAULT_WEBHOOK_SECRET, public): the
                                 webhooks' signing secret, whsec_ and the base64 of at least
                                 24 random bytes, as Standard Webhooks has it; labs hooks
                                 checks with the same setting. Several, space-separated,
                                 while one replaces another: each delivery is signed with
                                 each, and hooks accepts any
"""
ALLOWED_HOSTS = "localhost,127.0.0.0/8,::1"  # WEBHOOK_ALLOWED_HOSTS unless set: loopback
TOKEN_HEADER = "Failpoint-Token"  # before-answer and before-body fire once for each value
BUSY_TIMEOUT_S = api.BUSY_TIMEOUT_S  # the core's: workflow.py sizes its 503 retries by it
SEATS = 10  # seats for all reservations together: few, so a caller can ask for more than are left
SAGA_SCHEMA = (  # a refund undoes a ticket; a reservation may find no seats left
    """CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,
    payload TEXT NOT NULL,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    created_at REAL
)""",
    """CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,
    payload TEXT NOT NULL,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    seats INTEGER NOT NULL,
    created_at REAL
)""",
)
MESSAGES_SCHEMA = """CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,  -- one row per POST /messages: this provider keeps no key
    recipient TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL
)"""  # lab 15's stand-in for an email or SMS service: irreversible, no key, no lookup
PAYMENTS_SCHEMA = """CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY,  -- one row per POST /payments: this provider reads no key
    reference TEXT NOT NULL,  -- the caller's, for the lookup: not unique, a repeat is a charge
    amount INTEGER NOT NULL,
    created_at REAL NOT NULL
)"""  # lab 15's stand-in for a card provider: no key, a lookup by reference, commits late
SETTLE_WAIT_S = 4  # seconds GET /payments?settled=1 waits at most for pending charges (less
#                   than a client's default API_TIMEOUT_S, 5: an answer, with what is pending)
MAX_AMOUNT = 10**9  # the largest charge, in cents
WEBHOOK_SCHEMA = (  # lab 18: the provider's side of a webhook
    """CREATE TABLE IF NOT EXISTS webhook_events (
    id INTEGER PRIMARY KEY,  -- the event id is evt_ID
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    status TEXT NOT NULL,
    version INTEGER NOT NULL,  -- per ticket: 1, 2, ...
    delivered_at REAL,  -- NULL: pending (no 2xx yet)
    created_at REAL NOT NULL,
    UNIQUE (ticket_id, version)
)""",
    """CREATE TABLE IF NOT EXISTS webhook_subscribers (
    id INTEGER PRIMARY KEY CHECK (id = 1),  -- one subscriber: the workflow
    url TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS progress_requests (
    id INTEGER PRIMARY KEY,  -- one POST /progress
    operation_key TEXT UNIQUE,  -- its Idempotency-Key (NULL: sent without one)
    payload TEXT NOT NULL,  -- canonical JSON of its body
    events TEXT NOT NULL,  -- the events it made, JSON: a repeat is answered with them
    created_at REAL
)""",
)
STATUSES = ("opened", "in_progress", "resolved")  # a ticket's progress, as webhooks tell it
OLDER_TICKETS = {"id", "operation_key", "payload"}  # a tickets table before created_at was kept
COUNTERS = {  # api.COUNTERS, and this file's routes' own
    "tickets_created": api.COUNTERS["tickets_created"],
    "refunds_created": "POST /refunds that created a refund (answered 201).",
    "reservations_created": "POST /reservations that created a reservation (answered 201).",
    "idempotent_replays": api.COUNTERS["idempotent_replays"],
    "key_conflicts": api.COUNTERS["key_conflicts"],
    "messages_sent": "POST /messages: each one a message (this provider takes no key).",
    "webhooks_delivered": "Webhook deliveries the subscriber answered with a 2xx.",
    "webhooks_failed": "Webhook deliveries that got no 2xx (each is retried).",
    "keys_pruned": api.COUNTERS["keys_pruned"],
}


class LabStore(api.TicketStore):
    """The core's ticket store, with the saga's refunds and reservations and lab 15's messages."""

    SCHEMA = (*api.TicketStore.SCHEMA, *SAGA_SCHEMA, MESSAGES_SCHEMA, *WEBHOOK_SCHEMA)
    COLUMNS = {
        **api.TicketStore.COLUMNS,
        "refunds": {"id", "operation_key", "payload", "ticket_id", "created_at"},
        "reservations": {"id", "operation_key", "payload", "ticket_id", "seats", "created_at"},
        "messages": {"id", "recipient", "text", "created_at"},
        "webhook_events": {"id", "ticket_id", "status", "version", "delivered_at", "created_at"},
        "webhook_subscribers": {"id", "url"},
        "progress_requests": {"id", "operation_key", "payload", "events", "created_at"},
        "payments": {"id", "reference", "amount", "created_at"},
    }
    KEYED = {
        **api.TicketStore.KEYED,
        "refunds": "refund",
        "reservations": "reservation",
        "progress_requests": "progress request",
    }
    SCHEMA = (*SCHEMA, PAYMENTS_SCHEMA)  # lab 15's payments

    def refund(self, key, canonical, ticket_id):
        """A refund of ticket_id, keyed like a ticket: (refund_id, created); 404 if no ticket.

        Without a key every call is one more refund: the receiver cannot tell a retry from a
        second refund, just as it cannot for a ticket."""
        return self.keyed(
            "refunds", key, canonical, {"ticket_id": ticket_id}, lambda: self.need(ticket_id)
        )

    def reserve(self, key, canonical, ticket_id, seats):
        """Seats for ticket_id: (reservation_id, created); 409 when fewer than seats are left."""

        def seats_left():
            self.need(ticket_id)
            taken = self.db.execute("SELECT TOTAL(seats) FROM reservations").fetchone()[0]
            if seats > (left := SEATS - int(taken)):
                raise ClientError(
                    409,
                    f"no capacity: {seats} seats asked for, {left} of {SEATS} left",
                    code="no_capacity",
                )

        columns = {"ticket_id": ticket_id, "seats": seats}
        return self.keyed("reservations", key, canonical, columns, seats_left)

    def send_message(self, recipient, text):
        """One more message, whatever was sent before: message_id. Like an email service, this
        provider takes no Idempotency-Key and offers no lookup, so a repeat is a second message."""
        with self.transaction():
            return self.db.execute(
                "INSERT INTO messages (recipient, text, created_at) VALUES (?, ?, ?)",
                (recipient, text, time.time()),
            ).lastrowid

    def messages(self):
        """Every message sent, in id order (a person's view: there is nothing to look up by)."""
        with self.locked():
            rows = self.db.execute("SELECT id, recipient, text FROM messages ORDER BY id")
            return [{"message_id": i, "to": r, "text": t} for i, r, t in rows.fetchall()]

    def progress(self, key, canonical, ticket_id, statuses):
        """One event per status that changes the ticket's (a status it has already makes
        none), versions going on from the ticket's last: (the events, created). Keyed as a
        ticket is (TicketStore.keyed): a repeat of the key and body makes none and returns the
        events the first request made, kept in its row."""
        made = {"events": "[]"}  # the row's events column, filled in before keyed inserts it

        def make_events():  # keyed's check: inside its transaction, before the row is made
            self.need(ticket_id)
            version, now = self.db.execute(
                "SELECT version, status FROM webhook_events WHERE ticket_id = ? "
                "ORDER BY version DESC LIMIT 1",
                (ticket_id,),
            ).fetchone() or (0, None)
            events = []
            for status in statuses:
                if status == now:  # no change, no event: the ticket is there already
                    continue
                version, now = version + 1, status
                event_id = self.db.execute(
                    "INSERT INTO webhook_events (ticket_id, status, version, created_at) "
                    "VALUES (?, ?, ?, ?)",
                    (ticket_id, status, version, time.time()),
                ).lastrowid
                events.append(event(event_id, ticket_id, status, version))
            made["events"] = json.dumps(events)

        request_id, created = self.keyed(
            "progress_requests", key, canonical, made, check=make_events
        )
        if created:
            return json.loads(made["events"]), True
        with self.locked():
            row = self.db.execute(
                "SELECT events FROM progress_requests WHERE id = ?", (request_id,)
            ).fetchone()
        return json.loads(row[0]), False

    def subscribe(self, url):
        with self.transaction():
            self.db.execute(
                "INSERT INTO webhook_subscribers (id, url) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET url = excluded.url",
                (url,),
            )

    def pending(self):
        """(subscriber url or None, the events not delivered yet, oldest first)."""
        with self.locked():
            url = self.db.execute("SELECT url FROM webhook_subscribers").fetchone()
            rows = self.db.execute(
                "SELECT id, ticket_id, status, version FROM webhook_events "
                "WHERE delivered_at IS NULL ORDER BY id"
            ).fetchall()
        return (url and url[0]), [event(*row) for row in rows]

    def delivered(self, event_id):
        with self.transaction():
            self.db.execute(
                "UPDATE webhook_events SET delivered_at = ? WHERE id = ?",
                (time.time(), int(event_id.removeprefix("evt_"))),
            )

    def reservations(self, key=None):
        """All reservations, or the one made with key, as tickets() lists tickets."""
        rows = self.listed("reservations", "ticket_id, seats", key)
        return [{"reservation_id": i, "key": k, "ticket_id": t, "seats": n} for i, k, t, n in rows]

    def refunds(self, key=None):
        """All refunds, or the one made with key, as tickets() lists tickets."""
        rows = self.listed("refunds", "ticket_id", key)
        return [{"refund_id": i, "key": k, "ticket_id": t} for i, k, t in rows]

    def __init__(self, *args, **kwargs):
        self.settling = threading.Condition()  # lab 15: pay() and payments() share it
        self.unsettled = 0  # charges accepted and not committed yet
        super().__init__(*args, **kwargs)

    def pay(self, reference, amount):
        """One more charge, whatever was sent before: payment_id. Accepted at once, committed
        after failpoint payment-commit (sleep(S): S seconds late, as a slow provider commits
        after its caller gave up); pending until then, and GET /payments?settled=1 waits."""
        with self.settling:
            self.unsettled += 1
        try:
            fail("payment-commit")
            with self.transaction():
                return self.db.execute(
                    "INSERT INTO payments (reference, amount, created_at) VALUES (?, ?, ?)",
                    (reference, amount, time.time()),
                ).lastrowid
        finally:
            with self.settling:
                self.unsettled -= 1
                self.settling.notify_all()

    def payments(self, reference=None, settled=False):
        """(the committed charges, under reference or all, in id order; how many are pending).
        settled: wait first until none is pending, at most SETTLE_WAIT_S."""
        if settled:
            with self.settling:
                self.settling.wait_for(lambda: self.unsettled == 0, SETTLE_WAIT_S)
        sql, args = "SELECT id, reference, amount FROM payments", ()
        if reference is not None:
            sql, args = sql + " WHERE reference = ?", (reference,)
        with self.locked():
            rows = self.db.execute(sql + " ORDER BY id", args).fetchall()
        charges = [{"payment_id": i, "reference": r, "amount": a} for i, r, a in rows]
        return charges, self.unsettled

    # helpers

    def create_tables(self):
        """An older lab's tickets table gets created_at first (the key-age index needs it)."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(tickets)")}
        if columns == OLDER_TICKETS:
            self.db.execute("ALTER TABLE tickets ADD COLUMN created_at REAL")
        super().create_tables()

    @classmethod
    def ours(cls, table, columns, unique):
        if table in ("messages", "webhook_events", "webhook_subscribers", "payments"):  # no key
            return columns == cls.COLUMNS[table]
        if table == "tickets" and columns == OLDER_TICKETS:
            return unique
        return super().ours(table, columns, unique)

    def need(self, ticket_id):
        """Inside a transaction: ClientError(404) unless ticket_id is a ticket."""
        if self.db.execute("SELECT 1 FROM tickets WHERE id = ?", (ticket_id,)).fetchone() is None:
            raise ClientError(404, f"no ticket {ticket_id}; check ticket_id")


class LabHandler(api.Handler):
    """The core's routes, the lab's beside them, and lab 06's dropped answer."""

    routes = {
        "/health": "GET, HEAD",
        "/tickets": "GET, HEAD, POST",
        "/refunds": "GET, HEAD, POST",
        "/reservations": "GET, HEAD, POST",
        "/messages": "GET, HEAD, POST",
        "/payments": "GET, HEAD, POST",
        "/metrics": "GET, HEAD",
        "/webhooks": "POST",
        "/progress": "POST",
    }
    counters = COUNTERS

    def post(self, path):
        if path == "/payments":  # no key is read: each request is one more charge
            reference, amount = parse_payment(self.read_body())
            payment_id = self.server.store.pay(reference, amount)
            self.log_line(f"charged payment={payment_id} reference={reference}")
            return 201, {"payment_id": payment_id, "reference": reference, "amount": amount}
        if path == "/messages":  # no key is read: this provider cannot tell a repeat
            message_id = self.server.store.send_message(*parse_message(self.read_body()))
            self.server.metrics.add("messages_sent")
            self.log_line(f"sent message={message_id}")
            fail("after-commit")
            return 201, {"message_id": message_id}
        if path == "/webhooks":
            wait = self.waiting()
            self.server.store.subscribe(parse_subscriber(self.read_body(), self.allowed_hosts))
            return 200, self.deliver(wait)
        if path == "/progress":
            wait = self.waiting()
            body = self.read_body()
            key = parse_key([v.strip(" \t") for v in self.headers.get_all("Idempotency-Key", [])])
            try:
                events, created = self.server.store.progress(key, *parse_progress(body))
            except api.KeyConflict:
                self.server.metrics.add("key_conflicts")
                self.log_line(f"conflict key={key}")
                raise
            if not created:
                self.server.metrics.add("idempotent_replays")
            replayed = "" if created else f" (replayed key={key})"
            for made in events:
                self.log_line(
                    f"event {made['event_id']} ticket={made['ticket_id']} "
                    f"{made['status']} v{made['version']}{replayed}"
                )
            # Committed: from here the answer is a 200 whatever the round meets (a "retry"
            # would make the events again), and what was not delivered waits.
            return 200, {"events": events, **self.deliver(wait, committed=events)}
        answer = super().post(path)  # committed (and after-commit passed): now the answer
        token = self.headers.get(TOKEN_HEADER)
        if token and fail("before-answer", once_per=token) == "drop-answer":
            self.log_line(f"before-answer failpoint: dropping the answer (token={token})")
            return self.hang_up()
        return answer

    def make(self, path, key, body):
        if path == "/refunds":
            return self.server.store.refund(key, *parse_refund(body))
        if path == "/reservations":
            return self.server.store.reserve(key, *parse_reservation(body))
        return super().make(path, key, body)

    def get(self, path):
        if path == "/payments":
            charges, pending = self.server.store.payments(*parse_payments_query(self.path))
            return 200, {"payments": charges, "pending": pending}
        if path == "/messages":
            if parse_qs(urlsplit(self.path).query, keep_blank_values=True):
                raise ClientError(400, "messages have no key to look up: GET /messages lists them")
            return 200, {"messages": self.server.store.messages()}
        if path == "/refunds":
            return 200, {"refunds": self.server.store.refunds(self.query_key())}
        if path == "/reservations":
            return 200, {"reservations": self.server.store.reservations(self.query_key())}
        return super().get(path)

    def deliver(self, wait, committed=None):
        """Ask for a delivery round (webhooks.Deliveries: on a thread of its own) and answer at
        once, or, with ?wait=S, once that round is over (at most S seconds): {"delivered",
        "pending"}. committed: the events this request has just committed; a pending count the
        database cannot give then is theirs (they wait, pending), not an error answer."""
        deliveries = self.deliveries()
        asked = deliveries.ask()
        try:
            if wait is None:  # the round runs after the answer
                return {"delivered": 0, "pending": len(self.server.store.pending()[1])}
            return deliveries.wait(asked, wait)
        except Exception as error:
            if committed is None:
                raise  # nothing committed by this request: its answer may say retry
            self.log_line(f"pending count failed ({error}); the events stay pending")
            return {"delivered": 0, "pending": len(committed)}

    def waiting(self):
        """?wait=S of a POST /webhooks or /progress, read before anything is committed."""
        try:
            return webhooks.parse_wait(parse_qs(urlsplit(self.path).query, keep_blank_values=True))
        except ValueError as error:
            raise ClientError(400, str(error)) from None

    def deliveries(self):
        """The server's one sender (webhooks.Deliveries), started by the first request."""
        with STARTING:
            if getattr(self.server, "deliveries", None) is None:
                prefix = self.log_prefix
                self.server.deliveries = webhooks.Deliveries(
                    self.server.store,
                    self.server.metrics,
                    self.webhook_keys,
                    self.allowed_hosts,
                    lambda text: sys.stderr.write(f"{prefix}: {text}\n"),
                )
            return self.server.deliveries

    # helpers

    allowed_hosts = None  # WEBHOOK_ALLOWED_HOSTS and WEBHOOK_SECRET's keys, set by configured()
    webhook_keys = None

    def head_written(self):
        headers = getattr(self, "headers", None)  # none yet: a malformed request line
        token = headers.get(TOKEN_HEADER) if headers else None
        if token:  # the status and headers are out (and counted); the body waits
            fail("before-body", once_per=token)


STARTING = threading.Lock()  # LabHandler.deliveries: one sender per server


def event(event_id, ticket_id, status, version):
    """A webhook's body: what the workflow is told."""
    return {
        "event_id": f"evt_{event_id}",
        "ticket_id": ticket_id,
        "status": status,
        "version": version,
    }


def open_server(environ):
    """api.open_server with this file's store, routes, failpoints and settings."""
    return api.open_server(environ, LabStore, configured(environ), POINTS)


def main(argv=None):
    epilog = api.__doc__[api.__doc__.index("Configuration") :] + FAILPOINTS_ADDED
    handler = LabHandler  # --help needs no settings
    if not {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        try:
            handler = configured(os.environ)
        except ConfigError as error:
            print(f"receiver: {error}", file=sys.stderr)
            return error.exit_code
    return api.main(argv, LabStore, handler, POINTS, "labs.receiver", __doc__, epilog)


def configured(environ):
    """LabHandler with WEBHOOK_ALLOWED_HOSTS and WEBHOOK_SECRET read; ConfigError if one is bad."""
    text = environ.get("WEBHOOK_ALLOWED_HOSTS", ALLOWED_HOSTS)
    try:
        allowed = webhooks.allowed_hosts(text)
    except ValueError as error:
        raise ConfigError(f"WEBHOOK_ALLOWED_HOSTS={text!r}: {error}") from None
    secret = environ.get("WEBHOOK_SECRET") or httpguard.DEFAULT_WEBHOOK_SECRET  # empty: unset
    try:
        keys = httpguard.webhook_keys(secret)
    except ValueError as error:
        raise ConfigError(f"WEBHOOK_SECRET: {error}") from None
    return type("LabHandler", (LabHandler,), {"allowed_hosts": allowed, "webhook_keys": keys})


# helpers: input validation

MAX_ID = 2**63 - 1  # the largest SQLite integer: a larger ticket_id is no ticket's
MAX_SEATS = 1000  # seats in one reservation: more than SEATS, so "no capacity" can be asked for


def parse_refund(body):
    """Validate a POST /refunds body: (canonical JSON, ticket_id)."""
    ticket_id = whole(parse_object(body, '{"ticket_id": N}', "ticket_id"), "ticket_id", MAX_ID)
    return api.canonical({"ticket_id": ticket_id}), ticket_id


def parse_reservation(body):
    """Validate a POST /reservations body: (canonical JSON, ticket_id, seats)."""
    payload = parse_object(body, '{"ticket_id": N, "seats": S}', "ticket_id", "seats")
    ticket_id, seats = whole(payload, "ticket_id", MAX_ID), whole(payload, "seats", MAX_SEATS)
    return api.canonical({"ticket_id": ticket_id, "seats": seats}), ticket_id, seats


def parse_message(body):
    """Validate a POST /messages body: (to, text)."""
    payload = parse_object(body, '{"to": "...", "text": "..."}', "to", "text")
    for field in ("to", "text"):
        value = payload[field]
        if not isinstance(value, str) or not 1 <= len(value) <= api.MAX_TITLE_CHARS:
            raise ClientError(
                400, f"{field} must be a string of 1-{api.MAX_TITLE_CHARS} characters"
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ClientError(400, f"{field} has a lone surrogate escape") from None
    return payload["to"], payload["text"]


def parse_payment(body):
    """Validate a POST /payments body: (reference, amount)."""
    payload = parse_object(body, '{"reference": "R", "amount": N}', "reference", "amount")
    reference = payload["reference"]
    if not isinstance(reference, str) or not api.KEY_PATTERN.fullmatch(reference):
        raise ClientError(400, f"reference must be 1-{api.MAX_KEY_CHARS} visible ASCII characters")
    return reference, whole(payload, "amount", MAX_AMOUNT)


def parse_payments_query(target):
    """GET /payments's query: (reference or None, settled)."""
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    if set(query) - {"reference", "settled"} or query.get("settled", ["1"]) != ["1"]:
        raise ClientError(400, "the query parameters are ?reference=R and ?settled=1")
    return api.parse_key(query.get("reference"), where="?reference="), "settled" in query


def parse_subscriber(body, allowed):
    """Validate a POST /webhooks body: the url, plain http(s) to a host the allow-list names,
    read by the one parser the deliveries use (webhooks.checked)."""
    url = parse_object(body, '{"url": "http://HOST:PORT/PATH"}', "url")["url"]
    try:
        webhooks.checked(url, allowed)
    except ValueError as error:
        raise ClientError(
            400, f"url {error}; nothing stored, the subscriber stays as it was"
        ) from None
    return url


def parse_progress(body):
    """Validate a POST /progress body: (canonical JSON, ticket_id, statuses)."""
    payload = parse_object(
        body, '{"ticket_id": N, "statuses": ["resolved"]}', "ticket_id", "statuses"
    )
    statuses = payload["statuses"]
    if (
        not isinstance(statuses, list)
        or not 1 <= len(statuses) <= 10
        or not all(isinstance(s, str) and s in STATUSES for s in statuses)
    ):
        raise ClientError(400, f"statuses must be a list of 1-10 of {', '.join(STATUSES)}")
    ticket_id = whole(payload, "ticket_id", MAX_ID)
    canonical = api.canonical({"ticket_id": ticket_id, "statuses": statuses})
    return canonical, ticket_id, statuses


def whole(payload, field, high):
    """payload[field] as an int from 1 to high; JSON's 3.0 is 3 (JSON Schema's integer too)."""
    value = payload[field]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not int or not 1 <= value <= high:
        raise ClientError(400, f"{field} must be a whole number from 1 to {high}")
    return value


if __name__ == "__main__":
    sys.exit(main())
