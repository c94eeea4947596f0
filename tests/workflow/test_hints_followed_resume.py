"""Issue 49: every resume line a stopped run prints is followed, typed as printed. A run that
stopped before its effect was saved (no receiver, an error answer, a busy receiver, a checkpoint
that cannot be written, Ctrl-C during lab 07's approve) names the command that goes on from it
(hints.py); the condition fixed, that command, cut out of the line (hints_helpers.printed) and
run as a shell splits it, ends the run with exit 0 and one ticket: never a second.

hints.py's line for a provider that is not the receiver ("once NAME takes it") is not here: the
lessons' CLI declares only the receiver (workflow.API), so it cannot print that line. A copier's
program can: tests/tools/test_starter.py follows it in a starter with a provider added."""

import json
import sqlite3
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from hints_helpers import printed
from test_hints_as_printed import interrupted_at, receiver_list, typed_here

import failpoints
from tools.local import ReceiverProcess, events, free_port, run_workflow_here, wait_until

ONE_TRY = {"API_ATTEMPTS": "1"}  # a refused connection or a 503 given up at once: no retry waits


def resume_line(command, thread):
    """The whole resume as hints.py prints it: the native command, then its Docker form."""
    docker = f"docker compose -p stateful-lab run --rm workflow {command} --thread {thread}"
    return f"python -m labs {command} --thread {thread} (Docker: {docker})"


def followed(hint, env, operation):
    """The hint typed as printed, in this process: it ends done, and the test's receiver holds
    one ticket, the run's, under the operation's key (lab 07's ask, OPERATION:approval, aside)."""
    done = typed_here(hint, env)
    assert done.returncode == 0, done.stderr
    last = events(done.stdout)[-1]
    assert last["event"] == "done", done.stdout
    made = [
        (t["ticket_id"], t["key"])
        for t in receiver_list(env, "tickets")
        if not (t["key"] or "").endswith(":approval")
    ]
    assert made == [(last["ticket_id"], operation)], made  # one ticket, never a second
    return done


# --- no receiver: exit 3 (commandline.py's Unreachable, hints.resume_hint) ----------------------


@pytest.mark.parametrize("mode", ["ledger", "safe"])
def test_a_keyed_run_with_no_receiver_names_the_resume_once_the_receiver_answers(
    lab, tmp_path, mode
):
    """The receiver not started yet: a keyed start saves its thread and exits 3, its one line
    naming the resume once the receiver answers. The receiver started, that resume ends the
    run with one ticket."""
    operation = f"case-nr-{mode}"
    start = ["start", "--thread", "nr", "--operation", operation, "--mode", mode]
    stopped = run_workflow_here(start, {**lab, **ONE_TRY})  # nothing listens at API_URL yet
    assert stopped.returncode == 3 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert stopped.stderr.endswith(
        f"; the run is saved: once the receiver answers, {resume_line('resume', 'nr')}\n"
    ), stopped.stderr
    (resume,) = printed(stopped.stderr)
    assert resume == "python -m labs resume --thread nr"
    receiver = ReceiverProcess(lab, log_path=tmp_path / "receiver.log").start()  # now started
    try:
        followed(resume, lab, operation)
    finally:
        receiver.stop()


# --- an error answer: exit 1 (hints.report_http_error) ------------------------------------------


def answering(status, body, content_type):
    """Another program on a loopback port: every request answered status with body. Returns
    the server (its server_port; shut it down)."""

    def answer(self):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    handler = type(
        "Answering",
        (BaseHTTPRequestHandler,),
        {"do_GET": answer, "do_POST": answer, "log_message": lambda *_: None},
    )
    server = HTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for serve_forever's next poll: 10 ms, not its default 0.5 s
    serving = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    serving.start()
    return server


PAGE = b"<html><body><h1>Not Found</h1></body></html>"
DID_NOTHING = (
    "nothing was made, and the key is still free; check API_URL (its host, port and path) "
)
NOT_OURS = "without the receiver's JSON: API_URL (its port) names another program"


