"""The ledger on a dashboard: `labs/workers.py metrics --port 0` serves the ledger's gauges
(effects by state, the oldest open one's age) at GET /metrics, scraped over HTTP and read by
Prometheus's own text parser. Here on the SQLite lab's ledger (the Postgres one:
test_workers_ledger.py).

Real parts: the receiver, a run really killed at after-send (its row stays `requested`: the crash
window the old count missed), rows in the other states made through the ledger's own API, and the
metrics server as a process that opens the file read-only.
"""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import effects
import workflow
from labs import worker_metrics
from tools.local import ROOT, run_workflow

HANG_GUARD_S = 120  # only a hang reaches it
NO_OUTBOX = {f'outbox_messages{{state="{s}"}}': 0 for s in worker_metrics.OUTBOX_STATES}


def figures(text):
    """name{label="v"} -> value, by prometheus_client's parser (it refuses a malformed line)."""
    return {
        sample.name + "".join(f'{{{k}="{v}"}}' for k, v in sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def serve_metrics(env, tmp_path):
    err = open(tmp_path / "metrics.err", "wb")
    command = [sys.executable, "-m", "labs.workers", "metrics", "--port", "0"]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
    line = proc.stdout.readline()  # {"event": "metrics", ...} once it listens
    assert line, (tmp_path / "metrics.err").read_text()
    proc.url = f"http://127.0.0.1:{json.loads(line)['port']}/metrics"
    return proc


def scrape(url):
    with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def snapshot(path):
    """The database file, byte for byte (not -wal, -shm: any reader of a WAL file may make them)."""
    return Path(path).read_bytes()


def test_the_ledger_s_effects_by_state_and_the_oldest_open_one_are_scraped_read_only(
    lab, receiver, tmp_path
):
    db = lab["CHECKPOINT_DB"]
    missing = dict(lab, CHECKPOINT_DB=str(tmp_path / "none" / "checkpoints.sqlite"))
    server = serve_metrics(missing, tmp_path)  # no ledger yet: zeros, and no file made
    try:
        empty = figures(scrape(server.url))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(HANG_GUARD_S) == 0
    assert not (tmp_path / "none").exists()
    assert empty == {
        **{f'ledger_effects{{state="{s}"}}': 0 for s in effects.STATES},
        "ledger_oldest_open_effect_age_seconds": 0,
        **NO_OUTBOX,
    }

    before = time.time()
    killed = run_workflow(
        ["start", "--thread", "w", "--mode", "ledger", "--crash-at", "after-send"], lab
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # a ticket, and no receipt
    client = workflow.TicketClient(receiver.url, attempts=1)
    ticket = effects.Effect(
        "ticket",
        send=lambda client, request, key: client.create(request["title"], key),
        external_id=lambda answer: answer["ticket_id"],
    )
    with effects.Ledger(db) as ledger:
        assert ledger.get("case-001:open-ticket:v1").state == "requested"
        ticket.perform(ledger, "done:op", {"title": "done"}, client)  # confirmed
        for key, state in [("out:op", "unknown"), ("back:op", "released"), ("no:op", "failed")]:
            ledger.claim(key, "ticket", {"title": key})
            if state == "failed":
                ledger.refuse(key, {"status": 422, "error": "the test's refusal"})
            else:
                ledger.move(key, state, "the test")
        assert ledger.stuck()[0] == 2  # requested and unknown: the crash window counted
    kept = snapshot(db)
    server = serve_metrics(lab, tmp_path)
    try:
        text = scrape(server.url)
        after = time.time()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(HANG_GUARD_S) == 0, (tmp_path / "metrics.err").read_text()
    assert snapshot(db) == kept  # read-only: the file is not written
    seen = figures(text)
    age = seen.pop("ledger_oldest_open_effect_age_seconds")
    assert 0 <= age <= after - before  # the killed run's row, claimed after `before`
    assert seen == {
        **{f'ledger_effects{{state="{s}"}}': 0 for s in effects.STATES},
        'ledger_effects{state="requested"}': 1,
        'ledger_effects{state="unknown"}': 1,
        'ledger_effects{state="confirmed"}': 1,
        'ledger_effects{state="released"}': 1,
        'ledger_effects{state="failed"}': 1,
        **NO_OUTBOX,  # lab 19's outbox has no row here (tests/workflow/test_outbox.py counts one)
    }
    # lab 15's Prometheus line is stuck()'s count: its query, read from the guide, on this scrape
    guide = (ROOT / "labs" / "15-the-ledger.md").read_text(encoding="utf-8")
    (states,) = re.findall(r'`sum\(ledger_effects\{state=~"([\w|]+)"\}\)`', guide)
    assert set(states.split("|")) == set(effects.OPEN)
    assert sum(seen[f'ledger_effects{{state="{s}"}}'] for s in states.split("|")) == 2  # stuck()
    families = list(text_string_to_metric_families(text))
    assert {family.type for family in families} == {"gauge"}
    labels = {name for family in families for sample in family.samples for name in sample.labels}
    assert labels == {"state"}  # no key or thread label: one series per state, however many runs


def test_a_locked_or_unreadable_ledger_answers_503_in_one_line(lab, tmp_path):
    """A file that is not a database: the scrape is a 503 saying why, the server goes on."""
    notes = tmp_path / "notes.sqlite"
    notes.write_text("not a database\n" * 100)
    server = serve_metrics(dict(lab, CHECKPOINT_DB=str(notes)), tmp_path)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(server.url)
        assert refused.value.code == 503
        assert refused.value.read().decode() == "file is not a database\n"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(HANG_GUARD_S) == 0
    assert notes.read_text() == "not a database\n" * 100
