"""Labs 04-06: crash points, key modes, reconciliation, the drill and the chaos run.

Real processes throughout: labs/receiver.py on a loopback port, workflow.py as a subprocess that
really dies of SIGKILL, SQLite files under tmp_path. Where a test needs a receiver that
misbehaves in a way labs/receiver.py cannot (no commit before hanging up, silence, a key that made
another ticket), a scripted HTTP server on loopback plays the receiver; the workflow
under test is always the real one.
"""

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from workflow_helpers import events, names, tickets

from tools import chaos, drill
from tools.backends import LOST_ACK, LocalBackend
from tools.local import ROOT, ReceiverProcess, free_port, run_workflow, shell_exit_code
from tools.native import override_environment

KILLED = 137
OP = "case-t:open-ticket:v1"
TITLE = "Check supplier configuration"  # workflow.py's default title


@pytest.fixture
def faulty_receiver(lab, tmp_path):
    """labs/receiver.py with the lost-ack fault switched on, as lab 06's override file runs it."""
    env = {**lab, **override_environment([LOST_ACK])}  # the receiver's own: not the workflow's
    server = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    yield server
    server.stop()


# ------------------------------------------------------------------ crash points


def test_after_prepare_leaves_only_the_input_and_prepare_runs_again(receiver, workflow):
    crashed = workflow("start", "--operation", OP, "--mode", "naive", "--crash-at", "after-prepare")
    assert shell_exit_code(crashed.returncode) == KILLED
    assert names(crashed) == ["prepare", "crash"]
    state = events(workflow("state"))[0]
    assert state["next"] == ["prepare"] and "key" not in state["values"]
    resumed = workflow("resume")
    assert names(resumed) == ["prepare", "effect_ack", "done"]
    assert len(tickets(workflow)) == 1


def test_before_request_sends_nothing_until_the_resume(receiver, workflow):
    crashed = workflow(
        "start", "--operation", OP, "--mode", "naive", "--crash-at", "before-request"
    )
    assert shell_exit_code(crashed.returncode) == KILLED
    assert tickets(workflow) == []  # the request never left
    assert events(workflow("state"))[0]["next"] == ["create_ticket"]
    assert names(workflow("resume")) == ["effect_ack", "done"]
    assert len(tickets(workflow)) == 1


def test_after_checkpoint_the_result_is_saved_and_nothing_reruns(receiver, workflow):
    crashed = workflow("start", "--mode", "naive", "--crash-at", "after-checkpoint")
    assert shell_exit_code(crashed.returncode) == KILLED
    assert "done" not in names(crashed)
    state = events(workflow("state"))[0]
    assert state["next"] == [] and state["values"]["ticket_id"] == 1
    assert names(workflow("resume")) == ["done"]
    assert len(tickets(workflow)) == 1


def test_exit_durability_saves_nothing_before_a_sigkill(receiver, workflow):
    crashed = workflow("start", "--mode", "naive", "--crash", "--durability", "exit")
    assert shell_exit_code(crashed.returncode) == KILLED
    resumed = workflow("resume", "--durability", "exit")
    assert resumed.returncode == 4 and resumed.stdout == ""
    assert resumed.stderr.count("\n") == 1 and "no thread 'demo' to resume" in resumed.stderr
    assert len(tickets(workflow)) == 1  # committed, and the workflow has no trace of it


def test_crash_and_crash_at_together_is_a_usage_error(workflow):
    done = workflow("start", "--crash", "--crash-at", "before-request")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not allowed with" in done.stderr


# ------------------------------------------------------------------ where the key comes from


def test_node_uuid_sends_a_new_key_on_every_attempt(receiver, workflow):
    crashed = workflow("start", "--operation", OP, "--mode", "node-uuid", "--crash")
    assert shell_exit_code(crashed.returncode) == KILLED
    assert names(workflow("resume")) == ["effect_ack", "done"]
    keys = [t["key"] for t in tickets(workflow)]
    assert len(keys) == 2 and len(set(keys)) == 2 and OP not in keys
    assert events(workflow("state"))[0]["values"]["key"] == OP  # the stable key was in the state


