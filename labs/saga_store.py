"""The receiver's side of lab 13's saga: a reservation of seats for a ticket (the charge), a
shipment of a reservation, and the two compensations, a refund of a ticket and a release of a
reservation. Each is a keyed POST route of labs/receiver.py (TicketStore.keyed: committed before
the answer, a key answered with the first result), listed and looked up by GET ?key=.

The receiver cannot tell a second request without a key from a retry: each unkeyed refund is
one more refund, each unkeyed release frees the reservation's seats once more. Seats left are
SEATS, less every reservation's seats, plus those of every release: a reservation released twice
frees seats it no longer holds ("12 of 10 left").
"""

import re

from api import canonical, parse_object
from httpguard import ClientError
from keyretention import rows_with_keys

SEATS = 10  # seats for all reservations together: few, so a caller can ask for more than are left
CARRIERS = {"FR": "La Poste", "DE": "DHL", "NL": "PostNL"}  # where a shipment can go
MAX_ID = 2**63 - 1  # the largest SQLite integer: a larger id is no row's
MAX_SEATS = 1000  # seats in one reservation: more than SEATS, so "no capacity" can be asked for
SCHEMA = tuple(
    f"""CREATE TABLE IF NOT EXISTS {table} (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,
    payload TEXT NOT NULL,
    {columns},
    created_at REAL
)"""
    for table, columns in {
        "refunds": "ticket_id INTEGER NOT NULL REFERENCES tickets (id)",
        "reservations": "ticket_id INTEGER NOT NULL REFERENCES tickets (id),\n"
        "    seats INTEGER NOT NULL",
        "shipments": "reservation_id INTEGER NOT NULL REFERENCES reservations (id),\n"
        "    country TEXT NOT NULL",
        "releases": "reservation_id INTEGER NOT NULL REFERENCES reservations (id)",
    }.items()
)
KEYS = ("id", "operation_key", "payload", "created_at")
COLUMNS = {
    "refunds": {*KEYS, "ticket_id"},
    "reservations": {*KEYS, "ticket_id", "seats"},
    "shipments": {*KEYS, "reservation_id", "country"},
    "releases": {*KEYS, "reservation_id"},
}
KEYED = {"refunds": "refund", "reservations": "reservation", "shipments": "shipment"}
KEYED["releases"] = "release"
COUNTERS = {
    "refunds_created": "POST /refunds that created a refund (answered 201).",
    "reservations_created": "POST /reservations that created a reservation (answered 201).",
    "shipments_created": "POST /shipments that booked a shipment (answered 201).",
    "releases_created": "POST /releases that released a reservation (answered 201).",
}
LISTED = {  # GET /TABLE: its columns after id and key, each row's fields
    "refunds": ("ticket_id", "refund_id"),
    "reservations": ("ticket_id, seats", "reservation_id"),
    "shipments": ("reservation_id, country", "shipment_id"),
    "releases": ("reservation_id", "release_id"),
}


class SagaStore:
    """The saga's tables, mixed into the receiver's TicketStore (keyed, transaction, db)."""

    def refund(self, key, body):
        """A refund of a ticket: (refund_id, created); 404 if no ticket."""
        ticket_id = whole_number(parse_object(body, '{"ticket_id": N}', "ticket_id"), "ticket_id")
        columns = {"ticket_id": ticket_id}
        return self.keyed(
            "refunds", key, canonical(columns), columns, self.exists("tickets", ticket_id)
        )

    def reserve(self, key, body):
        """Seats for a ticket: (reservation_id, created); 409 no_capacity when fewer are left."""
        payload = parse_object(body, '{"ticket_id": N, "seats": S}', "ticket_id", "seats")
        ticket_id = whole_number(payload, "ticket_id")
        seats = whole_number(payload, "seats", MAX_SEATS)

        def seats_left():
            self.exists("tickets", ticket_id)()
            if seats > (left := self.seats_left()):
                raise ClientError(
                    409,
                    f"no capacity: {seats} seats asked for, {left} of {SEATS} left",
                    code="no_capacity",
                )

        columns = {"ticket_id": ticket_id, "seats": seats}
        return self.keyed("reservations", key, canonical(columns), columns, seats_left)

    def ship(self, key, body):
        """A shipment of a reservation: (shipment_id, created); 409 no_carrier for a country
        no carrier serves (a business no: nothing booked); 404 if no reservation."""
        payload = parse_object(
            body, '{"reservation_id": N, "country": "FR"}', "reservation_id", "country"
        )
        reservation_id = whole_number(payload, "reservation_id")
        country = payload["country"]
        if not isinstance(country, str) or not re.fullmatch("[A-Za-z]{2}", country):
            raise ClientError(400, "country must be a two-letter country code, e.g. FR")
        country = country.upper()

        def carried():
            self.exists("reservations", reservation_id)()
            if country not in CARRIERS:
                served = ", ".join(CARRIERS)
                raise ClientError(
                    409, f"no carrier ships to {country} (only to {served})", code="no_carrier"
                )

        columns = {"reservation_id": reservation_id, "country": country}
        return self.keyed("shipments", key, canonical(columns), columns, carried)

    def release(self, key, body):
        """A release of a reservation's seats: (release_id, created); 404 if no reservation."""
        payload = parse_object(body, '{"reservation_id": N}', "reservation_id")
        columns = {"reservation_id": whole_number(payload, "reservation_id")}
        check = self.exists("reservations", columns["reservation_id"])
        return self.keyed("releases", key, canonical(columns), columns, check)

    def listed(self, table, key=None):
        """All rows of a saga table, or the one made with key, as tickets() lists tickets."""
        columns, id_name = LISTED[table]
        names = [id_name, "key", *columns.split(", ")]
        return [
            dict(zip(names, row, strict=True)) for row in rows_with_keys(self, table, columns, key)
        ]

    def seats_left(self):
        """SEATS, less the seats reserved, plus those of every release (each one counts)."""
        reserved, released = self.db.execute(
            "SELECT (SELECT TOTAL(seats) FROM reservations), (SELECT TOTAL(r.seats) FROM "
            "releases JOIN reservations r ON r.id = releases.reservation_id)"
        ).fetchone()
        return SEATS - int(reserved) + int(released)

    def exists(self, table, row_id):
        """A check for keyed(): ClientError(404) unless table holds row_id."""
        noun = KEYED[table] if table in KEYED else "ticket"

        def check():
            if self.db.execute(f"SELECT 1 FROM {table} WHERE id = ?", (row_id,)).fetchone() is None:
                raise ClientError(404, f"no {noun} {row_id}; check {noun}_id")

        return check


def whole_number(payload, field, high=MAX_ID):
    """payload[field] as an int from 1 to high; JSON's 3.0 is 3 (JSON Schema's integer too)."""
    value = payload[field]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not int or not 1 <= value <= high:
        raise ClientError(400, f"{field} must be a whole number from 1 to {high}")
    return value