@pytest.mark.parametrize(
    "where,why,when",
    [
        ("/v1", f"answered 404: {DID_NOTHING}", "once API_URL names the receiver and lets you in"),
        (
            (401, json.dumps({"error": "sign in"}).encode(), "application/json"),  # a gateway's
            f"answered 401: {DID_NOTHING}",
            "once API_URL names the receiver and lets you in",
        ),
        ((404, PAGE, "text/html"), f"answered 404 {NOT_OURS}", "once API_URL names the receiver"),
        ((502, PAGE, "text/html"), f"answered 502 {NOT_OURS}", "once API_URL names the receiver"),
    ],
    ids=["wrong path", "gateway 401", "another server's 404 page", "a proxy's 502 page"],
)
def test_an_error_answer_names_the_resume_once_api_url_names_the_receiver(
    lab, receiver, where, why, when
):
    """API_URL with a path the receiver does not serve, or at another program (a gateway that
    wants a login, a web server's page, a proxy's error page): exit 1, one line that says why
    and names the resume once API_URL names the receiver. API_URL fixed, that resume ends the
    run with one ticket. (The proxy's 502 may have been made, as far as the ledger knows: the
    resume asks the receiver by key first.)"""
    other = None if isinstance(where, str) else answering(*where)
    wrong = lab["API_URL"] + where if other is None else f"http://127.0.0.1:{other.server_port}"
    try:
        start = ["start", "--thread", "e", "--operation", "case-e"]
        stopped = run_workflow_here(start, {**lab, "API_URL": wrong})
    finally:
        if other is not None:
            other.shutdown()
            other.server_close()
    assert stopped.returncode == 1 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert why in stopped.stderr, stopped.stderr
    said = f"; the run is saved: {when}, {resume_line('resume', 'e')}\n"
    assert stopped.stderr.endswith(said), stopped.stderr
    (resume,) = printed(stopped.stderr)
    assert receiver_list(lab, "tickets") == []  # nothing reached the receiver
    followed(resume, lab, "case-e")


def test_a_receiver_busy_past_every_try_names_the_resume_once_it_can_write(lab, tmp_path):
    """Another program holds the receiver's database (a backup, an sqlite3 shell) for the whole
    run: the 503s run out, exit 1, and the line names the resume once the receiver can write.
    Released, that resume ends the run with one ticket."""
    receiver = ReceiverProcess({**lab, "RECEIVER_BUSY_TIMEOUT_S": "0.2"}, tmp_path / "r.log")
    receiver.start()
    holder = sqlite3.connect(lab["RECEIVER_DB"], isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        start = ["start", "--thread", "b", "--operation", "case-b"]
        stopped = run_workflow_here(start, {**lab, **ONE_TRY})  # two tries for a 503
        holder.execute("ROLLBACK")
        assert stopped.returncode == 1 and stopped.stderr.count("\n") == 1, stopped.stderr
        assert stopped.stderr == (
            "labs: the receiver stayed busy (503) for 2 tries; nothing was committed; the run is "
            f"saved: once the receiver can write, {resume_line('resume', 'b')}\n"
        )
        (resume,) = printed(stopped.stderr)
        followed(resume, lab, "case-b")
    finally:
        holder.close()
        receiver.stop()


# --- a checkpoint that cannot be written: exit 74 (hints.report_database_error) ----------------


def unwritable_then_followed(stopped, env, thread, operation, stuck=""):
    """A run stopped by a checkpoint it could not write: exit 74, one line naming the resume
    once CHECKPOINT_DB can be written (and the files it could not write, when it can tell:
    stuck). That resume, typed as printed: followed()'s outcome."""
    assert stopped.returncode == 74 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert stopped.stderr.endswith(
        "its request may have taken effect before the save failed; once CHECKPOINT_DB can be "
        f"written{stuck}, resume it with: {resume_line('resume', thread)}\n"
    ), stopped.stderr
    (resume,) = printed(stopped.stderr)
    return followed(resume, env, operation)


def chattr(flag, *paths):
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)


