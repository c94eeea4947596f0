"""Refunds and reservations (lab 13's saga) against a real labs/receiver.py: the same key
discipline as tickets, a reservation refused when the seats run out, and /metrics counting what was
made."""

import sqlite3
import threading
from contextlib import closing

import pytest
from prometheus_client.parser import text_string_to_metric_families
from receiver_helpers import assert_error, post, request

from tools.local import ReceiverProcess, wait_until

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

SEATS = 10  # labs/receiver.py's SEATS: the seats all reservations share
HOUR_S = 3600.0  # a retention no test outlives: its first prune is a minute away
PRUNE_DEADLINE_S = 10.0  # seconds for a short retention's pruner to have run


def a_ticket(receiver, title="Charge for case-13"):
    reply = post(receiver, title)
    assert reply.status == 201, reply
    return reply.json()["ticket_id"]


def refund(receiver, ticket_id, key=None):
    headers = [] if key is None else [("Idempotency-Key", key)]
    return request(receiver, "POST", "/refunds", {"ticket_id": ticket_id}, headers)


def reserve(receiver, ticket_id, seats, key=None):
    headers = [] if key is None else [("Idempotency-Key", key)]
    body = {"ticket_id": ticket_id, "seats": seats}
    return request(receiver, "POST", "/reservations", body, headers)


def refunds(receiver, key=None):
    reply = request(receiver, "GET", "/refunds" if key is None else f"/refunds?key={key}")
    assert reply.status == 200, reply
    return reply.json()["refunds"]


def counters(receiver):
    reply = request(receiver, "GET", "/metrics")
    families = text_string_to_metric_families(reply.body.decode())
    return {s.name: s.value for f in families for s in f.samples if s.name.endswith("_total")}


def test_a_keyed_refund_is_made_once_however_often_it_is_sent(receiver):
    ticket_id = a_ticket(receiver)
    first = refund(receiver, ticket_id, "case-13:refund")
    again = refund(receiver, ticket_id, "case-13:refund")

    assert (first.status, first.json()) == (201, {"refund_id": 1, "created": True})
    assert (again.status, again.json()) == (200, {"refund_id": 1, "created": False})
    assert refunds(receiver) == [{"refund_id": 1, "key": "case-13:refund", "ticket_id": ticket_id}]


def test_without_a_key_every_refund_request_is_one_more_refund(receiver):
    ticket_id = a_ticket(receiver)
    made = [refund(receiver, ticket_id) for _ in range(2)]

    assert [(r.status, r.json()["refund_id"]) for r in made] == [(201, 1), (201, 2)]
    assert [r["key"] for r in refunds(receiver)] == [None, None]


def test_a_refund_key_sent_for_another_ticket_is_409_and_refunds_nothing(receiver):
    first, second = a_ticket(receiver), a_ticket(receiver, "Another charge")
    refund(receiver, first, "case-13:refund")

    reply = refund(receiver, second, "case-13:refund")
    assert_error(reply, 409, "already used for refund 1", code="key_conflict")
    assert [r["ticket_id"] for r in refunds(receiver)] == [first]
    assert refunds(receiver, "case-13:refund")[0]["ticket_id"] == first


def test_a_refund_of_no_ticket_is_404_and_refunds_nothing(receiver):
    assert_error(refund(receiver, 7, "case-13:refund"), 404, "no ticket 7")
    assert refunds(receiver) == []
    ticket_id = a_ticket(receiver)  # the key was not spent on the refused request
    assert refund(receiver, ticket_id, "case-13:refund").status == 201


@pytest.mark.parametrize(
    "body,words",
    [
        ({"ticket_id": 0}, ["ticket_id", "whole number"]),
        ({"ticket_id": True}, ["whole number"]),
        ({"ticket_id": "1"}, ["whole number"]),
        ({"ticket_id": 1.5}, ["whole number"]),
        ({"ticket_id": 2**63}, ["whole number"]),
        ({"ticket": 1}, ['"ticket_id"']),
        ({"ticket_id": 1, "amount": 5}, ["exactly one field"]),
    ],
)
def test_a_malformed_refund_is_400_and_refunds_nothing(receiver, body, words):
    a_ticket(receiver)
    assert_error(request(receiver, "POST", "/refunds", body), 400, *words)
    assert refunds(receiver) == []


def test_json_3_0_is_the_ticket_id_3(receiver):
    for _ in range(3):
        a_ticket(receiver)
    reply = request(receiver, "POST", "/refunds", b'{"ticket_id": 3.0}')
    assert reply.status == 201, reply
    assert refunds(receiver)[0]["ticket_id"] == 3


def test_reservations_share_the_seats_and_one_asking_for_too_many_reserves_nothing(receiver):
    ticket_id = a_ticket(receiver)
    assert reserve(receiver, ticket_id, 6, "case-a:reserve").status == 201
    assert reserve(receiver, ticket_id, 4, "case-b:reserve").status == 201

    reply = reserve(receiver, ticket_id, 1, "case-c:reserve")
    assert_error(reply, 409, "no capacity", "0 of 10", code="no_capacity")
    # A replay of a reservation already made still answers with it, seats or none left
    again = reserve(receiver, ticket_id, 6, "case-a:reserve")
    assert (again.status, again.json()) == (200, {"reservation_id": 1, "created": False})
    # The refused key reserved nothing: it is still free for another body
    assert_error(reserve(receiver, ticket_id, 1, "case-c:reserve"), 409, code="no_capacity")
    assert_error(reserve(receiver, ticket_id, 6, "case-a:reserve-x"), 409, code="no_capacity")


