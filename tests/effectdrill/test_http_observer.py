"""The drill's HTTP observer: the requests a graph sends, recorded in the crash child and the
resume, against a real receiver (labs/receiver.py) with real forks and SIGKILLs.

tests/effectdrill_graphs/outbound.py sends one POST /tickets per node: keyed on the thread
(book, by urllib), without a key (notify, by requests), under a fresh uuid4 (remind, by httpx).
tests/effectdrill_graphs/httpx2graph.py sends through httpx2, sync and async; rawsocket.py through a
client the observer does not see.
Which repeat each crash point makes follows from that: a kill before a node's writes are saved
runs the node again.
"""

import json
import os
import sys

import pytest
from effectdrill_graphs import aiohttpgraph, asyncclient, httpx2graph, notices
from effectdrill_graphs import mailer as mailer_graph
from effectdrill_graphs import outbound as trips

import effectdrill
from effectdrill.api import HTTP_SAW_NOTHING
from effectdrill.outbound import NEW_KEY, NO_KEY, SAME_KEY
from tools.local import ROOT, run_command

TESTS = str(ROOT / "tests")
REPEAT = {"thread": SAME_KEY, None: NO_KEY, "fresh": NEW_KEY}  # the key a node sends -> repeat


def resent_at():
    """Each node's repeat, at the kill just before its writes are saved (from the graph)."""
    return {node: REPEAT[key] for node, key in trips.KEYS.items()}


def writes_of(point):
    """The node whose writes a crash point is about to save, or None for a checkpoint."""
    words = point.split()
    return words[1] if words[0] == "put_writes" else None


@pytest.fixture
def api(receiver, monkeypatch):
    monkeypatch.setenv("API_URL", receiver.url)
    return receiver


def test_repeats_the_observer_cannot_see_are_found_and_fail_the_drill(api):
    report = effectdrill.drill(trips.build, {"trip": "{thread}"}, trips.observe_booked)

    found = {
        writes_of(row.point): [r["repeat"] for r in row.requests]
        for row in report.rows
        if row.requests
    }
    assert found == {node: [repeat] for node, repeat in resent_at().items()}
    assert set(trips.CLIENTS.values()) == {"urllib", "requests", "httpx"}  # one node each
    for row in report.rows:
        for repeat in row.requests:
            assert repeat["endpoint"] == "POST /tickets"
            assert repeat["sent"] == [4] and repeat["clean"] == 3  # the node's request, twice
            assert repeat["counted"] == (repeat["repeat"] == SAME_KEY)
    assert report.duplicates == []  # the observer saw nothing repeat...
    assert report.requests["not counted"] == 2 and not report.ok  # ...the drill did
    # a 120-column terminal: the requests block too, its long cells wrapped between words
    *tables, summary = report.table().splitlines()  # the summary line is a sentence
    assert max(map(len, tables)) <= 120 and "requests sent again" in "\n".join(tables)
    table = report.table(width=200)  # wide enough for each cell on one line
    assert "REPEATED WITHOUT A KEY, NOT COUNTED by the observer" in table
    assert "REPEATED UNDER A NEW KEY, NOT COUNTED by the observer" in table
    assert table.endswith("2 repeated requests not counted by the observer")


def test_an_observer_that_counts_them_makes_them_duplicates(api):
    report = effectdrill.drill(trips.build, {"trip": "{thread}"}, trips.observe_all)

    unkeyed = {node for node, repeat in resent_at().items() if repeat != SAME_KEY}
    assert {writes_of(f["point"]) for f in report.duplicates} == unkeyed
    resent = {writes_of(row.point): [r["repeat"] for r in row.requests] for row in report.rows}
    assert {node: kinds for node, kinds in resent.items() if kinds} == {
        node: [repeat] for node, repeat in resent_at().items()
    }
    assert report.requests["not counted"] == 0
    assert all(r["counted"] for row in report.rows for r in row.requests)