def test_a_checkpoint_made_immutable_while_the_request_is_out_names_the_resume(
    lab, receiver, tmp_path
):
    """The checkpoint file and its WAL made immutable (chattr +i, as root on ext4) while the
    ticket's request is out: its receipt cannot be saved, exit 74, and the line names the
    resume once CHECKPOINT_DB can be written. Writable again, that resume finds the ticket by
    its key (adopted) and sends nothing: one ticket."""
    held = tmp_path / "after-send"
    db = lab["CHECKPOINT_DB"]
    files = [db, f"{db}-wal"]  # not -shm: SQLite maps it (SIGBUS is not the case)
    made, ended = {}, threading.Event()

    def make_immutable():  # beside the run in this process: once it holds at after-send
        wait_until(lambda: held.exists() or ended.is_set(), 60, "the run at after-send")
        if not ended.is_set():
            made["chattr"] = chattr("+i", *files)
            failpoints.unpause(held)

    beside = threading.Thread(target=make_immutable)
    beside.start()
    try:
        start = ["start", "--thread", "ro", "--operation", "case-ro"]
        stopped = run_workflow_here(start, {**lab, "FAILPOINTS": f"after-send=pause({held})"})
    finally:
        ended.set()
        beside.join(60)
        chattr("-i", *files)  # always: pytest must be able to delete tmp_path
    assert "chattr" in made, stopped  # the run reached after-send
    if made["chattr"].returncode != 0:
        pytest.skip(f"chattr +i is not possible here (root on ext4 needed): {made['chattr']}")
    stuck = f" (read-only now: {db}, {db}-wal)"  # what chattr made immutable: the line names it
    done = unwritable_then_followed(stopped, lab, "ro", "case-ro", stuck)
    assert events(done.stdout)[0]["event"] == "effect_adopted", done.stdout  # not sent again