def test_safe_key_spans_threads_of_the_same_operation(receiver, workflow):
    workflow("start", "--thread", "one", "--operation", OP, "--mode", "safe")
    again = events(workflow("start", "--thread", "two", "--operation", OP, "--mode", "safe"))
    assert again[1] == {"event": "effect_ack", "created": False, "ticket_id": 1}
    assert len(tickets(workflow)) == 1


# ------------------------------------------------------------------ the lost acknowledgement


def test_lost_ack_naive_fails_with_unknown_outcome_and_the_resume_duplicates(
    faulty_receiver, workflow
):
    lost = workflow("start", "--operation", OP, "--mode", "naive", "--crash-at", "lost-ack")
    assert lost.returncode == 3
    assert names(lost) == ["prepare", "effect_unknown"]
    assert lost.stderr.count("\n") == 1 and "may or may not have taken effect" in lost.stderr
    assert len(tickets(workflow)) == 1  # committed although nobody heard the answer
    assert names(workflow("resume")) == ["effect_ack", "done"]
    assert len(tickets(workflow)) == 2


def test_lost_ack_safe_reconciles_by_key_and_adopts_the_ticket(faulty_receiver, workflow):
    lost = workflow("start", "--operation", OP, "--mode", "safe", "--crash-at", "lost-ack")
    assert lost.returncode == 0
    assert events(lost)[1:4] == [
        {"event": "effect_unknown", "error": "Remote end closed connection without response"},
        {"event": "reconcile", "found": [1], "key": OP},
        {"event": "effect_ack", "created": False, "ticket_id": 1},
    ]
    assert len(tickets(workflow)) == 1
    log = faulty_receiver.log_path.read_text()
    assert log.count("before-answer failpoint: dropping the answer") == 1


def test_lost_ack_without_the_fault_switch_says_so(receiver, workflow):
    done = workflow("start", "--mode", "safe", "--crash-at", "lost-ack")
    assert done.returncode == 0 and names(done) == ["prepare", "effect_ack", "done"]
    assert "the receiver answered anyway, so lab 06's lost answer did not happen" in done.stderr
    # the way out is lab 06's up line, the only one that names the override file
    assert "-f compose.yaml -f labs/lost-ack.compose.yaml up -d --build api" in done.stderr
    assert "each command" not in done.stderr


