"""What a slow, greedy or careless client can hold, and how the receiver starts and stops.

Real labs/receiver.py processes on loopback; every loop is bounded in count and time.
"""

import json
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pytest
from receiver_helpers import (
    assert_error,
    garble,
    port_of,
    post,
    read_reply,
    request,
    run_api,
    tickets,
)

from tools.local import ReceiverProcess, wait_until

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

REQUEST_TIMEOUT_S = 1.0  # the receiver's deadline for a whole request in these tests
MAX_CONNECTIONS = 4  # the receiver's connection cap in these tests
HANG_GUARD_S = 60.0  # a wait only a hang reaches, however busy the machine: not a speed bound
TRICKLE_BYTES = 1200  # at a byte each 50 ms: a minute, far past the request deadline
LINUX_ONLY = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads thread counts from /proc (Linux)"
)


@pytest.fixture
def limited(lab, tmp_path):
    env = dict(
        lab,
        RECEIVER_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S),
        RECEIVER_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    )
    server = ReceiverProcess(env, tmp_path / "receiver.log").start()
    yield server
    server.stop()


def connect(server):
    return socket.create_connection(("127.0.0.1", port_of(server)), timeout=10)


def test_a_client_trickling_its_headers_is_cut_off_at_the_request_deadline(limited):
    """The deadline is for the whole request, not for each read: a client that sends a byte
    now and then is cut off long before its request is complete (a minute of trickling)."""
    sent, closed = 0, False
    trickle = b"POST /tickets HTTP/1.0\r\nContent-Length: 2\r\nX-Slow: " + b"y" * TRICKLE_BYTES
    with connect(limited) as sock:
        try:
            for byte in trickle:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.05)  # the client's pace, not a wait for the server
                if select.select([sock], [], [], 0)[0] and sock.recv(1024) == b"":
                    closed = True  # the server hung up
                    break
        except (BrokenPipeError, ConnectionResetError):
            closed = True
    assert closed and sent < len(trickle), f"the server read {sent} trickled bytes and listened on"
    assert post(limited).status == 201  # and it serves others


@pytest.fixture
def capped(lab, tmp_path):
    """The connection cap with a request deadline no test waits out: the held connections stay
    held for as long as the test looks (with `limited`'s 1 s, a loaded machine could see them
    cut off before it saw the receiver full)."""
    env = dict(
        lab,
        RECEIVER_REQUEST_TIMEOUT_S=str(10 * HANG_GUARD_S),
        RECEIVER_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    )
    server = ReceiverProcess(env, tmp_path / "receiver.log").start()
    yield server
    server.stop()


