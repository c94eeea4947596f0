"""The lab's receiver: api.py's ticket service, and what the lessons add to it.

api.py is the core (tickets, a UNIQUE key, one transaction committed before the answer, a
lookup by key); the starter takes it unchanged. This file extends it, by subclassing only
(api.py never imports this one), with what labs 06, 13 (labs/saga_store.py), 15 and 18 need:

    GET  /refunds[?key=KEY]      200 {"refunds": [{"refund_id", "key", "ticket_id"}]}
    POST /refunds                body {"ticket_id": N}, optional Idempotency-Key: a refund of
                                 ticket N (a saga's compensation), keyed like a ticket: 201,
                                 200, 409 as for a ticket; 404 no ticket N. Without a key every
                                 request is one more refund.
    GET  /reservations[?key=KEY] 200 {"reservations": [{"reservation_id", "key", "ticket_id",
                                 "seats"}]}: the saga's lookup by key
    POST /reservations           body {"ticket_id": N, "seats": S}, optional Idempotency-Key:
                                 201, 200, 409 as above; 404 no ticket N; 409 {"code":
                                 "no_capacity"}: more seats than the SEATS left, nothing reserved
    GET  /shipments[?key=KEY]    200 {"shipments": [{"shipment_id", "key", "reservation_id",
                                 "country"}]}
    POST /shipments              body {"reservation_id": N, "country": "FR"}, keyed as above;
                                 404 no reservation N; 409 {"code": "no_carrier"}: no carrier
                                 ships to that country, nothing booked
    GET  /releases[?key=KEY]     200 {"releases": [{"release_id", "key", "reservation_id"}],
                                 "seats_left"}
    POST /releases               body {"reservation_id": N}, keyed as above; 404 no reservation
                                 N. Without a key every request frees its seats once more
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
A webhook is a POST of one event's JSON to the subscriber, delivered at least once by the
receiver's one sender thread, apart from the requests (labs/webhooks.py says how). A request
answers once its own write is committed ("delivered": 0), or, with ?wait=S (whole seconds, at
most 60), once the delivery round it asked for is over: what that round delivered and what is
still pending. A committed /progress answers 200 whatever its round met.
The routes of api.py (/health, /metrics, /tickets) answer as it says; /metrics also counts
the saga's rows created and messages sent. A tickets table made before created_at was
kept (an older lab's file) gets the column when the receiver opens it.

Run it as `python -m labs.receiver` (compose.yaml's api service and every guide do); its
settings are api.py's, two of its own (below), and FAILPOINTS knows more points (below).
"""

import os
import sys
import threading
from urllib.parse import parse_qs, urlsplit

import api
import httpguard
from api import parse_key, parse_object
from failpoints import fail
from httpguard import ClientError
from labs import keyless_providers, saga_store, webhooks
from labs.saga_store import whole_number
from receiversettings import SETTINGS_HELP, ConfigError, open_server

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
MAX_AMOUNT = 10**9  # the largest charge, in cents
OLDER_TICKETS = {"id", "operation_key", "payload"}  # a tickets table before created_at was kept
COUNTERS = {  # api.COUNTERS, and this file's routes' own
    "tickets_created": api.COUNTERS["tickets_created"],
    **saga_store.COUNTERS,
    "idempotent_replays": api.COUNTERS["idempotent_replays"],
    "key_conflicts": api.COUNTERS["key_conflicts"],
    "messages_sent": "POST /messages: each one a message (this provider takes no key).",
    "webhooks_delivered": "Webhook deliveries the subscriber answered with a 2xx.",
    "webhooks_failed": "Webhook deliveries that got no 2xx (each is retried).",
    "keys_pruned": api.COUNTERS["keys_pruned"],
}


