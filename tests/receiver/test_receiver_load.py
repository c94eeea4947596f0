"""The receiver under a room of clients, a locked database, signals and restarts.

Real labs/receiver.py processes on loopback and real SQLite files in tmp_path. Traffic goes to
127.0.0.1 only and every loop is bounded in count and time.
"""

import os
import signal
import socket
import sqlite3
import threading
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest
from receiver_helpers import (
    REPLY_DEADLINE_S,
    TITLE,
    assert_error,
    port_of,
    post,
    request,
    tickets,
)

from tools.local import ReceiverProcess, free_port, wait_until

CLIENTS = 64  # a workshop room posting at the same moment; more than a default backlog (5)
BUSY_TIMEOUT_S = 0.3  # the receiver's wait for a locked database in the 503 test (default 2 s)
ACKS_BEFORE_KILL = 150  # acknowledged tickets before the SIGKILL: the load is well under way
MAX_POSTS_PER_CLIENT = 2000  # bound on the load loop if the kill never comes
LOAD_DEADLINE_S = 30.0  # seconds for the load to reach ACKS_BEFORE_KILL (~0.2 s here)
HANG_GUARD_S = 60.0  # a wait only a hang reaches, however busy the machine: not a speed bound
FD_SETTLE_DEADLINE_S = HANG_GUARD_S  # for the receiver to close the sockets of finished requests
ROUNDS_OF_TRAFFIC = 60  # x 5 requests of every kind: 300 requests for the handle count
STALLERS = 16  # clients that send half a request and go quiet
PAIR_KEYS = 150  # keys that two receivers on one file get at once
PAIR_CLIENTS = 4  # threads posting to each of the two
PAIR_BUSY_TIMEOUT_S = 10  # a wait for the other process's commit must not become a 503 here


def at_once(count, work):
    """Run work(i) in `count` threads released together; a result or an exception each."""
    start_together = threading.Barrier(count)
    results = [None] * count

    def run(i):
        start_together.wait()
        try:
            results[i] = work(i)
        except Exception as error:  # collected and asserted on by the caller
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(REPLY_DEADLINE_S * 2)
    assert not any(thread.is_alive() for thread in threads), "a client got no answer in time"
    return results


def no_errors(replies):
    errors = [r for r in replies if isinstance(r, Exception)]
    assert not errors, f"{len(errors)} clients failed (refused, reset, no answer): {errors[:3]}"


def test_a_room_posting_one_key_at_once_gets_one_ticket_and_one_id(receiver):
    replies = at_once(CLIENTS, lambda i: post(receiver, key="room:open-ticket:v1"))
    no_errors(replies)
    assert sorted(r.status for r in replies) == [200] * (CLIENTS - 1) + [201]
    assert len({r.json()["ticket_id"] for r in replies}) == 1
    assert len(tickets(receiver)) == 1


def test_a_room_posting_distinct_keys_at_once_gets_one_ticket_each(receiver):
    replies = at_once(CLIENTS, lambda i: post(receiver, f"title {i}", key=f"room:{i}"))
    no_errors(replies)
    assert [r.status for r in replies] == [201] * CLIENTS
    given = {f"room:{i}": r.json()["ticket_id"] for i, r in enumerate(replies)}
    stored = {t["key"]: t["ticket_id"] for t in tickets(receiver)}
    assert stored == given
    assert len(set(given.values())) == CLIENTS


