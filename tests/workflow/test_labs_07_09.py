"""Labs 07-09: the approval that runs twice, the step boundary, and a deploy mid-run.

Real processes throughout: labs/receiver.py on a loopback port, workflow.py as a subprocess that
waits for a human, dies of SIGKILL at the step boundary, or drains on SIGTERM (sent by
itself, or from outside while its request is on the wire), SQLite files under tmp_path.
"""

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_hints_as_printed import printed
from workflow_helpers import events, names, tickets

import corrections
import effects
from tools.local import ROOT, shell_exit_code, wait_until

KILLED, DRAINED, NO_THREAD = 137, 75, 4


def state(workflow, thread="demo"):
    return events(workflow("state", "--thread", thread))[0]


# ------------------------------------------------------------------ lab 07: approval


ASKED = ["effect_ack", "approval_requested", "awaiting_approval"]  # the ticket, the ask, the wait


def asked_again(done, request_id, operation="case-001:open-ticket:v1"):
    """The ask's line when the ledger's receipt answered it: nothing was sent."""
    key = f"{operation}:approval"
    return {"event": "approval_requested", "how": "receipt", "key": key, "request_id": request_id}


def posts(receiver):
    """POSTs the receiver answered with a ticket (created or replayed), from its /metrics."""
    with urllib.request.urlopen(receiver.url + "/metrics") as response:
        text = response.read().decode()
    names = ("tickets_created", "idempotent_replays")
    return sum(int(re.search(rf"^receiver_{n}_total (\d+)$", text, re.M)[1]) for n in names)


def test_approval_inside_the_effect_node_sends_the_request_again(receiver, workflow):
    """The answer re-runs the node: the naive ticket goes again (a second ticket); the ask,
    an effect through the ledger, is answered by its receipt."""
    started = workflow("start", "--mode", "naive", "--approval")
    assert started.returncode == 0, started.stderr
    assert names(started) == ["prepare", *ASKED]
    assert events(started)[1]["ticket_id"] == 1 and events(started)[-1]["ticket_id"] == 1
    assert events(started)[2] == {"created": True, "event": "approval_requested", "request_id": 2}
    waiting = state(workflow)
    assert waiting["next"] == ["create_ticket"] and "ticket_id" not in waiting["values"]
    approved = workflow("approve")
    assert approved.returncode == 0, approved.stderr
    assert names(approved) == ["effect_ack", "approval_requested", "approval", "done"]
    assert events(approved)[0] == {"created": True, "event": "effect_ack", "ticket_id": 3}
    assert events(approved)[1] == asked_again(approved, 2)
    assert events(approved)[-1]["ticket_id"] == 3 and events(approved)[-1]["approved"] is True
    keys = [(t["ticket_id"], t["key"]) for t in tickets(workflow)]
    assert keys == [(1, None), (2, "case-001:open-ticket:v1:approval"), (3, None)]


def test_approval_inside_the_effect_node_with_the_key_is_one_ticket(receiver, workflow):
    assert workflow("start", "--mode", "safe", "--approval").returncode == 0
    approved = workflow("approve")
    assert names(approved) == ["effect_ack", "approval_requested", "approval", "done"]
    assert events(approved)[0] == {"created": False, "event": "effect_ack", "ticket_id": 1}
    assert events(approved)[1] == asked_again(approved, 2)
    assert len(tickets(workflow)) == 2  # the ticket and the ask


def test_approval_inside_the_effect_node_through_the_ledger_sends_nothing_again(receiver, workflow):
    """--mode ledger: the re-run node finds both receipts, and the receiver hears nothing."""
    started = workflow("start", "--mode", "ledger", "--approval")
    assert names(started) == ["prepare", *ASKED]
    before = posts(receiver)
    approved = workflow("approve")

    assert approved.returncode == 0, approved.stderr
    assert events(approved)[:2] == [
        {"event": "effect_receipt", "key": "case-001:open-ticket:v1", "ticket_id": 1},
        asked_again(approved, 2),
    ]
    assert posts(receiver) == before == 2