def test_more_seats_than_there_are_is_refused_on_an_empty_receiver(receiver):
    assert_error(reserve(receiver, a_ticket(receiver), SEATS + 1), 409, "11 seats asked for")
    assert reserve(receiver, 1, SEATS).status == 201


def test_a_reservation_key_reused_for_other_seats_is_a_key_conflict(receiver):
    ticket_id = a_ticket(receiver)
    reserve(receiver, ticket_id, 2, "case-13:reserve")
    reply = reserve(receiver, ticket_id, 3, "case-13:reserve")
    assert_error(reply, 409, "reservation 1", code="key_conflict")
    # more seats than are left, under a key that made a reservation: a key conflict still (a
    # reservation exists, and a saga that refunded on this 409 would undo a reserved step)
    reply = reserve(receiver, ticket_id, SEATS + 1, "case-13:reserve")
    assert_error(reply, 409, "reservation 1", code="key_conflict")
    assert_error(reserve(receiver, 99, 1), 404, "no ticket 99")


def test_racing_reservations_never_take_more_seats_than_there_are(receiver):
    """Twenty clients at once, one seat each: the seat count and the insert share one
    BEGIN IMMEDIATE transaction, so exactly SEATS of them get one."""
    ticket_id = a_ticket(receiver)
    statuses = []

    def client(n):
        statuses.append(reserve(receiver, ticket_id, 1, f"case-{n}:reserve").status)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(2 * SEATS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [201] * SEATS + [409] * SEATS


def test_metrics_count_refunds_and_reservations_apart_from_tickets(receiver):
    ticket_id = a_ticket(receiver)
    refund(receiver, ticket_id, "case-13:refund")
    refund(receiver, ticket_id, "case-13:refund")
    refund(receiver, ticket_id)
    refund(receiver, a_ticket(receiver, "Other"), "case-13:refund")  # a key conflict
    reserve(receiver, ticket_id, 2, "case-13:reserve")
    reserve(receiver, ticket_id, SEATS, "case-14:reserve")  # no capacity: no conflict

    values = counters(receiver)
    assert values["receiver_tickets_created_total"] == 2
    assert values["receiver_refunds_created_total"] == len(refunds(receiver)) == 2
    assert values["receiver_reservations_created_total"] == 1
    assert values["receiver_idempotent_replays_total"] == 1
    assert values["receiver_key_conflicts_total"] == 1


@pytest.fixture
def receiver_keeping_keys(lab, tmp_path):
    """A receiver that honours a key for an hour (RECEIVER_KEY_RETENTION_S)."""
    env = dict(lab, RECEIVER_KEY_RETENTION_S=str(HOUR_S))
    server = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    yield server
    server.stop()


def test_a_refund_key_past_the_retention_is_a_new_refund_like_a_tickets(receiver_keeping_keys, lab):
    receiver = receiver_keeping_keys
    ticket_id = a_ticket(receiver)
    assert refund(receiver, ticket_id, "case-13:refund").status == 201
    with closing(sqlite3.connect(lab["RECEIVER_DB"])) as db, db:  # made two hours ago
        db.execute("UPDATE refunds SET created_at = created_at - ?", (2 * HOUR_S,))

    assert refunds(receiver) == [{"refund_id": 1, "key": None, "ticket_id": ticket_id}]
    again = refund(receiver, ticket_id, "case-13:refund")
    assert (again.status, again.json()) == (201, {"refund_id": 2, "created": True})
    assert counters(receiver)["receiver_keys_pruned_total"] == 1


def test_the_pruner_forgets_refund_keys_too_and_keeps_the_refunds(lab, tmp_path):
    env = dict(lab, RECEIVER_KEY_RETENTION_S="0.2")  # pruned every 0.2 s
    receiver = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    try:
        refund(receiver, a_ticket(receiver), "case-13:refund")
        wait_until(
            lambda: counters(receiver)["receiver_keys_pruned_total"] == 1,
            PRUNE_DEADLINE_S,
            "the pruner to forget the refund's key",
        )
    finally:
        receiver.stop()
    with closing(sqlite3.connect(lab["RECEIVER_DB"])) as db:
        assert db.execute("SELECT id, operation_key FROM refunds").fetchall() == [(1, None)]


def test_a_reservation_is_found_by_its_key_as_a_ticket_is(receiver):
    """GET /reservations?key=: what the saga's ledger asks after a crash in its window."""
    ticket_id = a_ticket(receiver, "Charge for a lookup")
    made = reserve(receiver, ticket_id, 1, "case-lookup:reserve").json()["reservation_id"]
    found = request(receiver, "GET", "/reservations?key=case-lookup:reserve").json()
    assert found == {
        "reservations": [
            {
                "reservation_id": made,
                "key": "case-lookup:reserve",
                "ticket_id": ticket_id,
                "seats": 1,
            }
        ]
    }
    assert request(receiver, "GET", "/reservations?key=case-none").json() == {"reservations": []}


def test_the_message_provider_takes_no_key_each_request_is_one_more_message(receiver):
    """Lab 15's keyless provider: the same request, with the same Idempotency-Key, twice, is two
    messages, and nothing can be looked up by key."""
    body, key = {"to": "ops@example.com", "text": "ticket 1 opened"}, [("Idempotency-Key", "k")]
    first = request(receiver, "POST", "/messages", body, key)
    second = request(receiver, "POST", "/messages", body, key)
    assert (first.status, second.status) == (201, 201)
    assert second.json()["message_id"] == first.json()["message_id"] + 1
    listed = request(receiver, "GET", "/messages").json()["messages"]
    assert [m["message_id"] for m in listed if m["text"] == "ticket 1 opened"] == [
        first.json()["message_id"],
        second.json()["message_id"],
    ]
    assert_error(request(receiver, "GET", "/messages?key=k"), 400, "no key to look up")