class LabStore(saga_store.SagaStore, api.TicketStore):
    """The core's ticket store, with the saga's tables (lab 13: labs/saga_store.py), lab 15's
    messages and payments (labs/keyless_providers.py) and lab 18's events (labs/webhooks.py)."""

    SCHEMA = (
        *api.TicketStore.SCHEMA,
        *saga_store.SCHEMA,
        keyless_providers.MESSAGES_SCHEMA,
        *webhooks.SCHEMA,
        keyless_providers.PAYMENTS_SCHEMA,
    )
    COLUMNS = {
        **api.TicketStore.COLUMNS,
        **saga_store.COLUMNS,
        **webhooks.COLUMNS,
        **keyless_providers.COLUMNS,
    }
    KEYED = {
        **api.TicketStore.KEYED,
        **saga_store.KEYED,
        **webhooks.KEYED,
    }

    # helpers

    def create_tables(self):
        """An older lab's tickets table gets created_at first (the key-age index needs it)."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(tickets)")}
        if columns == OLDER_TICKETS:
            self.db.execute("ALTER TABLE tickets ADD COLUMN created_at REAL")
        super().create_tables()

    def __init__(self, *args, **kwargs):
        self.charges_in_flight = keyless_providers.ChargesInFlight()  # lab 15's payments
        super().__init__(*args, **kwargs)

    @classmethod
    def makes_table(cls, table, columns, unique):
        if table in ("messages", "webhook_events", "webhook_subscribers", "payments"):  # no key
            return columns == cls.COLUMNS[table]
        if table == "tickets" and columns == OLDER_TICKETS:
            return unique
        return super().makes_table(table, columns, unique)

    def require_ticket(self, ticket_id):
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
        "/shipments": "GET, HEAD, POST",
        "/releases": "GET, HEAD, POST",
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
            payment_id = keyless_providers.record_charge(self.server.store, reference, amount)
            self.log_line(f"charged payment={payment_id} reference={reference}")
            return 201, {"payment_id": payment_id, "reference": reference, "amount": amount}
        if path == "/messages":  # no key is read: this provider cannot tell a repeat
            message = keyless_providers.parse_message(self.read_body())
            message_id = keyless_providers.record_message(self.server.store, *message)
            self.server.metrics.add("messages_sent")
            self.log_line(f"sent message={message_id}")
            fail("after-commit")
            return 201, {"message_id": message_id}
        if path == "/webhooks":
            wait = self.requested_wait()
            url = webhooks.parse_subscriber(self.read_body(), self.allowed_hosts)
            webhooks.subscribe(self.server.store, url)
            return 200, self.deliver(wait)
        if path == "/progress":
            wait = self.requested_wait()
            body = self.read_body()
            key = parse_key([v.strip(" \t") for v in self.headers.get_all("Idempotency-Key", [])])
            try:
                store, progress = self.server.store, parse_progress(body)
                events, created = webhooks.record_progress(store, key, *progress)
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
        if (made := SAGA_POSTS.get(path)) is not None:  # lab 13's (labs/saga_store.py)
            return made(self.server.store, key, body)
        return super().make(path, key, body)

    def get(self, path):
        if path == "/payments":
            query = keyless_providers.parse_payments_query(self.path)
            charges, pending = keyless_providers.committed_charges(self.server.store, *query)
            return 200, {"payments": charges, "pending": pending}
        if path == "/messages":
            if parse_qs(urlsplit(self.path).query, keep_blank_values=True):
                raise ClientError(400, "messages have no key to look up: GET /messages lists them")
            return 200, {"messages": keyless_providers.messages_sent(self.server.store)}
        if (table := path.lstrip("/")) in saga_store.LISTED:
            listed = {table: self.server.store.listed(table, self.query_key())}
            if table == "releases":  # what the releases left: more than SEATS, one too many
                listed["seats_left"] = self.server.store.seats_left()
            return 200, listed
        return super().get(path)

    def deliver(self, wait, committed=None):
        """Ask for a delivery round (webhooks.Deliveries: on a thread of its own) and answer at
        once, or, with ?wait=S, once that round is over (at most S seconds): {"delivered",
        "pending"}. committed: the events this request has just committed; a pending count the
        database cannot give then is theirs (they wait, pending), not an error answer."""
        deliveries = self.sender()
        asked = deliveries.ask()
        try:
            if wait is None:  # the round runs after the answer
                _, pending = webhooks.pending_events(self.server.store)
                return {"delivered": 0, "pending": len(pending)}
            return deliveries.wait(asked, wait)
        except Exception as error:
            if committed is None:
                raise  # nothing committed by this request: its answer may say retry
            self.log_line(f"pending count failed ({error}); the events stay pending")
            return {"delivered": 0, "pending": len(committed)}

    def requested_wait(self):
        """?wait=S of a POST /webhooks or /progress, read before anything is committed."""
        try:
            return webhooks.parse_wait(parse_qs(urlsplit(self.path).query, keep_blank_values=True))
        except ValueError as error:
            raise ClientError(400, str(error)) from None

    def sender(self):
        """The server's one sender (webhooks.Deliveries), started by the first request."""
        with SENDER_START_LOCK:
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

    # WEBHOOK_ALLOWED_HOSTS and WEBHOOK_SECRET's keys, set by configured_handler()
    allowed_hosts = webhook_keys = None

    def head_written(self):
        headers = getattr(self, "headers", None)  # none yet: a malformed request line
        token = headers.get(TOKEN_HEADER) if headers else None
        if token:  # the status and headers are out (and counted); the body waits
            fail("before-body", once_per=token)


