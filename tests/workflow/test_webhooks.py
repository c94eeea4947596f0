"""Lab 18: the receiver's webhooks (api.py, the sender), the workflow's endpoint (lab.py hooks) and
its inbox (inbox.py). The guide (labs/18-*.md, both backends) kills the endpoint for real between
its commit and its answer; these tests hold the rest, mostly in this process.
"""

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from conftest import require_postgres

import effects
import failpoints
import inbox
import lab
import workflow
from labs.tools.local import ROOT, lab_env

# --- the inbox, the core an engineer copies ------------------------------------------------


def check_inbox(box):
    """What Inbox.receive promises, on one backend: once, never backwards, a conflict refused."""
    assert box.receive("e2", "t1", 2, "in_progress") == inbox.Seen(first=True, applied=True)
    assert box.receive("e2", "t1", 2, "in_progress") == inbox.Seen(first=False, applied=True)
    assert box.receive("e1", "t1", 1, "opened") == inbox.Seen(first=True, applied=False)
    assert box.receive("e1", "t1", 1, "opened") == inbox.Seen(first=False, applied=False)
    assert box.state("t1") == ("in_progress", 2)  # the older event did not set it back
    assert box.receive("e3", "t1", 3, "resolved") == inbox.Seen(first=True, applied=True)
    assert box.state("t1") == ("resolved", 3) and box.state("t2") is None
    with pytest.raises(inbox.EventConflict):  # the same id with another body: not a redelivery
        box.receive("e3", "t1", 3, "opened")


@pytest.mark.fast
def test_the_inbox_applies_an_event_once_and_never_an_older_one(tmp_path):
    with inbox.open_inbox(tmp_path / "c.sqlite") as box:
        check_inbox(box)
    with inbox.open_inbox(tmp_path / "c.sqlite") as again:  # committed: another connection sees it
        assert again.receive("e3", "t1", 3, "resolved").first is False


@pytest.mark.fast
def test_a_checkpoint_file_with_the_inbox_beside_it_is_the_workflows_own():
    """workflow.py names the inbox's tables without importing inbox.py (the starter's core has
    none): a start on a CHECKPOINT_DB that `hooks` wrote to is not refused as another program's."""
    assert set(inbox.TABLES) <= workflow.OUR_TABLES


@pytest.mark.fast
def test_an_event_whose_transaction_failed_is_applied_by_its_redelivery(tmp_path):
    """A crash inside the transaction (before COMMIT) leaves neither the inbox row nor the
    status: the redelivery is the first delivery. In-process: an error raised between the two
    statements rolls both back, as a kill there would (nothing was committed)."""
    with inbox.open_inbox(tmp_path / "c.sqlite") as box:
        real_sql = box.sql

        def failing_at_the_status(statement, args=()):
            if statement.startswith("INSERT INTO inbox_subjects"):
                raise RuntimeError("killed between the inbox row and the status")
            return real_sql(statement, args)

        box.sql = failing_at_the_status
        with pytest.raises(RuntimeError):
            box.receive("e1", "t1", 1, "opened")
        box.sql = real_sql
        assert box.state("t1") is None
        assert box.receive("e1", "t1", 1, "opened") == inbox.Seen(first=True, applied=True)


def test_the_inbox_in_postgres_applies_an_event_once_from_two_connections_at_once():
    require_postgres()
    import psycopg

    from labs.tools.pg import TempPostgres

    with TempPostgres() as pg, inbox.open_inbox(pg.url) as box:
        check_inbox(box)
        with psycopg.connect(pg.url, autocommit=True) as conn:  # the tables are in that database
            assert conn.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 3
        seen, start = [], threading.Barrier(2)

        def deliver():
            with inbox.open_inbox(pg.url) as own:
                start.wait()
                seen.append(own.receive("e9", "t9", 1, "resolved"))

        deliverers = [threading.Thread(target=deliver) for _ in range(2)]
        for thread in deliverers:
            thread.start()
        for thread in deliverers:
            thread.join()
        assert sorted(seen) == [(False, True), (True, True)]  # one recorded it, one found it


# --- the endpoint: bad input first ---------------------------------------------------------


@pytest.fixture
def endpoint(tmp_path):
    """lab.py's HookHandler on a free loopback port, in this process, with no receiver (a
    malformed webhook is answered before anything is sent anywhere)."""
    with (
        inbox.open_inbox(tmp_path / "c.sqlite") as box,
        effects.open_ledger(tmp_path / "c.sqlite") as ledger,
    ):
        taker = lab.Taker("inbox", box, ledger, client=None)
        handler = type("Hook", (lab.HookHandler,), {"taker": taker, "points": {}})
        server = HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        yield f"http://127.0.0.1:{server.server_port}", box
        server.shutdown()
        server.server_close()


