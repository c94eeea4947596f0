"""tools.tally: what the workflow did, counted from the events it printed, against the
receiver's own counters (GET /metrics, read with prometheus_client's parser)."""

import json
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tools.backends import LocalBackend
from tools.local import ROOT
from tools.runner import parse_guide
from tools.tally import events_in, tally

LAB06 = ROOT / "labs" / "06-the-lost-acknowledgement.md"
LAB02 = ROOT / "labs" / "02-the-keyed-fix.md"


def receiver_counter(backend, name):
    with urllib.request.urlopen(f"{backend.env['API_URL']}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    return int(family.samples[0].value)


def run_guide_to_file(guide, backend, out):
    """Every command of the guide but its reset, stdout appended to out (as a learner's
    `... | tee -a events.jsonl` would)."""
    steps = parse_guide(guide.read_text(encoding="utf-8"))[:-1]
    with open(out, "a", encoding="utf-8") as sink:
        for step in steps:
            sink.write(backend.run(step.command).stdout)


def tally_of(*files):
    done = subprocess.run(
        [sys.executable, "-m", "tools.tally", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return json.loads(done.stdout)


def test_replays_and_lookups_match_the_receivers_counters(tmp_path):
    """Lab 02: the resume's created: false is a replay the receiver counted too. Lab 06: the
    lookup adopted ticket 3 (settled), and the receiver replayed nothing for it."""
    for guide, replayed, settled in ((LAB02, 1, 0), (LAB06, 0, 1)):
        backend = LocalBackend(tmp_path / guide.stem, in_process=True)
        events = tmp_path / f"{guide.stem}.jsonl"
        try:
            run_guide_to_file(guide, backend, events)
            counts = tally_of(events)
            assert counts["replayed"] == replayed, (guide.name, counts)
            assert receiver_counter(backend, "receiver_idempotent_replays") == replayed
            assert counts["settled"] == settled, (guide.name, counts)
        finally:
            backend.close()


def test_stdin_skips_what_is_not_an_event_and_a_missing_file_is_one_line(tmp_path):
    lines = (
        'receiver: created key=k ticket=1\n{"event": "job", "job": 1, "resume": true, '
        '"thread": "t"}\nnot json {\n{"event": "drained", "next": ["create_ticket"], '
        '"reason": "SIGTERM"}\n{"created": true, "event": "effect_ack", "ticket_id": 1}\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "tools.tally"],
        cwd=ROOT,
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(done.stdout) == {
        "event": "tally",
        "started": 0,
        "resumed": 1,
        "drained": 1,
        "acknowledged": 1,
        "replayed": 0,
        "settled": 0,
    }
    missing = subprocess.run(
        [sys.executable, "-m", "tools.tally", str(tmp_path / "nope.jsonl")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "cannot read" in missing.stderr


def test_lab15s_adoptions_and_reconciles_are_settled():
    """Lab 15 as its guide prints it (the guide tests run those lines for real): a resume
    adopted ticket 1 by its lookup, a person confirmed a message, reconcile adopted two payments.
    Four settled; none of them is a replay."""
    guide = ROOT / "labs" / "15-the-ledger.md"
    steps = parse_guide(guide.read_text(encoding="utf-8"))
    lines = [line for step in steps for line in step.expected]
    counts = tally(events_in(lines))
    assert counts["settled"] == 4, counts
    assert counts["replayed"] == 0, counts


def test_lab13s_shipment_found_by_its_key_is_settled():
    """Lab 13 as its guide prints it: a resume killed after the shipment's request left looks the
    shipment up by its key and adopts it ("how": "adopted"): settled, not a replay; its receipts
    ("how": "receipt") are neither."""
    guide = ROOT / "labs" / "13-the-refund-that-ran-twice.md"
    lines = [
        line for step in parse_guide(guide.read_text(encoding="utf-8")) for line in step.expected
    ]
    assert any('"how": "adopted"' in line for line in lines)
    counts = tally(events_in(lines))
    assert counts["settled"] == 1, counts
    assert counts["replayed"] == 0, counts