def test_a_locked_database_gets_503_json_and_the_same_request_succeeds_later(lab, tmp_path):
    server = ReceiverProcess(
        dict(lab, RECEIVER_BUSY_TIMEOUT_S=str(BUSY_TIMEOUT_S)), tmp_path / "log"
    )
    server.start()
    try:
        holder = sqlite3.connect(lab["RECEIVER_DB"], isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, for longer than we wait
        busy = at_once(8, lambda i: post(server, key=f"busy:{i}"))
        no_errors(busy)  # answered, not dropped
        for reply in busy:
            assert_error(reply, 503, "busy", "retry with the same Idempotency-Key")
            assert reply.headers["retry-after"] == "1"
        holder.execute("ROLLBACK")
        holder.close()
        retried = at_once(8, lambda i: post(server, key=f"busy:{i}"))
        no_errors(retried)
        assert [r.status for r in retried] == [201] * 8
        assert len(tickets(server)) == 8
    finally:
        server.stop()


def test_two_receivers_on_one_file_make_one_ticket_per_key(lab, tmp_path):
    """Two labs/receiver.py processes share a database file (WAL serves several processes) and get
    the same keys at the same moments. BEGIN IMMEDIATE takes the write lock before the lookup, so
    one process waits for the other's commit and then finds its ticket. A deferred BEGIN
    reads first: both processes can miss the lookup, and SQLite then refuses the write of
    the one whose snapshot is stale (SQLITE_BUSY: a 503 here, dozens of them a run)."""
    env = dict(lab, RECEIVER_BUSY_TIMEOUT_S=str(PAIR_BUSY_TIMEOUT_S))
    port = free_port()
    other = dict(env, PORT=str(port), API_URL=f"http://127.0.0.1:{port}")
    pair = [
        ReceiverProcess(env, tmp_path / "first.log").start(),
        ReceiverProcess(other, tmp_path / "second.log").start(),
    ]
    try:
        keys = [f"pair:{n}" for n in range(PAIR_KEYS)]
        # Thread i of each receiver posts keys i, i + PAIR_CLIENTS, ...: each key reaches both
        # processes at about the same moment, from one thread of each.
        walks = at_once(
            2 * PAIR_CLIENTS,
            lambda i: [(key, post(pair[i % 2], key=key)) for key in keys[i // 2 :: PAIR_CLIENTS]],
        )
        no_errors(walks)
    finally:
        for server in pair:
            server.stop()
    answers = [answer for walk in walks for answer in walk]
    assert len(answers) == 2 * PAIR_KEYS
    statuses = Counter(reply.status for _, reply in answers)
    assert set(statuses) == {200, 201} and statuses[201] == PAIR_KEYS, statuses  # no 503, no 500
    named = {}
    for key, reply in answers:
        named.setdefault(key, set()).add(reply.json()["ticket_id"])
    assert all(len(ids) == 1 for ids in named.values()), named  # both answers, one ticket
    with closing(sqlite3.connect(lab["RECEIVER_DB"])) as db:
        rows = db.execute("SELECT operation_key, id FROM tickets").fetchall()
    assert sorted(rows) == sorted((key, ids.pop()) for key, ids in named.items())


def test_every_acknowledged_ticket_survives_a_sigkill_under_load(lab, tmp_path):
    server = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    acked, lock = {}, threading.Lock()  # key -> the ticket id its client was told

    def client(n):
        for i in range(MAX_POSTS_PER_CLIENT):
            key = f"load:{n}:{i}"
            try:
                reply = post(server, key=key)
            except OSError:  # refused, reset or cut short: the receiver is gone
                return
            if reply.status in (200, 201):
                with lock:
                    acked[key] = reply.json()["ticket_id"]

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(acked) >= ACKS_BEFORE_KILL, LOAD_DEADLINE_S, "load under way")
    finally:
        server.kill()
        for thread in threads:
            thread.join(REPLY_DEADLINE_S * 2)
    assert server.proc.returncode == -signal.SIGKILL

    restarted = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    try:
        stored = {t["key"]: t["ticket_id"] for t in tickets(restarted)}
        lost = {key: ticket for key, ticket in acked.items() if stored.get(key) != ticket}
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged tickets lost or changed"
        key, ticket = next(iter(acked.items()))
        assert post(restarted, key=key).json() == {"ticket_id": ticket, "created": False}
    finally:
        restarted.stop()


def test_a_ticket_survives_a_sigkill_right_after_its_answer(lab, tmp_path):
    # Under load the next request's commit can hide a late commit; alone, nothing hides it.
    server = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    ticket = post(server, key="case-8").json()["ticket_id"]
    server.kill()
    again = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    try:
        assert tickets(again, "case-8") == [
            {"ticket_id": ticket, "key": "case-8", "payload": {"title": TITLE}}
        ]
    finally:
        again.stop()


def test_keys_survive_a_restart(lab, tmp_path):
    server = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    ticket = post(server, key="case-7").json()["ticket_id"]
    assert server.stop() == 0
    again = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    try:
        assert post(again, key="case-7").json() == {"ticket_id": ticket, "created": False}
        assert post(again, "Another title", key="case-7").status == 409
    finally:
        again.stop()


def test_sigterm_ends_the_receiver_despite_a_stalled_client(lab, tmp_path):
    """SIGTERM does not wait for a client stalled mid-request (its thread is a daemon). The
    staller's request deadline is set far past the hang guard, so the receiver exits before the
    stalled request could end: an order, not a speed (how fast it stops: make bench)."""
    env = dict(lab, RECEIVER_REQUEST_TIMEOUT_S=str(100 * HANG_GUARD_S))
    server = ReceiverProcess(env, tmp_path / "receiver.log").start()
    try:
        with socket.create_connection(("127.0.0.1", port_of(server))) as staller:
            staller.sendall(b"POST /tickets HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")
            post(server)  # accepted after the staller: the staller's thread is waiting now
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(HANG_GUARD_S) == 0  # a hang guard (TimeoutExpired)
            staller.settimeout(HANG_GUARD_S)
            try:
                answer = staller.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # its request never ended: closed unanswered by the exit
    finally:
        server.stop()
    assert (tmp_path / "receiver.log").read_text().endswith("receiver: stopped\n")


def open_files(pid):
    """Targets of the process's open file descriptors ("socket:[...]", file paths)."""
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:  # closed while we looked
            pass
    return sorted(targets)


@pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="lists open files from /proc (Linux only)"
)
def test_open_file_handles_do_not_grow_with_traffic(receiver, lab):
    pid, database = receiver.proc.pid, Path(lab["RECEIVER_DB"]).name

    def traffic(n):
        post(receiver, key=f"fd:{n}")  # a new ticket
        post(receiver, key=f"fd:{n}")  # a replay
        tickets(receiver, f"fd:{n}")
        request(receiver, "POST", "/tickets", b"{", [("Idempotency-Key", "x")])  # a 400
        request(receiver, "GET", "/health")

    def settled(limit):  # the sockets of answered requests are closed (the listener stays)
        return lambda: len(open_files(pid)) <= limit

    traffic("warm-up")  # SQLite opens the -wal and -shm files on first use
    sockets_now = sum(f.startswith("socket:") for f in open_files(pid))
    wait_until(settled(len(open_files(pid)) - sockets_now + 1), FD_SETTLE_DEADLINE_S, "idle")
    before = open_files(pid)
    for n in range(ROUNDS_OF_TRAFFIC):
        traffic(n)
    assert [f for f in open_files(pid) if database in f] == [f for f in before if database in f]
    wait_until(settled(len(before)), FD_SETTLE_DEADLINE_S, f"open files back to {before}")


def test_stalled_uploads_do_not_block_other_clients(receiver):
    stallers = []
    try:
        for _ in range(STALLERS):
            sock = socket.create_connection(("127.0.0.1", port_of(receiver)))
            sock.sendall(
                b"POST /tickets HTTP/1.0\r\nIdempotency-Key: slow\r\nContent-Length: 60\r\n\r\n{"
            )
            stallers.append(sock)
        reply = post(receiver, key="quick")  # accepted after every staller
        assert reply.status == 201
        assert [t["key"] for t in tickets(receiver)] == ["quick"]
        for sock in stallers:  # still waiting for their own answer: served side by side
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in stallers:
            sock.close()