def test_a_read_only_checkpoint_names_the_resume_once_it_can_be_written(lab, receiver, monkeypatch):
    """Where chattr cannot run: the saver's own connection made read-only (a real SQLite
    refusal; a root process can make no file read-only), after a start drained by SIGTERM (lab
    09). The resume sends its ticket, cannot save it, exit 74, and names itself once
    CHECKPOINT_DB can be written; typed as printed, it finds the receipt: one ticket."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    start = ["start", "--thread", "rd", "--operation", "case-rd", "--term-at", "after-prepare"]
    assert run_workflow_here(start, lab).returncode == 75  # drained: the thread is saved
    setup = SqliteSaver.setup

    def unwritable_after_setup(self):
        setup(self)
        self.conn.execute("PRAGMA query_only = 1")  # SQLITE_READONLY at the next write

    with monkeypatch.context() as patch:
        patch.setattr(SqliteSaver, "setup", unwritable_after_setup)
        stopped = run_workflow_here(["resume", "--thread", "rd"], lab)
    done = unwritable_then_followed(stopped, lab, "rd", "case-rd")
    assert events(done.stdout)[0]["event"] == "effect_receipt", done.stdout  # not sent again


def test_a_checkpoint_immutable_before_the_resume_names_it_and_says_nothing_was_sent(lab, receiver):
    """The checkpoint file made immutable (chattr +i, as root on ext4) after a start drained
    before its ticket: the resume cannot write its effect's intent, so it sends nothing. Exit
    74; the line says so and names the file, and the resume once it can be written. Writable
    again, that resume sends the ticket: one."""
    start = ["start", "--thread", "im", "--operation", "case-im", "--term-at", "after-prepare"]
    assert run_workflow_here(start, lab).returncode == 75  # drained: the thread is saved
    db = lab["CHECKPOINT_DB"]
    made = chattr("+i", db)
    try:
        if made.returncode != 0:
            pytest.skip(f"chattr +i is not possible here (root on ext4 needed): {made}")
        stopped = run_workflow_here(["resume", "--thread", "im"], lab)
    finally:
        chattr("-i", db)  # always: pytest must be able to delete tmp_path
    assert stopped.returncode == 74 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert stopped.stderr.endswith(
        "its effect's intent could not be written, so this run sent nothing; once CHECKPOINT_DB "
        f"can be written (read-only now: {db}), resume it with: {resume_line('resume', 'im')}\n"
    ), stopped.stderr
    assert receiver_list(lab, "tickets") == []  # as the line says
    (resume,) = printed(stopped.stderr)
    done = followed(resume, lab, "case-im")
    assert events(done.stdout)[0]["event"] == "effect_ack", done.stdout  # sent now, once


# --- lab 07: approve is the command that goes on (labs/cli.py: args.resume) ---------------------


@pytest.mark.parametrize(
    "approval,mode,answer",
    [
        ("in-node", "safe", []),  # the trap: approve sends the ticket's request again (its key)
        ("in-node", "safe", ["--reject"]),
        ("before", "ledger", []),  # approve records the approval, then sends the ticket
    ],
    ids=["in-node approve", "in-node approve --reject", "before approve"],
)
def test_an_approve_with_no_receiver_names_the_approve_once_the_receiver_answers(
    lab, receiver, approval, mode, answer
):
    """Lab 07's run waits for approval; the answer typed while the receiver is gone: exit 3,
    and the line names that same answer (approve, or approve --reject), not a resume, which
    the waiting run refuses. Typed as printed: done as answered, one ticket and one ask."""
    operation = f"case-{approval}{''.join(answer)}"
    start = ["start", "--thread", "ap", "--operation", operation, "--mode", mode]
    waiting = run_workflow_here([*start, "--approval", approval], lab)
    assert events(waiting.stdout)[-1]["event"] == "awaiting_approval", waiting.stdout
    gone = {**lab, **ONE_TRY, "API_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens
    stopped = run_workflow_here(["approve", "--thread", "ap", *answer], gone)
    assert stopped.returncode == 3 and stopped.stderr.count("\n") == 1, stopped.stderr
    words = " ".join(["approve", *answer])
    assert stopped.stderr.endswith(
        f"; the run is saved: once the receiver answers, {resume_line(words, 'ap')}\n"
    ), stopped.stderr
    (again,) = printed(stopped.stderr)
    assert again == f"python -m labs {words} --thread ap"
    done = followed(again, lab, operation)
    assert events(done.stdout)[-1]["approved"] == (not answer), done.stdout  # --reject: no
    asks = [t for t in receiver_list(lab, "tickets") if t["key"] == f"{operation}:approval"]
    assert len(asks) == 1, asks  # the ask, once: its receipt


@pytest.mark.parametrize("approval,mode", [("in-node", "safe"), ("before", "ledger")])
def test_ctrl_c_during_approve_names_the_approve_that_goes_on(
    lab, receiver, tmp_path, approval, mode
):
    """Ctrl-C (SIGINT) during `approve`, the ticket's answer in and not yet saved (a real
    process held there): exit 130, one line naming `approve --thread T`. Typed as printed: the
    run ends approved with the ticket that answer made, and no second ticket."""
    operation = f"case-cc-{approval}"
    start = ["start", "--thread", "cc", "--operation", operation, "--mode", mode]
    waiting = run_workflow_here([*start, "--approval", approval], lab)
    assert events(waiting.stdout)[-1]["event"] == "awaiting_approval", waiting.stdout
    code, out, err = interrupted_at("after-ack", ["approve", "--thread", "cc"], lab, tmp_path)
    assert code == 130 and err.count("\n") == 1, err
    (answered,) = [e["ticket_id"] for e in events(out) if e["event"] == "effect_ack"]
    assert err.endswith(f"; resume it with: {resume_line('approve', 'cc')}\n"), err
    (again,) = printed(err)
    done = followed(again, lab, operation)
    last = events(done.stdout)[-1]
    assert (last["approved"], last["ticket_id"]) == (True, answered), done.stdout