def test_approval_in_a_node_of_its_own_repeats_nothing(receiver, workflow):
    started = workflow("start", "--mode", "naive", "--approval", "own-node")
    assert names(started) == ["prepare", *ASKED]
    waiting = state(workflow)
    assert waiting["next"] == ["approval"] and waiting["values"]["ticket_id"] == 1
    rejected = workflow("approve", "--reject")
    assert rejected.returncode == 0, rejected.stderr
    assert names(rejected) == ["approval_requested", "approval", "done"]
    assert events(rejected)[0] == asked_again(rejected, 2)  # the re-run ask: its receipt
    assert events(rejected)[-1]["approved"] is False
    assert len(tickets(workflow)) == 2  # the ticket and the ask, once each
    assert names(workflow("resume")) == ["done"]  # finished: nothing waits, nothing reruns


def test_a_waiting_run_is_answered_only_by_approve(receiver, workflow):
    assert workflow("start", "--mode", "naive", "--approval").returncode == 0
    resumed = workflow("resume")
    assert resumed.returncode == NO_THREAD and resumed.stdout == ""
    assert resumed.stderr == (
        "labs: thread 'demo' waits for approval; answer with python -m labs approve --thread "
        "demo (Docker: docker compose -p stateful-lab run --rm workflow approve --thread demo) "
        "(or --reject)\n"
    )
    assert len(tickets(workflow)) == 2  # the refused resume sent nothing: the ticket, the ask
    assert workflow("approve").returncode == 0
    again = workflow("approve")
    assert again.returncode == NO_THREAD
    assert again.stderr == "labs: thread 'demo' is not waiting for approval\n"
    unknown = workflow("approve", "--thread", "nope")
    assert unknown.returncode == NO_THREAD and unknown.stderr.count("\n") == 1


def test_without_approval_the_graph_has_two_nodes_and_no_approval_state(receiver, workflow):
    done = workflow("start", "--mode", "naive")
    assert names(done) == ["prepare", "effect_ack", "done"]
    assert "approval" not in events(done)[-1] and "approved" not in events(done)[-1]
    refused = workflow("approve")
    assert refused.returncode == NO_THREAD


# ------------------------------------------------- lab 07: an approval bound to what was reviewed

NOT_AUTHORIZED = 77
OLD, NEW = "Pay the supplier 120 EUR", "Pay the supplier 1200 EUR"
# Where the re-approval can die: its approval recorded; its ticket authorized (the approval on
# the ledger's row) and not sent; sent and not recorded (the resume adopts it, no new check).
REAPPROVAL_KILLS = ("after-approval", "after-intent", "after-send")


def sent_for(workflow, operation):
    """The titles of the tickets the receiver holds under the operation's key (not its ask)."""
    return [t["payload"]["title"] for t in tickets(workflow) if t["key"] == operation]


def approved_then_edited(workflow, thread, operation):
    """Started, approved for OLD, killed before its ticket left, its title edited to NEW."""
    started = workflow(*bound_start(thread, operation))
    assert started.returncode == 0, started.stderr
    waiting = events(started)[-1]
    assert waiting == {
        "digest": digest(OLD),
        "event": "awaiting_approval",
        "request": {"title": OLD},
    }
    killed = workflow("approve", "--thread", thread, "--by", "ana", "--crash-at", "before-request")
    assert shell_exit_code(killed.returncode) == KILLED, killed.stderr
    assert events(killed)[0]["approval"] and events(killed)[0]["request"] == {"title": OLD}
    assert names(workflow("edit", "--thread", thread, "--title", NEW)) == ["edited"]


def digest(title):
    """How a line names the request a ticket of this title sends: its sha256, cut to 12."""
    return f"sha256:{effects.request_hash({'title': title})[1][:12]}"


def bound_start(thread, operation):
    return ("start", "--thread", thread, "--operation", operation, "--title", OLD,
            "--approval", "before")  # fmt: skip


def assert_refused(done, thread, why):
    assert done.returncode == NOT_AUTHORIZED and done.stdout == "", done.stderr
    docker = "(Docker: docker compose -p stateful-lab run --rm workflow"
    hint = (
        f"; review it: python -m labs state --thread {thread} {docker} state --thread {thread}); "
        f"re-approve: python -m labs approve --thread {thread} {docker} approve "
        f"--thread {thread})\n"
    )
    assert why in done.stderr and done.stderr.endswith(hint) and done.stderr.count("\n") == 1


def authorized(lab, operation):
    with effects.read_ledger(lab["CHECKPOINT_DB"]) as ledger:
        return ledger.get(operation).authorized


