"""Lab 15's providers that take no key, as the lab's receiver (labs/receiver.py) serves them.

POST /messages stands in for an email or SMS service: no key read, no lookup, so every request
is one more message. POST /payments stands in for a card provider: no key read, so every request
is one more charge, but a lookup by the caller's reference (GET /payments?reference=R), and a
commit that may come late (failpoint payment-commit=sleep(S)): a charge is pending until then.
The functions take the lab's store (LabStore), whose SCHEMA holds these tables.
"""

import threading
import time
from urllib.parse import parse_qs, urlsplit

import api
from failpoints import fail
from httpguard import ClientError

MESSAGES_SCHEMA = """CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,  -- one row per POST /messages: this provider keeps no key
    recipient TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL
)"""  # irreversible, no key, no lookup
PAYMENTS_SCHEMA = """CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY,  -- one row per POST /payments: this provider reads no key
    reference TEXT NOT NULL,  -- the caller's, for the lookup: not unique, a repeat is a charge
    amount INTEGER NOT NULL,
    created_at REAL NOT NULL
)"""  # no key, a lookup by reference, commits late
COLUMNS = {
    "messages": {"id", "recipient", "text", "created_at"},
    "payments": {"id", "reference", "amount", "created_at"},
}
SETTLE_WAIT_S = 4  # seconds GET /payments?settled=1 waits at most for pending charges (less
#                   than a client's default API_TIMEOUT_S, 5: an answer, with what is pending)


class ChargesInFlight:
    """Charges accepted and not committed yet: GET /payments's "pending", and its wait."""

    def __init__(self):
        self.changed = threading.Condition()
        self.count = 0


def record_message(store, recipient, text):
    """One more message, whatever was sent before: message_id. Like an email service, this
    provider takes no Idempotency-Key and offers no lookup, so a repeat is a second message."""
    with store.transaction():
        return store.db.execute(
            "INSERT INTO messages (recipient, text, created_at) VALUES (?, ?, ?)",
            (recipient, text, time.time()),
        ).lastrowid


def messages_sent(store):
    """Every message sent, in id order (a person's view: there is nothing to look up by)."""
    with store.locked():
        rows = store.db.execute("SELECT id, recipient, text FROM messages ORDER BY id")
        return [{"message_id": i, "to": r, "text": t} for i, r, t in rows.fetchall()]


def record_charge(store, reference, amount):
    """One more charge, whatever was sent before: payment_id. Accepted at once, committed
    after failpoint payment-commit (sleep(S): S seconds late, as a slow provider commits after
    its caller gave up); pending until then, and GET /payments?settled=1 waits."""
    in_flight = store.charges_in_flight
    with in_flight.changed:
        in_flight.count += 1
    try:
        fail("payment-commit")
        with store.transaction():
            return store.db.execute(
                "INSERT INTO payments (reference, amount, created_at) VALUES (?, ?, ?)",
                (reference, amount, time.time()),
            ).lastrowid
    finally:
        with in_flight.changed:
            in_flight.count -= 1
            in_flight.changed.notify_all()


def committed_charges(store, reference=None, settled=False):
    """(the committed charges, under reference or all, in id order; how many are pending).
    settled: wait first until none is pending, at most SETTLE_WAIT_S."""
    in_flight = store.charges_in_flight
    if settled:
        with in_flight.changed:
            in_flight.changed.wait_for(lambda: in_flight.count == 0, SETTLE_WAIT_S)
    sql, args = "SELECT id, reference, amount FROM payments", ()
    if reference is not None:
        sql, args = sql + " WHERE reference = ?", (reference,)
    with store.locked():
        rows = store.db.execute(sql + " ORDER BY id", args).fetchall()
    charges = [{"payment_id": i, "reference": r, "amount": a} for i, r, a in rows]
    return charges, in_flight.count


def parse_message(body):
    """Validate a POST /messages body: (to, text)."""
    payload = api.parse_object(body, '{"to": "...", "text": "..."}', "to", "text")
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


def parse_payments_query(target):
    """GET /payments's query: (reference or None, settled)."""
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    if set(query) - {"reference", "settled"} or query.get("settled", ["1"]) != ["1"]:
        raise ClientError(400, "the query parameters are ?reference=R and ?settled=1")
    return api.parse_key(query.get("reference"), where="?reference="), "settled" in query