def test_unreachable_receiver_is_no_unknown_outcome(lab, workflow):
    lab["API_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = workflow("start", "--mode", "safe")
    assert done.returncode == 3 and names(done) == ["prepare"]  # nothing sent: no effect_unknown
    assert done.stderr.count("\n") == 1 and "cannot reach the receiver" in done.stderr


class ScriptedReceiver(BaseHTTPRequestHandler):
    """Answers POSTs from server.script in order: "hang up", "silence", or (status, body)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.keys.append(self.headers.get("Idempotency-Key"))
        step = self.server.script.pop(0)
        if step == "silence":
            self.server.release.wait(60)  # until the test is over: the client must time out
        if step in ("silence", "hang up"):
            self.close_connection = True
            return
        self.answer(*step)

    def do_GET(self):
        self.answer(200, {"tickets": self.server.found})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted(lab):
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedReceiver)
    server.daemon_threads = True
    server.script, server.found, server.keys = [], [], []
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    lab["API_URL"] = server.url
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_reconcile_finds_nothing_and_sends_again_with_the_same_key(scripted, workflow):
    scripted.script = ["hang up", (201, {"ticket_id": 7, "created": True})]
    done = workflow("start", "--operation", OP, "--mode", "safe")
    assert done.returncode == 0
    assert names(done) == ["prepare", "effect_unknown", "reconcile", "effect_ack", "done"]
    assert events(done)[-1]["ticket_id"] == 7
    assert scripted.keys == [OP, OP]


def test_reconcile_does_not_adopt_a_ticket_with_another_body(scripted, workflow):
    scripted.found = [{"ticket_id": 5, "key": OP, "payload": {"title": "Something else"}}]
    scripted.script = ["hang up", (409, {"error": "key reused"})]
    done = workflow("start", "--operation", OP, "--mode", "safe")
    assert done.returncode == 1
    assert events(done)[-1] == {
        "event": "http_error",
        "status": 409,
        "body": {"error": "key reused"},
    }
    assert scripted.keys == [OP, OP]  # it asked the receiver again instead of adopting 5


def test_a_timeout_after_sending_is_an_unknown_outcome(scripted, lab, workflow):
    scripted.script = ["silence", (201, {"ticket_id": 1, "created": True})]
    lab["API_TIMEOUT_S"] = "0.5"  # seconds the workflow waits for the silent answer
    done = workflow("start", "--operation", OP, "--mode", "safe")
    assert done.returncode == 0
    assert events(done)[1] == {"event": "effect_unknown", "error": "timed out"}
    assert names(done)[2:] == ["reconcile", "effect_ack", "done"]


# ------------------------------------------------------------------ the drill and the chaos run


def test_the_matrix_covers_every_crash_point_in_every_mode():
    from labs import boundaries as boundaries_lesson
    from labs import modes as modes_lesson

    sync_rows = [row.boundary for row in drill.MATRIX if row.durability == "sync"]
    term_rows = [b for b in sync_rows if b.startswith("term-at:")]  # lab 09: SIGTERM, not a crash
    assert sorted(set(sync_rows) - set(term_rows)) == sorted(modes_lesson.CRASH_POINTS)
    assert term_rows == [f"term-at:{point}" for point in boundaries_lesson.TERM_POINTS]
    assert all(len(row.tickets) == len(modes_lesson.MODES) for row in drill.MATRIX)
    assert len({c.name for c in drill.cells()}) == len(drill.cells())  # one thread per cell


def test_lab_04_prints_the_drills_matrix():
    """The guide's table is a copy for readers; the drill's MATRIX is the source."""
    text = (ROOT / "labs" / "04-crash-at-every-boundary.md").read_text(encoding="utf-8")
    section = text.split("\n## The drill\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    table = [[cell.strip() for cell in row] for row in rows[2:]]  # without the header
    want = [
        [row.boundary + ("" if row.durability == "sync" else f' ("{row.durability}")')]
        + [str(n) for n in row.tickets]
        for row in drill.MATRIX
    ]
    assert [[r[0].replace(" (lab 06)", ""), *r[1:]] for r in table] == want


def test_a_drill_cell_fails_and_says_why_when_the_receiver_cannot_lose_an_answer():
    """The drill can fail: without the fault switch, lost-ack makes one ticket, not two."""
    lost_ack = next(row for row in drill.MATRIX if row.boundary == "lost-ack")
    with LocalBackend(in_process=True) as lab:
        lab.up()  # no override: the fault is off
        cell = drill.run_cell(lab, drill.Cell(lost_ack, "naive"))
    assert cell["tickets"] == 1 and not cell["ok"]
    assert "1 tickets, expected 2" in cell["why"]
    assert "the crash exited 0, expected 3" in cell["why"]
    assert cell["log"][0]["events"] == ["prepare", "effect_ack", "done"]


def test_make_chaos_prints_a_replay_line_that_replays_its_seed():
    """The replay line a `make chaos` run prints is a command that works as printed: run
    again, it draws the same seed (and so the same kill offsets) and prints the same line. Its
    stdout is one JSON line (`make chaos | jq` reads nothing else), its verdict the last line of
    stderr."""

    def make_chaos(*variables):
        done = subprocess.run(
            ["make", "--no-print-directory", "chaos", *variables],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        [line] = done.stdout.splitlines()
        result = json.loads(line)
        assert result["runs"] == result["operations"] == result["tickets"] == 2, result
        assert result["duplicates"] == result["unfinished"] == 0, result
        killed = result["killed"]  # a run whose offset comes after its exit is not killed
        assert 0 <= result["in_crash_window"] <= killed <= 2, result
        verdict = done.stderr.splitlines()[-1]
        assert verdict.startswith("chaos: safe mode held: every one of 2 runs has exactly one")
        assert (
            f"{result['in_crash_window']} of {killed} kills landed in the crash window" in verdict
        )
        assert ("ended before the kill" in verdict) == (killed < 2)
        (replay,) = re.findall(r"\(replay: (make chaos [^)]*)\)", done.stderr)
        return result["seed"], replay

    seed, replay = make_chaos("RUNS=2")
    assert replay == f"make chaos RUNS=2 SEED={seed} MODE=safe"
    assert make_chaos(*replay.split()[2:]) == (seed, replay)


MAKE_VARIABLES = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "SEED", "RUNS", "MODE")  # the test's own


def test_chaos_counts_a_real_duplicate_and_a_kill_in_the_crash_window():
    """The chaos check can fail: a naive crash after the answer leaves two tickets."""
    with LocalBackend() as lab:
        lab.up()
        start = ["start", "--thread", "x", "--operation", "x", "--title", "x", "--mode", "naive"]
        assert shell_exit_code(run_workflow([*start, "--crash"], lab.env).returncode) == KILLED
        resumed = run_workflow(["resume", "--thread", "x"], lab.env)
        assert resumed.returncode == 0 and "effect_ack" in resumed.stdout
        per_run = chaos.count_tickets(lab, ["x"])
    run = {"name": "x", "killed": True, "landed": "effect_ack", "finished": True}
    run["in_crash_window"] = True  # as chaos_run decides it: answered, then create_ticket reran
    result = chaos.summary([run], per_run, seed=0)
    assert result["duplicates"] == 1 and result["in_crash_window"] == 1
    assert "FAILED: 1 duplicate tickets" in chaos.sentence(result, "naive", 1.0)


def test_a_run_that_ends_before_its_kill_is_counted_as_not_killed():
    """The kill's offset can come after the process exited: the verdict says so, in numbers."""
    runs = [{"killed": True, "finished": True}, {"killed": False, "finished": True}]
    result = chaos.summary(runs, {"a": 1, "b": 1}, seed=0)
    assert result["killed"] == 1 and result["duplicates"] == 0
    said = chaos.sentence(result, "safe", 1.0)
    assert (
        "0 of 1 kills landed in the crash window (answered, not checkpointed), 1 run ended" in said
    )


def test_drill_and_chaos_refuse_bad_arguments_in_one_line():
    cases = [
        ("tools.drill", ["--workers", "0"]),
        ("tools.drill", ["--backend", "podman"]),
        ("tools.chaos", ["--runs", "0"]),
        ("tools.chaos", ["--runs", "many"]),
    ]
    for module, args in cases:
        done = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_a_drill_cell_that_lost_an_answer_without_the_fault_blames_the_slow_receiver(
    scripted, tmp_path
):
    """A receiver slower than the client's request timeout: the cell says so, not 'a bug'."""
    after_ack = next(r for r in drill.MATRIX if (r.boundary, r.durability) == ("after-ack", "sync"))
    cell = drill.Cell(after_ack, "naive")
    scripted.script = ["silence", (201, {"ticket_id": 1, "created": True})]
    scripted.found = [{"ticket_id": 1, "key": None, "payload": {"title": cell.name}}]
    with LocalBackend(tmp_path / "lab", in_process=True) as lab:
        lab.env["API_URL"] = scripted.url  # the workflow talks to the slow receiver
        result = drill.run_cell(lab, cell)
    assert not result["ok"]
    assert "the crash exited 3, expected 137" in result["why"]
    assert any("took longer than the client's 5 s request timeout" in w for w in result["why"])


def test_lab_04s_table_is_the_drills_matrix():
    """The guide's table is a view of drill.MATRIX, the one statement of the expected cells."""
    import re

    guide = (ROOT / "labs" / "04-crash-at-every-boundary.md").read_text(encoding="utf-8")
    table = {}
    for line in guide.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 1 + len(drill.MODES) and cells[1:] and all(c.isdigit() for c in cells[1:]):
            name = re.sub(r" \(lab \d+\)", "", cells[0])
            durability = re.search(r'\("(\w+)"\)', name)
            boundary = re.sub(r' \("\w+"\)', "", name)
            key = (boundary, durability.group(1) if durability else "sync")
            table[key] = tuple(int(c) for c in cells[1:])
    assert table == {(row.boundary, row.durability): row.tickets for row in drill.MATRIX}