def test_a_resume_after_the_payload_changed_is_refused_then_reapproved_once(
    receiver, workflow, lab
):
    """Approved for one request, resumed with another: refused, nothing sent; approved again
    for the request it now sends, it sends once, killed anywhere on the way (the refusal, each
    boundary of the re-approval). Counted at the receiver."""
    stale = "is for request sha256:"
    for point in ("before-refusal", *REAPPROVAL_KILLS):
        thread, operation = f"bound-{point}", f"case-bound-{point}:open-ticket:v1"
        approved_then_edited(workflow, thread, operation)
        if point == "before-refusal":  # the intent recorded, the refusal not: still refused
            killed = workflow("resume", "--thread", thread, "--crash-at", point)
            assert shell_exit_code(killed.returncode) == KILLED, killed.stderr
        refused = workflow("resume", "--thread", thread)
        assert_refused(refused, thread, stale)
        assert sent_for(workflow, operation) == []  # nothing left under a stale approval
        if point in REAPPROVAL_KILLS:
            killed = workflow("approve", "--thread", thread, "--by", "ana", "--crash-at", point)
            assert shell_exit_code(killed.returncode) == KILLED, killed.stderr
            done = workflow("resume", "--thread", thread)
        else:  # the hint's command, as printed (its Docker form the same command)
            look, again = printed(refused.stderr)  # review it, then approve it
            assert names(workflow(*shlex.split(look.removeprefix("python -m labs ")))) == ["state"]
            done = workflow(*shlex.split(again.removeprefix("python -m labs ")))
        assert done.returncode == 0, (point, done.stderr)
        assert events(done)[-1]["title"] == NEW
        assert sent_for(workflow, operation) == [NEW], point  # once, the request approved
        assert f" ({digest(NEW)}, by " in authorized(lab, operation), point


def test_a_refused_request_edited_again_is_approved_and_sent_once(receiver, workflow, lab):
    """Refused (its row released: nothing sent), edited again, approved: the released row
    takes the new request, one ticket with the final title, the change in its history."""
    thread, operation, final = "twice", "case-twice:open-ticket:v1", "Pay the supplier 12 EUR"
    approved_then_edited(workflow, thread, operation)
    assert workflow("resume", "--thread", thread).returncode == NOT_AUTHORIZED
    assert names(workflow("edit", "--thread", thread, "--title", final)) == ["edited"]
    done = workflow("approve", "--thread", thread, "--by", "ana")
    assert done.returncode == 0, done.stderr
    assert sent_for(workflow, operation) == [final]
    with effects.read_ledger(lab["CHECKPOINT_DB"]) as ledger:
        history = ledger.history(operation)
    # the guide's order: the intent recorded (requested), then the approval checked (refused)
    assert history[0] == (None, "requested", "claimed"), history
    assert history[1][:2] == ("requested", "released") and "not authorized" in history[1][2]
    assert history[2] == ("released", "requested", "claimed: request changed while released")


def test_a_bound_approval_under_key_version_2_is_checked_under_its_key(receiver, workflow, lab):
    """LAB_KEY_VERSION=2 sends the ticket under KEY:ticket: approve records it under that key,
    the key the send checks, and revoke finds it there."""
    from tools.local import run_workflow_here

    def v2(*args):
        return run_workflow_here(args, {**lab, "LAB_KEY_VERSION": "2"})

    assert v2(*bound_start("v2", "case-v2:v1")).returncode == 0
    done = v2("approve", "--thread", "v2", "--by", "ana")
    assert done.returncode == 0, done.stderr
    assert sent_for(workflow, "case-v2:v1:ticket") == [OLD]
    assert events(v2("revoke", "--thread", "v2"))[0]["sent"] is True  # found under KEY:ticket


