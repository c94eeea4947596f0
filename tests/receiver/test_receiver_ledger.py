"""The receiver's ledger (GET /metrics) and its key retention, against real labs/receiver.py
processes.

/metrics is parsed with prometheus_client's own text parser, as Prometheus would read it, and its
counters are checked against the tickets the receiver really holds. Retention is checked with
keys made in the past by writing the database directly, so no test waits for a clock.
"""

import select
import socket
import sqlite3
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from receiver_helpers import (
    TITLE,
    assert_error,
    port_of,
    post,
    read_head,
    read_reply,
    request,
    request_bytes,
    run_api,
    tickets,
)

import failpoints
from tools.local import ReceiverProcess, wait_until

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

CLIENTS = 32  # posting one key at the same moment
HOUR_S = 3600.0  # a retention no test outlives: its first prune is a minute away
PRUNE_DEADLINE_S = 10.0  # seconds for a short retention's pruner to have run
HANG_GUARD_S = 60.0  # a wait only a hang reaches, however busy the machine: not a speed bound
COUNTERS = (  # receiver_NAME_total
    "tickets_created",
    "refunds_created",
    "reservations_created",
    "idempotent_replays",
    "key_conflicts",
    "keys_pruned",
)


def metrics(server):
    """{(sample name, labels as a sorted tuple): value} from a real parse of GET /metrics."""
    reply = request(server, "GET", "/metrics")
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse_metrics(reply.body)


def parse_metrics(body):
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def counter(values, name):
    return values[f"receiver_{name}_total", ()]


def answers(values):
    """{status: answers} from receiver_requests_total."""
    return {
        int(dict(labels)["code"]): int(value)
        for (name, labels), value in values.items()
        if name == "receiver_requests_total"
    }


def started(lab, tmp_path, **settings):
    return ReceiverProcess(dict(lab, **settings), tmp_path / "receiver.log").start()


def test_the_counters_match_the_tickets_really_made(receiver):
    before = answers(metrics(receiver))  # start() asked /health: answers from before the test
    for n in range(3):
        assert post(receiver, key=f"ledger:{n}").status == 201
    assert post(receiver).status == 201  # no key: a ticket all the same
    assert post(receiver, key="ledger:0").status == 200
    assert post(receiver, key="ledger:1").status == 200
    assert post(receiver, "Another title", key="ledger:2").status == 409
    assert_error(request(receiver, "POST", "/tickets", b"{"), 400)
    made = tickets(receiver)  # the seventh answer, a GET

    values = metrics(receiver)  # its own answer is counted once this page is rendered
    assert counter(values, "tickets_created") == len(made) == 4
    assert counter(values, "idempotent_replays") == 2
    assert counter(values, "key_conflicts") == 1
    assert counter(values, "keys_pruned") == 0
    sent = answers(values)
    # 200: two replays, the GET, and the first /metrics (counted after its page was rendered)
    assert {code: sent[code] - before.get(code, 0) for code in sent} == {
        201: 4,
        200: 4,
        409: 1,
        400: 1,
    }
    assert values["receiver_request_duration_seconds_count", ()] == sum(sent.values())
    buckets = [
        (float(dict(labels)["le"]), value)
        for (name, labels), value in values.items()
        if name == "receiver_request_duration_seconds_bucket"
    ]
    assert buckets[-1] == (float("inf"), sum(sent.values()))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert values["receiver_request_duration_seconds_sum", ()] > 0
    assert answers(metrics(receiver))[200] == sent[200] + 1  # the last /metrics counted too


COUNTED = [  # (method, target, body, Idempotency-Key, status, the counter it adds to)
    ("POST", "/tickets", {"title": TITLE}, "counted:1", 201, "tickets_created"),
    ("POST", "/tickets", {"title": TITLE}, "counted:1", 200, "idempotent_replays"),
    ("POST", "/tickets", {"title": "Another title"}, "counted:1", 409, "key_conflicts"),
    ("POST", "/refunds", {"ticket_id": 1}, "counted:2", 201, "refunds_created"),
    (
        "POST",
        "/reservations",
        {"ticket_id": 1, "seats": 2},
        "counted:3",
        201,
        "reservations_created",
    ),
    ("POST", "/reservations", {"ticket_id": 1, "seats": 11}, "counted:4", 409, None),
    ("POST", "/tickets", b"{", None, 400, None),
    ("GET", "/tickets", None, None, 200, None),
    ("HEAD", "/health", None, None, 200, None),
    ("GET", "/nowhere", None, None, 404, None),
]