def test_past_the_connection_cap_a_client_gets_a_quick_503_not_a_thread(capped):
    held = [connect(capped) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:  # each is being served: a thread waits for its request
            sock.sendall(b"GET /tickets HTTP/1.0\r\n")
        wait_until(lambda: full(capped), HANG_GUARD_S, "the receiver to refuse one more")
        with connect(capped) as extra:
            reply = read_reply(extra)
        assert_error(reply, 503, "too many connections", "retry")
        assert reply.headers["retry-after"] == "1"
    finally:
        for sock in held:
            sock.close()
    replies = []  # 503 while a closed connection's thread has not yet let its slot go

    def listed():
        replies.append(request(capped, "GET", "/tickets"))
        return replies[-1].status != 503

    wait_until(listed, HANG_GUARD_S, "the slots to be free again")
    assert replies[-1].status == 200 and replies[-1].json()["tickets"] == [], replies[-1]


def full(server):
    try:
        with connect(server) as sock:
            sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            return read_reply(sock).status == 503
    except OSError:
        return False


def test_an_oversized_body_gets_its_413_read_in_full_not_a_reset(limited):
    body = b"x" * 300_000  # far past the limit, and more than a socket buffer holds
    head = b"POST /tickets HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body)
    with connect(limited) as sock:
        sender = threading.Thread(target=lambda: sock.sendall(head + body), daemon=True)
        sender.start()
        reply = read_reply(sock)
        sender.join(10)
    assert_error(reply, 413, "4096 bytes")
    assert tickets(limited) == []


@LINUX_ONLY
def test_sigterm_ends_the_receiver_while_the_database_is_locked(lab, tmp_path):
    """A POST waits for a write lock another process holds; SIGTERM ends the receiver while
    the lock is still held. The POST's wait (RECEIVER_BUSY_TIMEOUT_S) is set far past the hang
    guard, so a receiver that waited for it could not exit in time: the exit comes first, an
    order, not a speed (how fast it stops: make bench)."""
    env = dict(lab, RECEIVER_BUSY_TIMEOUT_S=str(100 * HANG_GUARD_S))
    server = ReceiverProcess(env, tmp_path / "receiver.log").start()
    holder = sqlite3.connect(lab["RECEIVER_DB"], isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        pid = server.proc.pid
        wait_until(lambda: threads(pid) == 1, HANG_GUARD_S, "the receiver idle (main thread only)")
        waiting = threading.Thread(target=lambda: exchange_quietly(server), daemon=True)
        waiting.start()  # a POST whose transaction now waits for the lock
        wait_until(lambda: threads(pid) == 2, HANG_GUARD_S, "the POST's thread")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(HANG_GUARD_S) == 0  # a hang guard (TimeoutExpired)
        assert holder.in_transaction  # the lock was held all along: the exit did not wait for it
    finally:
        holder.close()
        server.stop()


def threads(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("Threads:")[1].split()[0])


def exchange_quietly(server):
    try:
        post(server, key="locked")
    except OSError:
        pass  # the receiver stopped before answering: that is the point


def test_help_prints_usage_and_the_settings_and_starts_nothing(lab, tmp_path):
    done = run_api(dict(lab, RECEIVER_DB=str(tmp_path / "never" / "r.sqlite")), "--help")
    assert done.returncode == 0
    assert "usage: labs.receiver" in done.stdout and "RECEIVER_MAX_CONNECTIONS" in done.stdout
    assert "FAILPOINTS" in done.stdout
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "setting, words",
    [
        ({"PORT": "eighty"}, ["PORT='eighty'", "whole number"]),
        ({"PORT": "70000"}, ["PORT='70000'", "below 65536"]),
        ({"RECEIVER_BUSY_TIMEOUT_S": "-1"}, ["RECEIVER_BUSY_TIMEOUT_S", "above 0"]),
        ({"RECEIVER_REQUEST_TIMEOUT_S": "soon"}, ["RECEIVER_REQUEST_TIMEOUT_S", "a number"]),
        ({"RECEIVER_MAX_CONNECTIONS": "0"}, ["RECEIVER_MAX_CONNECTIONS", "above 0"]),
        ({"FAILPOINTS": "after-ack=kill"}, ["unknown point 'after-ack'", "before-answer"]),
        ({"FAILPOINTS": "before-answer=explode"}, ["unknown action 'explode'", "drop-answer"]),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(lab, setting, words):
    done = run_api(dict(lab, **setting))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def test_a_receiver_db_that_is_not_sqlite_is_one_line_and_exit_2(lab, tmp_path):
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("my notes, not a database\n" * 100)
    done = run_api(dict(lab, RECEIVER_DB=str(not_a_db)))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "RECEIVER_DB" in done.stderr and "cannot be used" in done.stderr
    assert not_a_db.read_text() == "my notes, not a database\n" * 100


def another_programs_file(path):
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO orders (total) VALUES (9.5)")
        db.commit()


def langgraph_checkpoints(path):
    """The workflow's checkpoint file, as LangGraph's SqliteSaver makes it (in WAL mode)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    with closing(sqlite3.connect(path, check_same_thread=False)) as db:
        SqliteSaver(db).setup()


def a_tickets_table_of_its_own(path):
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
        db.commit()


def tickets_with_no_unique_key(path):
    """The receiver's columns, without the UNIQUE that keeps one ticket per key."""
    with closing(sqlite3.connect(path)) as db:
        db.execute(
            "CREATE TABLE tickets (id INTEGER PRIMARY KEY, operation_key TEXT, "
            "payload TEXT NOT NULL, created_at REAL)"
        )
        db.commit()


@pytest.mark.parametrize(
    "make,words",
    [
        (another_programs_file, ["not the receiver's (orders)"]),
        (langgraph_checkpoints, ["checkpoints, writes", "LangGraph", "CHECKPOINT_DB"]),
        (a_tickets_table_of_its_own, ["tickets table is not the receiver's", "title"]),
        (tickets_with_no_unique_key, ["tickets table", "no UNIQUE operation_key"]),
    ],
    ids=["another program's", "LangGraph's checkpoints", "its own tickets", "no UNIQUE key"],
)
def test_a_receiver_db_of_another_program_is_refused_before_anything_is_written(lab, make, words):
    db = Path(lab["RECEIVER_DB"])
    db.parent.mkdir(parents=True)
    make(db)
    before = db.read_bytes(), db.stat().st_mtime_ns, sorted(db.parent.iterdir())
    done = run_api(lab)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"receiver: RECEIVER_DB {str(db)!r} cannot be used: ")
    assert all(word in done.stderr for word in words), done.stderr
    assert "Nothing was written to it" in done.stderr
    # byte for byte, never rewritten, and no -wal or -shm file left beside it
    assert (db.read_bytes(), db.stat().st_mtime_ns, sorted(db.parent.iterdir())) == before


def test_a_checkpoint_file_in_use_is_refused_though_its_tables_are_only_in_its_wal(lab):
    """A workflow that has the file open: LangGraph's tables are in the WAL, not yet in the
    file itself (no checkpoint has copied them), and the read-only look still sees them."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    db = Path(lab["RECEIVER_DB"])
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db, check_same_thread=False)) as in_use:
        SqliteSaver(in_use).setup()
        before = db.read_bytes(), db.stat().st_mtime_ns
        assert b"checkpoints" not in before[0]  # the file itself: a header, no tables yet
        done = run_api(lab)
        assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert done.returncode == 2 and "checkpoints, writes" in done.stderr, done.stderr


def test_an_empty_receiver_db_file_is_a_new_database(lab, tmp_path):
    db = Path(lab["RECEIVER_DB"])
    db.parent.mkdir(parents=True)
    db.touch()  # `touch`ed by hand, or left by a tool that creates before it writes
    server = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    try:
        assert post(server, key="into-an-empty-file").status == 201
    finally:
        server.stop()


def test_a_taken_port_is_one_line_naming_it_and_exit_3(lab):
    with socket.socket() as other:  # anything at all on the port, not only another receiver
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = run_api(dict(lab, PORT=str(port)))
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "set PORT" in done.stderr


def test_port_0_takes_a_free_port_and_says_which(lab, tmp_path):
    env = dict(lab, PORT="0")
    log = tmp_path / "receiver.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "labs.receiver"], env=env, stderr=stderr)
    try:
        wait_until(lambda: "listening on" in log.read_text(), HANG_GUARD_S, "the listening line")
        line = log.read_text().splitlines()[0]
        port = int(line.split("listening on 127.0.0.1:")[1].split(",")[0])
        assert port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            assert json.loads(read_reply(sock).body) == {"ok": True}
    finally:
        proc.terminate()
        proc.wait(HANG_GUARD_S)


def test_killed_between_commit_and_answer_the_ticket_is_there_for_the_retry(lab, tmp_path):
    """FAILPOINTS=after-commit=kill: the receiver dies in its own crash window, after COMMIT and
    before the answer. The client hears nothing; the restarted receiver has the ticket, and the
    same key finds it instead of making a second."""
    log = tmp_path / "receiver.log"
    dying = ReceiverProcess(dict(lab, FAILPOINTS="after-commit=kill"), log).start()
    with pytest.raises(ConnectionError):
        post(dying, key="case-window")
    assert dying.proc.wait(HANG_GUARD_S) == -signal.SIGKILL
    again = ReceiverProcess(lab, log).start()
    try:
        [ticket] = tickets(again, "case-window")
        retry = post(again, key="case-window")
        assert retry.json() == {"ticket_id": ticket["ticket_id"], "created": False}
        assert len(tickets(again)) == 1
    finally:
        again.stop()


def test_a_database_deleted_under_the_receiver_gets_503s_that_say_restart(lab, tmp_path):
    """`rm -r data` (or `make reset`) while the receiver runs: SQLite keeps the deleted file open
    and would go on answering from it. The receiver notices, serves nothing from it, and says
    what to do, with one line in its log."""
    log = tmp_path / "receiver.log"
    server = ReceiverProcess(lab, log).start()
    try:
        post(server, key="before-reset")
        shutil.rmtree(Path(lab["RECEIVER_DB"]).parent)
        replies = [
            request(server, "GET", "/tickets"),
            post(server, key="before-reset"),
            post(server, key="after-reset"),
            request(server, "GET", "/health"),
        ]
        for reply in replies:
            assert_error(reply, 503, "deleted", "restart the receiver")
        assert not Path(lab["RECEIVER_DB"]).exists()  # nothing was written anywhere
        assert server.stop() == 0
    finally:
        server.stop()
    noticed = [line for line in log.read_text().splitlines() if "was deleted" in line]
    assert len(noticed) == 1, noticed
    restarted = ReceiverProcess(lab, log).start()  # the fix the answer names
    try:
        assert tickets(restarted) == []
        assert post(restarted, key="before-reset").status == 201
    finally:
        restarted.stop()


def test_a_database_replaced_under_the_receiver_is_noticed_too(lab, tmp_path):
    """The path now names another file (a reset, then something that made a new database)."""
    server = ReceiverProcess(lab, tmp_path / "receiver.log").start()
    try:
        post(server, key="old")
        db = Path(lab["RECEIVER_DB"])
        shutil.rmtree(db.parent)
        db.parent.mkdir()
        sqlite3.connect(db).close()
        assert_error(request(server, "GET", "/tickets?key=old"), 503, "deleted or replaced")
    finally:
        server.stop()


def test_a_damaged_database_is_503_with_no_retry_advice_and_one_log_line(lab, tmp_path):
    """A disk fault garbles the database: not busy, so no Retry-After and no "retry", whatever
    the route; /health turns 503 too, and the log says it once."""
    log = tmp_path / "receiver.log"
    server = ReceiverProcess(lab, log).start()
    for n in range(10):  # tickets of 200 characters, on pages beyond the first
        post(server, "x" * 200, key=f"case-{n}:ticket")
    server.stop()
    assert garble(lab["RECEIVER_DB"]) > 3
    server.start()  # the schema on the first page is whole: it starts, /health says 200
    try:
        replies = [
            post(server, "x" * 200, key="case-1:ticket"),  # a replay: its lookup meets the damage
            request(server, "GET", "/health"),  # the damage was met: not healthy
            post(server, key="case-new:ticket"),
            request(server, "GET", "/tickets"),
            request(server, "POST", "/refunds", {"ticket_id": 1}),
        ]
        for reply in replies:
            assert_error(reply, 503, "is damaged", "operator must act", "restore", "restart")
            assert "retry" not in reply.json()["error"].lower(), reply
            assert "retry-after" not in reply.headers, reply
        assert "malformed" in replies[0].json()["error"]  # SQLite's own word, passed on
        # The workflow's client hears it once: a 503 without Retry-After is not retried.
        import workflow

        before = answers_503(server)
        assert workflow.main(["post", "--operation", "case-new:ticket"], dict(lab)) == 1
        assert answers_503(server) == before + 1
    finally:
        server.stop()
    noticed = [line for line in log.read_text().splitlines() if "is damaged" in line]
    assert len(noticed) == 1 and noticed[0].startswith("receiver: unavailable: "), noticed


def answers_503(server):
    """The 503 answers the receiver counted, from GET /metrics."""
    text = request(server, "GET", "/metrics").body.decode()
    found = [
        line for line in text.splitlines() if line.startswith('receiver_requests_total{code="503"}')
    ]
    return int(found[0].split()[-1]) if found else 0


def test_a_full_disk_is_503_that_says_so_and_the_same_request_succeeds_with_room(lab, capsys):
    """SQLITE_FULL, from a max_page_count the size of the file (a full disk, without filling
    one): "disk is full", Retry-After, one log line; once there is room the retry is a 201."""
    from labs import (
        # in this process: the test reaches the store's connection to set its limit
        receiver as lab_receiver,
    )

    server, _, _ = lab_receiver.open_lab_receiver(dict(lab, PORT="0"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}")
    try:
        with server.store.lock:
            pages = server.store.db.execute("PRAGMA page_count").fetchone()[0]
            server.store.db.execute(f"PRAGMA max_page_count = {pages}")
        replies = []
        for n in range(200):  # the tables' pages fill up within a few dozen tickets
            replies.append(post(served, "x" * 200, key=f"full-{n}"))
            if replies[-1].status != 201:
                break
        full, key = replies[-1], f"full-{len(replies) - 1}"
        assert_error(full, 503, "disk holding the ticket database", "is full", "free space")
        assert full.headers["retry-after"] == "1"
        assert_error(post(served, "x" * 200, key=key), 503, "is full")
        with server.store.lock:
            server.store.db.execute(f"PRAGMA max_page_count = {pages * 100}")  # space freed
        retry = post(served, "x" * 200, key=key)
        assert retry.status == 201, retry
        assert tickets(served, key)[0]["ticket_id"] == retry.json()["ticket_id"]
    finally:
        server.shutdown()
        server.server_close()
        server.store.close()
    logged = [line for line in capsys.readouterr().err.splitlines() if "is full" in line]
    assert len(logged) == 1, logged


def test_ctrl_c_stops_the_receiver_with_130_and_one_line(receiver, tmp_path):
    receiver.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
    assert receiver.proc.wait(HANG_GUARD_S) == 130  # a hang guard
    log = (tmp_path / "receiver.log").read_text()
    assert log.endswith("receiver: stopped\n") and "Traceback" not in log, log
