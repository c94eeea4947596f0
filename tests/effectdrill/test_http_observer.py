"""The drill's HTTP observer: the requests a graph sends, recorded in the crash child and the
resume, against a real receiver (api.py) with real forks and SIGKILLs.

tests/effectdrill_graphs/outbound.py sends one POST /tickets per node: keyed on the thread
(book, by urllib), without a key (notify, by requests), under a fresh uuid4 (remind, by httpx).
Which repeat each crash point makes follows from that: a kill before a node's writes are saved
runs the node again.
"""

import json
import os
import sys

import pytest
from effectdrill_graphs import outbound as trips

import effectdrill
from effectdrill.outbound import NEW_KEY, NO_KEY, SAME_KEY
from labs.tools.local import ROOT, run

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
    table = report.table()
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
    done = run(
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


def test_ignored_hosts_are_left_out(api):
    host = api.url.removeprefix("http://")

    report = effectdrill.drill(
        trips.build, {"trip": "{thread}"}, trips.observe_booked, http_ignore=[host + "/tick"]
    )

    assert report.requests["recorded"] == 0 and report.ok