def test_a_client_that_has_its_answer_finds_it_counted(lab, tmp_path):
    """before-body writes a tokened answer's status line and headers, then holds its body (a
    pause, until the test has read /metrics and lets it go): a count made after the answer is
    written (or as its body is) would be missing from /metrics, with no race to lose."""
    held = tmp_path / "before-body.pause"
    server = started(lab, tmp_path, FAILPOINTS=f"before-body=pause({held})")
    try:
        for n, (method, target, body, key, status, name) in enumerate(COUNTED):
            headers = [("Failpoint-Token", f"counted-{n}")] + (
                [("Idempotency-Key", key)] * bool(key)
            )
            before = metrics(server)
            with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
                sock.sendall(request_bytes(method, target, body, headers))
                assert read_head(sock)[0] == status, (method, target, body)
                wait_until(held.exists, HANG_GUARD_S, "the answer at before-body")  # it waits
                after = metrics(server)
                failpoints.unpause(held)
                while sock.recv(65536):  # the body, then the end: the answer has gone on
                    pass
            held.unlink()  # the next answer's body waits there again
            sent = answers(after)
            grew = {code: sent[code] - answers(before).get(code, 0) for code in sent}
            # this answer, and the first /metrics (counted after its page was rendered)
            assert {code: n for code, n in grew.items() if n} == (
                {200: 2} if status == 200 else {status: 1, 200: 1}
            ), (method, target, body)
            for counted in COUNTERS:
                assert counter(after, counted) - counter(before, counted) == (counted == name), (
                    counted,
                    method,
                    target,
                )
    finally:
        server.stop()


def test_no_label_carries_a_key_or_a_thread(receiver):
    post(receiver, key="secret-case:open-ticket:v1")
    post(receiver, key="secret-case:open-ticket:v1")
    body = request(receiver, "GET", "/metrics").body.decode()
    assert "secret-case" not in body
    labels = {name for (_, sample_labels) in metrics(receiver) for name, _ in sample_labels}
    assert labels == {"code", "le"}


def test_a_room_on_one_key_counts_one_creation_and_the_rest_replays(receiver):
    start = threading.Barrier(CLIENTS)
    replies = []

    def client():
        start.wait()
        replies.append(post(receiver, key="room:one"))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(replies) == CLIENTS
    values = metrics(receiver)
    assert counter(values, "tickets_created") == len(tickets(receiver)) == 1
    assert counter(values, "idempotent_replays") == CLIENTS - 1


def test_the_over_cap_503_is_counted(lab, tmp_path):
    capped = started(lab, tmp_path, RECEIVER_MAX_CONNECTIONS="1")
    statuses = []  # what every probe got: each 503 must be counted
    try:
        held = hold_the_only_slot(capped, statuses)
        with held:
            statuses += [health(capped) for _ in range(3)]
            assert statuses[-3:] == [503] * 3
        # The slot frees a moment after each answer: a probe, /metrics included, may be refused
        # again until then, and every such refusal is counted too.
        replies = []
        wait_until(
            lambda: replies.append(request(capped, "GET", "/metrics")) or replies[-1].status == 200,
            5,
            "a slot for GET /metrics",
        )
        statuses += [reply.status for reply in replies[:-1]]
        assert answers(parse_metrics(replies[-1].body))[503] == statuses.count(503)
    finally:
        capped.stop()


def hold_the_only_slot(server, statuses):
    """A connection that the receiver serves (a thread waits for the rest of its request).

    The thread of an earlier request may still hold the slot for a moment after its answer, and
    then this connection is the one refused: try again until a probe is refused instead.
    """
    for _ in range(50):
        held = socket.create_connection(("127.0.0.1", port_of(server)), timeout=10)
        held.sendall(b"GET /tickets HTTP/1.0\r\n")  # not finished: its thread waits
        statuses.append(health(server))
        refused_itself = select.select([held], [], [], 0)[0]  # it was answered at once
        if statuses[-1] == 503 and not refused_itself:
            return held
        if refused_itself:
            statuses.append(read_reply(held).status)
        held.close()
    raise AssertionError("no connection kept the one slot")


def health(server):
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        return read_reply(sock).status


def test_counters_start_at_zero_with_each_process_and_the_tickets_stay(lab, tmp_path):
    server = started(lab, tmp_path)
    post(server, key="restart:1")
    assert counter(metrics(server), "tickets_created") == 1
    server.stop()
    again = started(lab, tmp_path)
    try:
        assert counter(metrics(again), "tickets_created") == 0
        assert len(tickets(again)) == 1
    finally:
        again.stop()


# ---- key retention