def post(url, body, path="/webhook"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


EVENT = {"event_id": "evt_1", "ticket_id": 1, "status": "opened", "version": 1}
MALFORMED = {
    "not JSON": (b"{", "not JSON"),
    "a list": (b"[]", "exactly event_id, status, ticket_id, version"),
    "a field missing": ({k: v for k, v in EVENT.items() if k != "version"}, "exactly"),
    "a field more": ({**EVENT, "extra": 1}, "exactly"),
    "an unknown status": ({**EVENT, "status": "closed"}, "status must be one of"),
    "a version of 0": ({**EVENT, "version": 0}, "version must be a whole number"),
    "a version as text": ({**EVENT, "version": "2"}, "version must be a whole number"),
    "a ticket as true": ({**EVENT, "ticket_id": True}, "ticket_id must be a whole number"),
    "an empty event id": ({**EVENT, "event_id": ""}, "event_id must be a string"),
    "too big": (b" " * 5000, "at most 4096 bytes"),
}


@pytest.mark.fast
@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_webhook_is_refused_with_a_json_400_that_says_why(endpoint, case):
    url, box = endpoint
    body, why = MALFORMED[case]
    status, answer = post(url, body)
    assert status == 400 and why in answer["error"], answer
    assert box.sql("SELECT COUNT(*) FROM inbox").fetchone()[0] == 0  # nothing trusted


@pytest.mark.fast
def test_the_endpoint_answers_other_paths_and_methods_in_json(endpoint):
    url, _ = endpoint
    assert post(url, EVENT, path="/hook") == (404, {"error": "webhooks are POSTed to /webhook"})
    with pytest.raises(urllib.error.HTTPError) as got:
        urllib.request.urlopen(url + "/webhook", timeout=10)
    assert got.value.code == 405 and json.load(got.value) == {"error": "POST an event to /webhook"}
    assert got.value.headers["Allow"] == "POST"
    assert post(url, EVENT) == (200, {"ok": True})  # and a good one is taken
    conflict = post(url, {**EVENT, "status": "resolved"})
    assert conflict[0] == 409 and "not a redelivery" in conflict[1]["error"]


# --- the sender and the endpoint together, against a real receiver -------------------------


class Subscriber(BaseHTTPRequestHandler):
    """A test's webhook endpoint: answers the next statuses in `answers` (then 200), keeps what
    came."""

    answers, got = [], []

    def do_POST(self):
        self.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(self.answers.pop(0) if self.answers else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def call(receiver, path, body):
    return workflow.TicketClient(receiver.url).call(path, body)


def test_the_sender_retries_a_delivery_without_a_2xx_and_keeps_it_pending_if_none_comes(
    receiver,
):
    call(receiver, "/tickets", {"title": "webhooks"})
    handler = type("Sub", (Subscriber,), {"answers": [503, 500], "got": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    try:
        assert call(receiver, "/webhooks", {"url": url}) == {"delivered": 0, "pending": 0}
        moved = call(receiver, "/progress", {"ticket_id": 1, "statuses": ["opened"]})
        assert moved["delivered"] == 1 and moved["pending"] == 0  # the third try got its 200
        assert (
            handler.got
            == [{"event_id": "evt_1", "ticket_id": 1, "status": "opened", "version": 1}] * 3
        )
        handler.answers[:] = [503] * 3  # every try of the next round fails: it stays pending
        moved = call(receiver, "/progress", {"ticket_id": 1, "statuses": ["resolved", "opened"]})
        assert moved["events"][1]["version"] == 3
        assert (moved["delivered"], moved["pending"]) == (0, 2)  # the first failed: both wait
        assert call(receiver, "/webhooks", {"url": url}) == {"delivered": 2, "pending": 0}
        assert [e["event_id"] for e in handler.got[3:]] == ["evt_2"] * 4 + ["evt_3"]
    finally:
        server.shutdown()
        server.server_close()
    for body, why in [
        ({"ticket_id": 9, "statuses": ["opened"]}, "no ticket 9"),
        ({"ticket_id": 1, "statuses": ["closed"]}, "statuses must be"),
        ({"ticket_id": 1, "statuses": []}, "statuses must be"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as got:
            call(receiver, "/progress", body)
        assert got.value.code in (400, 404) and why in json.load(got.value)["error"]
    with pytest.raises(urllib.error.HTTPError) as got:
        call(receiver, "/webhooks", {"url": "ftp://x"})
    assert got.value.code == 400 and "http://" in json.load(got.value)["error"]


def test_a_crash_after_the_commit_is_finished_by_the_redelivery_with_one_message(
    receiver, tmp_path
):
    """The window in-process: the endpoint fails after its commit (after-inbox=raise: the
    sender gets no 2xx, as from a kill there), and the sender's redeliveries neither apply the
    event again nor notify twice; an older event after it is seen and not applied. Naive, the
    same deliveries notify twice and set the status back."""
    call(receiver, "/tickets", {"title": "webhooks"})
    resolved = {"event_id": "evt_2", "ticket_id": 1, "status": "resolved", "version": 2}
    older = {"event_id": "evt_1", "ticket_id": 1, "status": "opened", "version": 1}
    client = workflow.TicketClient(receiver.url)
    with (
        inbox.open_inbox(tmp_path / "c.sqlite") as box,
        effects.open_ledger(tmp_path / "c.sqlite") as ledger,
    ):
        taker = lab.Taker("inbox", box, ledger, client)
        with failpoints.scoped({"after-inbox": "raise"}), pytest.raises(failpoints.FailpointError):
            taker.take(resolved)
        assert box.state("1") == ("resolved", 2)  # committed before the failpoint
        assert messages(receiver) == []  # and the message not sent yet
        for delivery in (resolved, resolved, older, older):
            taker.take(delivery)
        assert box.state("1") == ("resolved", 2)
        assert messages(receiver) == ["ticket 1 resolved (evt_2)"]
        naive = lab.Taker("naive", box, ledger, client)
        for delivery in (resolved, resolved, older):
            naive.take(delivery)
        assert box.state("1") == ("opened", 1)
        assert messages(receiver) == ["ticket 1 resolved (evt_2)"] * 3


def messages(receiver):
    return [m["text"] for m in call(receiver, "/messages", None)["messages"]]


def test_a_kill_between_the_message_and_its_receipt_stops_the_next_delivery(receiver, tmp_path):
    """The guide's last claim: the message is sent, its receipt not written (after-send=raise
    in Effect.perform); the redelivery cannot ask this provider, so it stops (Unsettled: the
    CLI's exit 6) and sends nothing a second time."""
    resolved = {"event_id": "evt_1", "ticket_id": 1, "status": "resolved", "version": 1}
    client = workflow.TicketClient(receiver.url)
    with (
        inbox.open_inbox(tmp_path / "c.sqlite") as box,
        effects.open_ledger(tmp_path / "c.sqlite") as ledger,
    ):
        taker = lab.Taker("inbox", box, ledger, client)
        with failpoints.scoped({"after-send": "raise"}), pytest.raises(failpoints.FailpointError):
            taker.take(resolved)
        with pytest.raises(effects.Unsettled):
            taker.take(resolved)
    assert messages(receiver) == ["ticket 1 resolved (evt_1)"]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--move", "opened,resovled"],
            "lab.py hooks: argument --move: 'resovled' is not a status",
        ),
        (["--mode", "naive", "--crash-at", "after-inbox"], "lab.py: --crash-at after-inbox is the"),
    ],
)
def test_a_hooks_mistake_is_one_line_and_a_usage_error(tmp_path, capsys, argv, line):
    """Caught before anything listens or subscribes: nothing delivered, nothing sent."""
    env = lab_env(tmp_path / "data", 9)  # port 9: nothing listens, and nothing may call it
    try:
        code = lab.main(["hooks", "--ticket", "1", *argv], env)
    except SystemExit as stop:  # argparse's own exit, as the command line gets it
        code = stop.code
    assert code == workflow.EXIT_USAGE
    (got,) = capsys.readouterr().err.splitlines()
    assert got.startswith(line), got


@pytest.mark.fast
def test_hooks_for_a_ticket_nothing_moved_says_how_to_move_it(receiver, capsys):
    assert lab.main(["hooks", "--ticket", "1"], receiver.env) == 0  # no ticket yet: none came
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "event": "ticket_status",
        "status": None,
        "ticket_id": 1,
        "version": 0,
    }
    assert err.splitlines() == [
        "lab.py: no webhook for ticket 1 yet: --move opened,resolved moves it (tickets lists "
        "the receiver's)"
    ]


def test_ctrl_c_while_hooks_waits_is_one_line_and_exit_130(tmp_path):
    """A receiver that takes the subscription and never answers; Ctrl-C (SIGINT) once it holds
    the connection: the line says that the event waits, and which command takes it."""
    import signal
    import socket
    import subprocess
    import sys

    silent = socket.create_server(("127.0.0.1", 0))
    env = lab_env(tmp_path / "data", silent.getsockname()[1])
    hooks = subprocess.Popen(
        [sys.executable, "lab.py", "hooks", "--ticket", "2"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        held, _ = silent.accept()  # hooks has subscribed and waits for the answer
        hooks.send_signal(signal.SIGINT)
        out, err = hooks.communicate(timeout=60)
    finally:
        if hooks.poll() is None:
            hooks.kill()
        silent.close()
    held.close()
    assert hooks.returncode == workflow.EXIT_INTERRUPTED and out == ""
    assert err.splitlines() == [
        "lab.py: interrupted; the receiver keeps what got no answer pending: hooks --ticket 2 "
        "takes it"
    ]