def test_cli_observe_http_drills_the_requests_themselves(api, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = os.environ | {"PYTHONPATH": TESTS, "API_URL": api.url, "TMPDIR": str(temp)}
    done = run_command(
        [sys.executable, "-m", "effectdrill", "effectdrill_graphs.outbound:build", "--json"]
        + ["--input", '{"trip": "{thread}"}', "--observe", "http"],
        env=env,
    )

    assert done.returncode == 1, done.stderr
    *rows, summary = [json.loads(line) for line in done.stdout.splitlines()]
    # One key per keyed request, one effect per request without: book 1, notify 1, remind 1.
    assert summary["clean"] == {"POST /tickets": 3}
    unkeyed = {node for node, repeat in resent_at().items() if repeat != SAME_KEY}
    assert {writes_of(f["point"]) for f in summary["duplicates"]} == unkeyed
    assert {f["count"] for f in summary["duplicates"]} == {4}
    assert summary["requests"]["not counted"] == 0
    assert list(temp.iterdir()) == []  # the request log's folder is gone, with the drill's


def test_httpx2_requests_are_seen_sync_and_async(api):
    """openai 3.x and langsmith send through httpx2, not httpx: an observer that missed it
    drilled such a graph green (no effect in the clean run, nothing to repeat)."""
    report = effectdrill.drill(httpx2graph.build, {"order": "{thread}"}, "http")

    assert report.clean == {"sync": {"POST /tickets": 2}}  # send's and asend's
    assert {writes_of(f["point"]) for f in report.duplicates} == {"send", "asend"}
    assert {f["count"] for f in report.duplicates} == {3}
    assert not report.ok


@pytest.mark.parametrize("build", [aiohttpgraph.build_sync, aiohttpgraph.build_async])
def test_aiohttp_requests_are_seen_sync_and_async(api, build):
    """aiohttp's ClientSession, run by asyncio.run in a sync node and awaited in an async one:
    its POST is the clean run's effect, and a kill before send's writes sends it again."""
    report = effectdrill.drill(build, {"order": "{thread}"}, "http")

    assert report.clean == {"sync": {"POST /tickets": 1}}
    assert [writes_of(f["point"]) for f in report.duplicates] == ["send"]
    (resent,) = [r for row in report.rows for r in row.requests]
    assert (resent["repeat"], resent["same_body"], resent["in_flight"]) == (NO_KEY, [True], [0])
    assert not report.ok


def test_the_observer_patches_aiohttp_only_where_the_graph_imported_it():
    """Importing aiohttp costs about 0.3 s a drill: the observer patches it when the graph's
    modules imported it (as the test graph above does at its top), and never imports it."""
    check = (
        "import sys\nfrom effectdrill import outbound\n"
        "if sys.argv[1] == 'imported':\n    import aiohttp\n"
        "with outbound.recording_requests():\n"
        "    aiohttp = sys.modules.get('aiohttp')\n"
        "    print(aiohttp is not None and aiohttp.ClientRequest.send.__name__)\n"
    )
    for imported, seen in (("imported", "recording_send"), ("not", "False")):
        done = run_command([sys.executable, "-c", check, imported], cwd=ROOT)
        assert (done.returncode, done.stdout.strip()) == (0, seen), done.stderr


def test_a_clean_run_the_http_observer_saw_nothing_of_is_not_a_green_drill(api, tmp_path):
    """An application whose effects go through a client the observer does not see (a raw
    socket, say) drilled green: 0 duplicates, exit 0, for an appointment booked twice."""
    env = os.environ | {"PYTHONPATH": TESTS, "API_URL": api.url}
    done = run_command(
        [sys.executable, "-m", "effectdrill", "effectdrill_graphs.rawsocket:build"]
        + ["--input", '{"order": "{thread}"}', "--observe", "http"],
        env=env,
    )

    assert done.returncode == 2, done.stdout
    assert done.stderr.splitlines() == ["effectdrill: " + HTTP_SAW_NOTHING]
    assert done.stdout == ""  # no table: no row could have shown a repeat
    assert [t["payload"]["title"] for t in trips.tickets()][-1].endswith("-sync-clean")  # sent


def test_ignored_hosts_are_left_out(api):
    host = api.url.removeprefix("http://")

    report = effectdrill.drill(
        trips.build, {"trip": "{thread}"}, trips.observe_booked, http_ignore=[host + "/tick"]
    )

    assert report.requests["recorded"] == 0 and report.ok


@pytest.fixture
def mailer(monkeypatch):
    """A provider on a free loopback port: a model that answers, and messages sent once per
    key (POST /v1/messages/ID/send); GET /sent/ID says how many times ID was sent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    sent = {}

    class Provider(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client may send again on a connection

        def setup(self):
            super().setup()
            server.connections += 1

        def do_POST(self):
            server.requests += 1
            self.rfile.read(int(self.headers["Content-Length"]))
            parts = self.path.split("/")
            if self.path.startswith("/v1/messages/"):
                sent.setdefault(parts[3], set()).add(self.headers["Idempotency-Key"])
            self.answer({"text": "hello"})

        def do_GET(self):
            server.requests += 1
            self.answer({"sent": len(sent.get(self.path.split("/")[2], ()))})

        def answer(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    server.daemon_threads, server.connections, server.requests = True, 0, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MAILER_URL", f"http://127.0.0.1:{server.server_address[1]}")
    yield server
    server.shutdown()
    server.server_close()


def test_paths_made_from_the_thread_id_are_one_endpoint_and_globs_leave_a_model_out(mailer):
    report = effectdrill.drill(
        mailer_graph.build,
        {"thread": "{thread}"},
        mailer_graph.observe,
        http_ignore=["127.0.0.1:*/v1/chat/*"],
    )

    assert report.ok, report.table()  # the keyed send, resent with its key: no finding
    resent = [r for row in report.rows for r in row.requests]
    assert {r["endpoint"] for r in resent} == {"POST /v1/messages/msg-{thread}/send"}
    assert {r["repeat"] for r in resent} == {SAME_KEY}
    assert report.requests["not counted"] == 0
    again = sum(r["sent"][0] - r["clean"] for r in resent)  # the send before its writes
    assert report.requests["recorded"] == 1 + len(report.rows) + again  # a send a run, no chat


def test_a_thread_id_in_the_query_and_body_is_taken_out_before_requests_are_compared(mailer):
    """notify (requests: urllib3 sends the body after the headers) and confirm (httpx) carry the
    thread id in their query and body only: every run's request is the same request, so only a
    kill before notify's writes repeats anything, and that repeat is the same notice again."""
    report = effectdrill.drill(notices.build, {"thread": "{thread}"}, "http")

    notice, confirmation = (
        "POST /v1/notices?message=msg-{thread}",
        "POST /v1/confirmations?message=msg-{thread}",
    )
    assert report.clean == {"sync": {notice: 1, confirmation: 1}}
    assert [(f["point"], f["effect"]) for f in report.duplicates] == [
        ("put_writes notify [branch:to:confirm, notified]", notice)
    ]
    assert report.missing == []
    resent = {(r["endpoint"], r["repeat"]): r for row in report.rows for r in row.requests}
    assert set(resent) == {(notice, NO_KEY), (confirmation, SAME_KEY)}
    assert all(r["same_body"] == [True] for r in resent.values())  # the same request again


@pytest.mark.fast
def test_a_request_the_kill_left_unanswered_is_in_flight_not_a_repeat():
    """The crash child sent it and died before its answer (it may never have been taken); the
    resume sent it again, answered: "in flight", counted, never "REPEATED WITHOUT A KEY"."""
    from effectdrill.outbound import IN_FLIGHT, Request, repeated_requests

    def post(answered=True):
        return Request("t", "POST", "127.0.0.1:1", "/v1/messages/msg-{thread}/send", None, answered)

    (found,) = repeated_requests([post()], [[post(answered=False), post()]], counted=False)
    assert (found["repeat"], found["counted"], found["in_flight"]) == (IN_FLIGHT, True, [1])
    (found,) = repeated_requests(
        [post()], [[post(), post()]], counted=False
    )  # both answered: sent twice
    assert (found["repeat"], found["counted"]) == (NO_KEY, False)


def test_an_async_client_made_at_import_works_in_every_run(mailer):
    """One httpx.AsyncClient for the whole process, its connections kept alive and pooled: the
    drill's runs share one event loop, and each crash child makes its own connections."""
    report = effectdrill.drill(
        asyncclient.build,
        {"thread": "{thread}"},
        asyncclient.observe,
        http_ignore=["*/v1/chat/*"],  # the model's answer: a repeat changes nothing
    )

    assert report.failed == [] and report.clean == {"sync": {"sent": 1}}
    assert report.ok  # keyed: resent with its key at most
    assert mailer.connections < mailer.requests  # connections were kept alive and reused