def make_old_ticket(lab, key, age_s, title="Check supplier configuration"):
    """A ticket with key committed age_s seconds ago, written as the receiver would."""
    db = sqlite3.connect(lab["RECEIVER_DB"], isolation_level=None)
    try:
        return db.execute(
            "INSERT INTO tickets (operation_key, payload, created_at) VALUES (?, ?, ?)",
            (key, f'{{"title":"{title}"}}', time.time() - age_s),
        ).lastrowid
    finally:
        db.close()


def stored_key(lab, ticket_id):
    db = sqlite3.connect(lab["RECEIVER_DB"])
    try:
        return db.execute("SELECT operation_key FROM tickets WHERE id = ?", (ticket_id,)).fetchone()
    finally:
        db.close()


def test_a_key_within_the_retention_is_honoured(lab, tmp_path):
    server = started(lab, tmp_path, RECEIVER_KEY_RETENTION_S=str(HOUR_S))
    try:
        ticket = post(server, key="fresh").json()["ticket_id"]
        old = make_old_ticket(lab, "half-an-hour", HOUR_S / 2)
        assert post(server, key="fresh").json() == {"ticket_id": ticket, "created": False}
        assert post(server, key="half-an-hour").json() == {"ticket_id": old, "created": False}
    finally:
        server.stop()


def test_a_key_past_the_retention_is_a_new_request_before_any_prune(lab, tmp_path):
    server = started(lab, tmp_path, RECEIVER_KEY_RETENTION_S=str(HOUR_S))
    try:
        old = make_old_ticket(lab, "case-expired", HOUR_S * 2)
        assert stored_key(lab, old) == ("case-expired",)  # not pruned: the first prune is later
        assert tickets(server, "case-expired") == []  # the lookup does not find it either
        assert tickets(server)[0]["key"] is None
        reply = post(server, key="case-expired")
        assert reply.status == 201 and reply.json()["ticket_id"] != old
        assert stored_key(lab, old) == (None,)  # forgotten as it met its first request
        assert post(server, key="case-expired").status == 200  # the new ticket's key is fresh
        assert [t["ticket_id"] for t in tickets(server)] == [old, reply.json()["ticket_id"]]
        assert counter(metrics(server), "keys_pruned") == 1
    finally:
        server.stop()


def test_without_a_retention_an_old_key_is_honoured_for_ever(receiver, lab):
    old = make_old_ticket(lab, "case-ancient", 10 * 365 * 24 * HOUR_S)
    assert post(receiver, key="case-ancient").json() == {"ticket_id": old, "created": False}


def test_the_pruner_forgets_expired_keys_on_its_own_and_keeps_the_tickets(lab, tmp_path):
    server = started(lab, tmp_path, RECEIVER_KEY_RETENTION_S="0.5")
    try:
        first = post(server, key="case-short").json()["ticket_id"]
        for n in range(3):
            make_old_ticket(lab, f"old:{n}", HOUR_S, f"old {n}")
        wait_until(
            lambda: counter(metrics(server), "keys_pruned") == 4,
            PRUNE_DEADLINE_S,
            "the pruner to forget the four keys",
        )
        assert stored_key(lab, first) == (None,)  # in the file, not only in the answers
        assert len(tickets(server)) == 4 and all(t["key"] is None for t in tickets(server))
        again = post(server, key="case-short").json()
        assert again["created"] is True and again["ticket_id"] != first
    finally:
        server.stop()
    assert "receiver: pruned" in (tmp_path / "receiver.log").read_text()


def test_a_database_from_before_retention_keeps_its_keys(lab, tmp_path):
    """A file made by the receiver before it kept times: its tickets have none, and never
    expire."""
    db_path = tmp_path / "data" / "receiver" / "receiver.sqlite"
    db_path.parent.mkdir(parents=True)
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute(
        "CREATE TABLE tickets (id INTEGER PRIMARY KEY, operation_key TEXT UNIQUE, "
        "payload TEXT NOT NULL)"
    )
    db.execute("INSERT INTO tickets VALUES (1, 'case-old-file', '{\"title\":\"t\"}')")
    db.close()
    server = started(lab, tmp_path, RECEIVER_KEY_RETENTION_S="0.5")
    try:
        reply = request(
            server, "POST", "/tickets", b'{"title": "t"}', [("Idempotency-Key", "case-old-file")]
        )
        assert reply.json() == {"ticket_id": 1, "created": False}
        assert post(server, key="new").status == 201
    finally:
        server.stop()


@pytest.mark.parametrize("value", ["forever", "0", "-5", ""])
def test_a_bad_retention_is_one_line_and_exit_2(lab, value):
    done = run_api(dict(lab, RECEIVER_KEY_RETENTION_S=value))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"RECEIVER_KEY_RETENTION_S={value!r} must be a number above 0" in done.stderr