def test_an_expired_or_revoked_approval_sends_nothing(receiver, workflow, lab):
    operation = "case-expired:open-ticket:v1"
    assert workflow(*bound_start("expired", operation)).returncode == 0
    expired = workflow("approve", "--thread", "expired", "--valid-for", "0")
    assert names(expired)[0] == "approval_recorded"
    assert events(expired)[0]["by"] == corrections.login()  # no --by: who runs it, never unnamed
    assert "approval 1 expired at " in expired.stderr and expired.returncode == NOT_AUTHORIZED
    assert sent_for(workflow, operation) == []
    for bad in ("inf", "-1", "nan"):  # an approval for ever, or for less than no time
        refused = workflow("approve", "--thread", "expired", "--valid-for", bad)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (bad, refused)
        assert refused.stdout == "" and f"'{bad}' is not a number of seconds" in refused.stderr
    for blank in ("", " "):  # an approval by nobody: refused before anything is recorded
        refused = workflow("approve", "--thread", "expired", "--by", blank)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (blank, refused)
        assert refused.stdout == "" and "records who gave it: --by NAME" in refused.stderr
    assert workflow("approve", "--thread", "expired").returncode == 0
    assert sent_for(workflow, operation) == [OLD]
    late = events(workflow("revoke", "--thread", "expired"))  # after the send: too late
    assert late == [
        {"approval": 2, "event": "revoked", "note": "too late: its ticket was sent", "sent": True}
    ]
    done = workflow("edit", "--thread", "expired", "--title", NEW)  # nothing will send it
    assert done.returncode == NO_THREAD and done.stderr.count("\n") == 1

    operation = "case-revoked:open-ticket:v1"
    assert workflow(*bound_start("revoked", operation)).returncode == 0
    killed = workflow("approve", "--thread", "revoked", "--crash-at", "before-request")
    assert shell_exit_code(killed.returncode) == KILLED
    assert events(workflow("revoke", "--thread", "revoked")) == [
        {"approval": 3, "event": "revoked", "sent": False}
    ]
    assert_refused(workflow("resume", "--thread", "revoked"), "revoked", "approval 3 was revoked")
    assert sent_for(workflow, operation) == []
    again = workflow("revoke", "--thread", "revoked")
    assert again.returncode == NO_THREAD and again.stderr.count("\n") == 1
    assert "approval 3 was revoked already; nothing changed" in again.stderr  # typed twice
    assert workflow("approve", "--thread", "revoked").returncode == 0
    assert sent_for(workflow, operation) == [OLD]


def test_a_rejected_bound_approval_sends_nothing_and_naive_is_refused(receiver, workflow):
    assert workflow(*bound_start("no", "case-no:v1")).returncode == 0
    rejected = workflow("approve", "--thread", "no", "--reject")
    assert names(rejected)[-2:] == ["approval", "done"] and sent_for(workflow, "case-no:v1") == []
    assert workflow(*bound_start("asked", "case-asked:v1")).returncode == 0
    edited = workflow("edit", "--thread", "asked", "--title", NEW)  # while it waits: asked again
    (resume,) = printed(edited.stderr)
    assert resume == "python -m labs resume --thread asked", edited.stderr
    early = workflow("approve", "--thread", "asked")  # the question shown is gone
    assert early.returncode == NO_THREAD and printed(early.stderr) == [resume]
    asked = workflow(*shlex.split(resume.removeprefix("python -m labs ")))
    assert events(asked)[-1]["request"] == {"title": NEW}, asked.stderr
    naive = workflow(*bound_start("naive", "case-naive:v1"), "--mode", "naive")
    assert naive.returncode == 2 and naive.stderr.count("\n") == 1


# ------------------------------------------------------------------ lab 08: the step boundary


def test_a_kill_after_the_node_returned_reruns_it(receiver, workflow):
    crashed = workflow("start", "--mode", "naive", "--crash-at", "step-boundary")
    assert shell_exit_code(crashed.returncode) == KILLED
    assert names(crashed) == ["prepare", "effect_ack", "crash"]
    assert events(crashed)[-1]["at"] == "step-boundary"
    saved = state(workflow)
    assert saved["next"] == ["create_ticket"] and "ticket_id" not in saved["values"]
    assert names(workflow("resume")) == ["effect_ack", "done"]
    assert len(tickets(workflow)) == 2


def test_a_kill_after_the_node_returned_is_one_ticket_with_the_key(receiver, workflow):
    crashed = workflow("start", "--mode", "safe", "--crash-at", "step-boundary")
    assert shell_exit_code(crashed.returncode) == KILLED
    resumed = workflow("resume")
    assert events(resumed)[0] == {"created": False, "event": "effect_ack", "ticket_id": 1}
    assert len(tickets(workflow)) == 1