SAGA_POSTS = {
    "/refunds": saga_store.SagaStore.refund,
    "/reservations": saga_store.SagaStore.reserve,
    "/shipments": saga_store.SagaStore.ship,
    "/releases": saga_store.SagaStore.release,
}
SENDER_START_LOCK = threading.Lock()  # LabHandler.sender: one sender per server


def open_lab_receiver(environ):
    """receiversettings.open_server with this file's store, routes, failpoints and settings."""
    return open_server(environ, LabStore, configured_handler(environ), POINTS)


def main(argv=None):
    epilog = SETTINGS_HELP + FAILPOINTS_ADDED
    handler = LabHandler  # --help needs no settings
    if not {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        try:
            handler = configured_handler(os.environ)
        except ConfigError as error:
            print(f"receiver: {error}", file=sys.stderr)
            return error.exit_code
    return api.main(argv, LabStore, handler, POINTS, "labs.receiver", __doc__, epilog)


def configured_handler(environ):
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


def parse_payment(body):
    """Validate a POST /payments body: (reference, amount)."""
    payload = parse_object(body, '{"reference": "R", "amount": N}', "reference", "amount")
    reference = payload["reference"]
    if not isinstance(reference, str) or not api.KEY_PATTERN.fullmatch(reference):
        raise ClientError(400, f"reference must be 1-{api.MAX_KEY_CHARS} visible ASCII characters")
    return reference, whole_number(payload, "amount", MAX_AMOUNT)


def parse_progress(body):
    """Validate a POST /progress body: (canonical JSON, ticket_id, statuses)."""
    payload = parse_object(
        body, '{"ticket_id": N, "statuses": ["resolved"]}', "ticket_id", "statuses"
    )
    statuses = payload["statuses"]
    if (
        not isinstance(statuses, list)
        or not 1 <= len(statuses) <= 10
        or not all(isinstance(s, str) and s in webhooks.STATUSES for s in statuses)
    ):
        names = ", ".join(webhooks.STATUSES)
        raise ClientError(400, f"statuses must be a list of 1-10 of {names}")
    ticket_id = whole_number(payload, "ticket_id")
    canonical = api.canonical({"ticket_id": ticket_id, "statuses": statuses})
    return canonical, ticket_id, statuses


if __name__ == "__main__":
    sys.exit(main())