WRITES_FIRST = """
import os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
from langgraph.checkpoint.sqlite import SqliteSaver
import workflow
from labs import cli as lab
from labs import lab_graph
from labs import contract as contract_lesson

written = threading.Event()

class WritesThenKill(SqliteSaver):
    # create_ticket's own writes reach the disk; the checkpoint after it never does.
    def put_writes(self, config, writes, task_id, task_path=""):
        super().put_writes(config, writes, task_id, task_path)
        if any(channel == "ticket_id" for channel, _ in writes):
            written.set()

    def put(self, config, checkpoint, metadata, new_versions):
        if "ticket_id" in checkpoint["channel_values"]:
            written.wait(30)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().put(config, checkpoint, metadata, new_versions)

with WritesThenKill.from_conn_string(os.environ["CHECKPOINT_DB"]) as saver:
    graph = lab_graph.build_lab_graph(saver)
    first = {"operation_id": "op", "mode": "naive", "title": "t"}
    context = workflow.Context(workflow.TicketClient(os.environ["API_URL"]), None)  # naive
    config = {"configurable": {"thread_id": "demo"}}
    config["metadata"] = {"contract": contract_lesson.contract(graph)}
    graph.invoke(first, config, durability="sync", context=context)  # as labs/cli.py records a run
"""


def test_a_result_whose_writes_reached_the_disk_is_not_redone(receiver, lab, workflow):
    """The other side of the race in lab 08: the node's writes landed, the checkpoint did not."""
    Path(lab["CHECKPOINT_DB"]).parent.mkdir(parents=True, exist_ok=True)
    killed = subprocess.run(
        [sys.executable, "-c", WRITES_FIRST, str(ROOT)],
        env=lab,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell_exit_code(killed.returncode) == KILLED, killed.stderr
    saved = state(workflow)
    assert saved["next"] == [] and saved["values"]["ticket_id"] == 1  # read from the writes
    assert names(workflow("resume")) == ["done"]
    assert len(tickets(workflow)) == 1


# ------------------------------------------------------------------ lab 09: a deploy mid-run


def test_sigterm_inside_prepare_drains_at_the_boundary(receiver, workflow):
    drained = workflow("start", "--mode", "naive", "--term-at", "after-prepare")
    assert drained.returncode == DRAINED
    assert drained.stderr == ""  # not a failure: no traceback, no error line
    assert names(drained) == ["prepare", "sigterm", "drained"]
    assert events(drained)[-1] == {
        "event": "drained",
        "next": ["create_ticket"],
        "reason": "SIGTERM",
    }
    saved = state(workflow)
    assert saved["next"] == ["create_ticket"] and saved["values"]["key"]  # prepare was saved
    assert tickets(workflow) == []
    assert names(workflow("resume")) == ["effect_ack", "done"]
    assert len(tickets(workflow)) == 1


def test_sigterm_in_the_last_node_lets_the_run_finish(receiver, workflow):
    done = workflow("start", "--mode", "naive", "--term-at", "after-ack")
    assert done.returncode == 0, done.stderr
    assert names(done) == ["prepare", "effect_ack", "sigterm", "done"]
    assert names(workflow("resume")) == ["done"]
    assert len(tickets(workflow)) == 1


def test_sigkill_at_the_same_place_still_duplicates(receiver, workflow):
    crashed = workflow("start", "--mode", "naive", "--crash-at", "after-ack")
    assert shell_exit_code(crashed.returncode) == KILLED
    assert names(workflow("resume")) == ["effect_ack", "done"]
    assert len(tickets(workflow)) == 2


class HeldReceiver:
    """A receiver that holds each POST until released, so a test can signal the workflow then."""

    def __init__(self):
        self.arrived, self.release, self.posts = threading.Event(), threading.Event(), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.posts += 1
                owner.arrived.set()
                owner.release.wait(30)
                body = json.dumps({"ticket_id": owner.posts, "created": True}).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def held(lab):
    receiver = HeldReceiver()
    lab["API_URL"] = receiver.url
    yield receiver
    receiver.close()


def test_sigterm_from_outside_during_the_request_lets_the_node_finish(held, lab):
    """A deploy's SIGTERM while the request is on the wire: the answer is still taken."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "labs", "start", "--mode", "naive"],
        env=lab,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(held.arrived.is_set, 60, "the workflow's POST")
        proc.send_signal(signal.SIGTERM)  # pending in the process before its answer comes
        held.release.set()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert [json.loads(line)["event"] for line in stdout.splitlines()] == [
        "prepare",
        "effect_ack",
        "done",
    ]
    assert held.posts == 1
