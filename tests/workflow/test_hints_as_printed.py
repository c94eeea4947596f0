"""Every hint is a command a learner can paste (issue 49): for the hints the lessons' CLI prints in
the guides' scenarios (a start typed again after a crash, Ctrl-C after a ticket's answer, exit
6's reconcile, hooks after Ctrl-C left a delivery pending, outbox resume, saga resume) and
workflow.py's own, the printed line's command is cut out as printed, split as a shell splits it
(shlex), run in the same environment as a real process, and does what the hint says: its exit
code, and never a second effect.

The Docker form beside each command is the same command: tools/native.py, the mapping the runner
and docs/native.md use, turns it into the native line printed beside it, word for word
(tests/hints_helpers.py). Through Docker, the runs of labs 02, 06, 07, 10, 12, 13, 15, 17, 18 and
19 follow their hints as printed (tests/guides/test_guides.py, HINTS_FOLLOWED)."""

import os
import queue
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from hints_helpers import printed, restarts

import workflow
from tools.backends import parse_command
from tools.local import ROOT, events, free_port, lab_env, run_workflow_here, wait_until
from tools.native import line as native_line

CORE_HINT = re.compile(r"python workflow\.py (?P<words>[^;()\n]+)")  # workflow.py's: no Docker
FOLLOW_TIMEOUT_S = 120


def typed_here(command, env):
    """A `python -m labs WORDS` hint split as a shell splits it, run in this process (the
    same code as the process, without a new interpreter and LangGraph's import)."""
    typed = shlex.split(command)
    assert typed[:3] == ["python", "-m", "labs"], command
    return run_workflow_here(typed[3:], env)


def follow(command, env):
    """command run as a shell runs it: split by shlex, `python` the one that has the
    requirements (sys.executable, as .venv/bin/python is natively), env the lab's."""
    argv = shlex.split(command)
    assert argv[0] == "python", command
    return subprocess.run(
        [sys.executable, *argv[1:]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=FOLLOW_TIMEOUT_S,
    )


def receiver_list(lab, table):
    return workflow.TicketClient(lab["API_URL"]).call(f"/{table}")[table]


def test_a_start_typed_again_after_a_crash_names_the_resume_that_finishes_it(lab, receiver):
    crashed = run_workflow_here(["start", "--thread", "cc2", "--crash"], lab)
    assert crashed.returncode == -9 and len(receiver_list(lab, "tickets")) == 1
    again = run_workflow_here(["start", "--thread", "cc2"], lab)
    assert again.returncode == 4, again.stderr
    (resume,) = printed(again.stderr)
    assert resume == "python -m labs resume --thread cc2"
    done = follow(resume, lab)
    assert done.returncode == 0, done.stderr
    assert events(done.stdout)[-1]["event"] == "done"
    assert len(receiver_list(lab, "tickets")) == 1  # the receipt: nothing sent again


@pytest.mark.parametrize("mode", ["safe", "naive"])
def test_ctrl_c_after_the_answer_names_the_resume_or_the_look_that_is_safe(
    lab, receiver, tmp_path, mode
):
    """Ctrl-C (SIGINT) while the ticket's answer is in and not yet saved (a real process held
    there; lab 17's start): exit 130, one line. Safe mode names the resume, which ends with the
    same ticket (its key); naive mode sends no key, so the line names a look at the receiver
    instead of the resume that would send it again. Typed as printed: no ticket more."""
    argv = ["start", "--thread", "cc", "--mode", mode, "--retry-after-ack", "timeout"]
    code, out, err = interrupted_at("after-ack", argv, lab, tmp_path)
    assert code == 130 and err.count("\n") == 1, err
    (answered,) = [e["ticket_id"] for e in events(out) if e["event"] == "effect_ack"]
    (hint,) = printed(err)
    look = {"safe": "python -m labs resume --thread cc", "naive": "python -m labs tickets"}[mode]
    assert hint == look, err
    followed = typed_here(hint, lab)
    assert followed.returncode == 0, followed.stderr
    if mode == "safe":
        done = events(followed.stdout)[-1]
        assert (done["event"], done["ticket_id"]) == ("done", answered), followed.stdout
    else:
        assert [t["ticket_id"] for t in events(followed.stdout)[0]["tickets"]] == [answered]
    assert [t["ticket_id"] for t in receiver_list(lab, "tickets")] == [answered]


@pytest.mark.parametrize(
    "point,look",
    [
        ("after-charge-ack", "python -m labs saga resume --thread sc"),  # keyed: resume is safe
        ("after-release-ack", "python -m labs saga releases"),
        ("after-refund-ack", "python -m labs saga refunds"),
    ],
)
def test_ctrl_c_in_a_naive_saga_names_its_resume_or_the_list_of_its_undo(
    lab, receiver, tmp_path, point, look
):
    """A naive saga sends its undos without a key; its other steps are keyed. Ctrl-C after an
    undo's answer names the list that shows that undo (`tickets` does not), and after a keyed
    step's, the saga resume. Typed as printed: the list holds the one undo made; the resume
    ends done, with one charge (a ticket) for the saga."""
    argv = ["saga", "start", "--thread", "sc", "--seats", "2", "--ship-to", "AQ"]
    code, _, err = interrupted_at(point, [*argv, "--mode", "naive"], lab, tmp_path)
    assert code == 130 and err.count("\n") == 1, err
    (hint,) = printed(err)
    assert hint == look, err
    followed = typed_here(hint, lab)
    assert followed.returncode == 0, followed.stderr
    if point == "after-charge-ack":
        assert events(followed.stdout)[-1]["event"] == "done", followed.stdout
        assert len(receiver_list(lab, "tickets")) == 1  # the charge, sent once: its key
    else:
        listed = events(followed.stdout)[0][look.rsplit(" ", 1)[1]]  # "releases", "refunds"
        assert len(listed) == 1, followed.stdout  # the undo the interrupted run made


@pytest.mark.parametrize(
    "argv,point,look",
    [
        (["start", "--mode", "naive"], "after-ack", "python -m labs tickets"),
        (
            ["saga", "start", "--seats", "2", "--ship-to", "AQ", "--mode", "naive"],
            "after-release-ack",
            "python -m labs saga releases",
        ),
    ],
    ids=["ticket", "saga release"],
)
def test_a_naive_resume_that_finds_no_receiver_names_the_list_to_look_at_first(
    lab, receiver, argv, point, look
):
    """Killed after a keyless request's answer, then resumed while nothing answers at API_URL:
    exit 3. The line does not say to resume once the receiver answers (that resume sends the
    request again, and the first went through) but names the list to look at first. Typed as
    printed, against the receiver: it shows the one the killed run made."""
    crashed = run_workflow_here([*argv, "--thread", "gone", "--crash-at", point], lab)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    nobody = {**lab, "API_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    resume = [*argv[: argv.index("start")], "resume", "--thread", "gone"]
    stopped = run_workflow_here(resume, nobody)
    assert stopped.returncode == 3 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert "it sends no key" in stopped.stderr, stopped.stderr
    (hint,) = printed(stopped.stderr)
    assert hint == look, stopped.stderr
    listed = typed_here(hint, lab)
    assert listed.returncode == 0, listed.stderr
    assert len(events(listed.stdout)[0][look.rsplit(" ", 1)[1]]) == 1, listed.stdout


def interrupted_at(point, argv, lab, tmp_path):
    """`python -m labs ARGV` held at failpoint `point` (a pause), then Ctrl-C (SIGINT), as a
    learner's terminal sends it: (its exit code, stdout, stderr)."""
    held = tmp_path / f"held-{point}"
    run = subprocess.Popen(
        [sys.executable, "-m", "labs", *argv],
        env={**lab, "FAILPOINTS": f"{point}=pause({held})"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: held.exists() or run.poll() is not None, 60, f"the run at {point}")
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=FOLLOW_TIMEOUT_S)
    finally:
        run.kill()
    return run.returncode, out, err


def test_exit_6_names_the_reconcile_that_settles_it_and_the_resume_sends_nothing(lab, receiver):
    start = ["start", "--thread", "note", "--notify", "--crash"]  # lab 15's: after the ticket,
    assert run_workflow_here(start, lab).returncode == -9  # then in the message's window
    window = ["resume", "--thread", "note", "--crash-at", "after-send"]
    assert run_workflow_here(window, lab).returncode == -9
    sent_at = time.monotonic()
    stopped = run_workflow_here(["resume", "--thread", "note"], lab)
    assert stopped.returncode == 6, stopped.stderr
    looked, confirmed, not_sent = printed(stopped.stderr)
    assert looked == "python -m labs messages"
    key = "case-001:open-ticket:v1:notify"
    assert confirmed == f"python -m labs reconcile --confirmed {key}=ID"
    assert not_sent == f"python -m labs reconcile --not-sent {key}"
    listed = follow(looked, lab)
    assert listed.returncode == 0, listed.stderr
    (message,) = events(listed.stdout)[0]["messages"]  # the one the crashed run sent
    sent = message["message_id"]
    time.sleep(max(0.0, workflow.RECEIVER_SETTLE_S + 0.2 - (time.monotonic() - sent_at)))
    typo = sent + 6  # a person's typo (issue 49): the provider has no lookup to check it by
    settled = follow(confirmed.replace("=ID", f"={typo}"), lab)  # "taken 5 s after the last
    assert settled.returncode == 0, settled.stderr  # send", as the line says
    again = run_workflow_here(["reconcile", "--confirmed", f"{key}={sent}"], lab)
    assert again.returncode == 4 and "not open (confirmed)" in again.stderr, again.stderr
    _, correcting = printed(again.stderr)  # the refusal names the correction
    assert correcting == f"python -m labs reconcile --correct {key}=ID"
    typed = shlex.split(correcting.replace("=ID", f"={sent}"))  # as printed; in this process
    assert typed[:3] == ["python", "-m", "labs"]  # (the test's budget: no second interpreter)
    corrected = run_workflow_here(typed[3:], lab)
    assert corrected.returncode == 0, corrected.stderr
    (said,) = [e for e in events(corrected.stdout) if e["event"] == "corrected"]
    assert (said["key"], said["was"], said["now"]) == (key, str(typo), str(sent)), said
    assert said["who"].endswith(": a person: reconcile --correct"), said
    with sqlite3.connect(lab["CHECKPOINT_DB"]) as db:  # the person's first answer is kept
        kept = db.execute("SELECT external_id FROM effect_receipts WHERE key = ?", (key,))
        assert kept.fetchall() == [(str(typo),)]
    shown = events(run_workflow_here(["reconcile"], lab).stdout)  # lists every correction
    assert {"event": "effect_corrected", "key": key, "was": str(typo), "now": str(sent),
            "who": said["who"]} in shown, shown  # fmt: skip
    resumed = run_workflow_here(["resume", "--thread", "note"], lab)
    assert resumed.returncode == 0, resumed.stderr
    assert events(resumed.stdout)[0]["receipt"] == {"message_id": sent}  # the corrected id
    assert events(resumed.stdout)[-1]["message_id"] == sent
    assert len(receiver_list(lab, "messages")) == 1  # one message: never a second
    ticket = run_workflow_here(["reconcile", "--correct", "case-001:open-ticket:v1=9"], lab)
    assert ticket.returncode == 4 and "confirmed by its provider" in ticket.stderr  # answered


def test_hooks_for_a_ticket_nothing_moved_names_the_move_and_the_list(lab, receiver):
    """`hooks --ticket 1` before any webhook for it: the line names the move that makes one and
    the list of the receiver's tickets. Typed as printed: the ticket's events come, once each,
    and the list shows the ticket."""
    workflow.TicketClient(lab["API_URL"]).create("Webhooks", "case-hooks:open-ticket:v1")
    quiet = typed_here("python -m labs hooks --ticket 1", lab)
    assert quiet.returncode == 0 and events(quiet.stdout)[-1]["status"] is None, quiet.stdout
    move, listing = printed(quiet.stderr)
    assert move == "python -m labs hooks --ticket 1 --move opened,resolved", quiet.stderr
    moved = typed_here(move, lab)
    assert moved.returncode == 0, moved.stderr
    came = [e["status"] for e in events(moved.stdout) if e["event"] == "webhook"]
    assert (came, events(moved.stdout)[-1]["status"]) == (["opened", "resolved"], "resolved")
    listed = typed_here(listing, lab)
    assert [t["ticket_id"] for t in events(listed.stdout)[0]["tickets"]] == [1], listed.stdout


def test_hooks_after_ctrl_c_names_the_command_that_takes_the_pending_events(lab, receiver):
    """Ctrl-C while hooks waits for its subscription (a receiver that never answers): the line
    names the hooks that takes what waits. Typed as printed against the lab's receiver, where
    ticket 2's events wait undelivered, it takes each once; typed again, nothing more."""
    client = workflow.TicketClient(lab["API_URL"])
    for title in ("one", "two"):
        client.call("/tickets", {"title": title})
    client.call("/progress", {"ticket_id": 2, "statuses": ["opened", "resolved"]})  # pending
    silent = socket.create_server(("127.0.0.1", 0))
    hooks = subprocess.Popen(
        [sys.executable, "-m", "labs", "hooks", "--ticket", "2"],
        env={**lab, "API_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        held, _ = silent.accept()
        hooks.send_signal(signal.SIGINT)
        _, err = hooks.communicate(timeout=60)
    finally:
        if hooks.poll() is None:
            hooks.kill()
        silent.close()
    held.close()
    assert hooks.returncode == 130, err
    (take,) = printed(err)
    assert take == "python -m labs hooks --ticket 2"
    taken = follow(take, lab)
    assert taken.returncode == 0, taken.stderr
    status = events(taken.stdout)[-1]
    assert (status["status"], status["version"]) == ("resolved", 2), taken.stdout
    messages = len(receiver_list(lab, "messages"))
    again = follow(take, lab)
    assert again.returncode == 0 and events(again.stdout)[-1] == status, again.stdout
    assert len(receiver_list(lab, "messages")) == messages  # nothing applied twice


def test_an_outbox_start_typed_again_names_the_outbox_resume(lab, receiver):
    start = ["outbox", "start", "--thread", "o", "--crash-at", "after-outbox"]
    assert run_workflow_here(start, lab).returncode == -9
    again = run_workflow_here(["outbox", "start", "--thread", "o"], lab)
    assert again.returncode == 4, again.stderr
    (resume,) = printed(again.stderr)
    assert resume == "python -m labs outbox resume --thread o"
    done = follow(resume, lab)
    assert done.returncode == 0, done.stderr
    relayed = follow("python -m labs.relay --once", lab)
    assert relayed.returncode == 0, relayed.stderr
    assert len(receiver_list(lab, "tickets")) == 1  # one message in the outbox, one ticket
    nothing = follow("python -m labs.relay --once", lab)  # the relay's own hints
    assert nothing.returncode == 0, nothing.stderr
    show, start = printed(nothing.stderr)
    again = "python -m labs outbox start --thread outbox-2 --operation case-outbox-2:open-ticket:v1"
    assert (show, start) == ("python -m labs.relay --show", again)  # its defaults are taken
    shown = follow(show, lab)
    assert shown.returncode == 0, shown.stderr
    (message,) = events(shown.stdout)[0]["messages"]
    assert message["state"] == "published", message


@pytest.mark.parametrize("typed", [["resume"], ["saga", "start"]])
def test_a_saga_thread_names_the_saga_resume(lab, receiver, typed):
    """A saga killed after its charge's answer; `resume` without saga, or its start typed
    again: the line names saga resume, which finishes it with one charge."""
    start = ["saga", "start", "--thread", "s", "--crash-at", "after-charge-ack"]
    assert run_workflow_here(start, lab).returncode == -9
    refused = run_workflow_here([*typed, "--thread", "s"], lab)
    assert refused.returncode == 4, refused.stderr
    (resume,) = printed(refused.stderr)
    assert resume == "python -m labs saga resume --thread s"
    done = follow(resume, lab)
    assert done.returncode == 0, done.stderr
    assert len(receiver_list(lab, "tickets")) == 1  # one charge
    assert len(receiver_list(lab, "reservations")) == 1


def test_workflow_py_names_its_own_command(lab, receiver):
    """The core's CLI: `python workflow.py ...`, no Docker form (no service runs it)."""
    crashed = follow("python workflow.py start --thread w", {**lab, "FAILPOINTS": "after-ack=kill"})
    assert crashed.returncode == -9, crashed.stderr
    again = follow("python workflow.py start --thread w", lab)
    assert again.returncode == 4, again.stderr
    assert "Docker" not in again.stderr and "-m labs" not in again.stderr, again.stderr
    (resume,) = [m["words"] for m in CORE_HINT.finditer(again.stderr)]
    assert resume == "resume --thread w"
    done = follow(f"python workflow.py {resume}", lab)
    assert done.returncode == 0, done.stderr
    assert len(receiver_list(lab, "tickets")) == 1


# --- a 404 is read, not guessed (issue 49, item 2) ---------------------------------------------


def test_a_404_with_the_receivers_reason_says_that_reason_not_check_api_url(lab, receiver):
    """No ticket 99: the receiver's 404 names what is missing; the address is right."""
    done = run_workflow_here(["hooks", "--ticket", "99", "--move", "resolved"], lab)
    assert done.returncode == 1 and events(done.stdout)[0]["status"] == 404, done.stdout
    assert done.stderr == (
        f"labs: the receiver at API_URL {lab['API_URL']} answered 404: no ticket 99; check "
        "ticket_id; nothing was made\n"
    )


def test_a_404_for_a_wrong_address_still_says_check_api_url(lab, receiver):
    """A path the receiver has no route for (its own JSON says so), and another server's 404
    page (no JSON): each is the address, and the line says which setting to check."""
    wrong_path = {**lab, "API_URL": lab["API_URL"] + "/v1"}
    done = run_workflow_here(["hooks", "--ticket", "99", "--move", "resolved"], wrong_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "answered 404: nothing was made" in done.stderr
    assert "check API_URL (its host, port and path)" in done.stderr
    assert "no ticket" not in done.stderr
    not_found = type(  # another server: every POST answered by http.server's 404 page
        "NotFound",
        (BaseHTTPRequestHandler,),
        {"do_POST": lambda self: self.send_error(404), "log_message": lambda *_: None},
    )
    other = HTTPServer(("127.0.0.1", 0), not_found)
    serving = threading.Thread(target=other.serve_forever, daemon=True)
    serving.start()
    try:
        elsewhere = {**lab, "API_URL": f"http://127.0.0.1:{other.server_port}"}
        done = run_workflow_here(["hooks", "--ticket", "99", "--move", "resolved"], elsewhere)
    finally:
        other.shutdown()
        other.server_close()
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "answered 404 without the receiver's JSON: API_URL (its port)" in done.stderr


# --- a lesson's missing condition (labs/conditions.py): its line typed as printed ---------------


class Terminal:
    """A learner's shell, natively as docs/native.md has it: one bash that reads what is pasted,
    a line at a time, in a folder laid out as the clone (its files linked, its own data/), with
    the receiver started as that page starts it (`up`: job %1, its log in data/receiver.log)."""

    MARK = "::pasted::"

    def __init__(self, folder):
        folder.mkdir()
        for entry in ROOT.iterdir():
            if entry.name not in ("data", ".git"):
                (folder / entry.name).symlink_to(entry)
        self.env = lab_env(folder / "data", free_port())  # docs/native.md's data/ paths, whole
        for unset in ("FAILPOINTS", "API_TIMEOUT_S", "VIRTUAL_ENV"):
            self.env.pop(unset, None)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.bash = subprocess.Popen(
            ["bash"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=folder,
            env=self.env,
            text=True,
            start_new_session=True,  # its jobs in its group: close() can end them all
        )
        self.lines = (queue.Queue(), queue.Queue())
        for stream, lines in zip((self.bash.stdout, self.bash.stderr), self.lines, strict=True):
            threading.Thread(target=self.read, args=(stream, lines), daemon=True).start()
        up = native_line(
            parse_command("docker compose -p stateful-lab up -d --build api"), {}, False, False
        )
        assert self.paste(up).returncode == 0
        wait_until(self.answers, 60, "the receiver's first answer")

    @staticmethod
    def read(stream, lines):
        for line in stream:
            lines.put(line)

    def paste(self, line):
        """line typed into the shell as is; its stdout, stderr and $? when it is done."""
        self.bash.stdin.write(f'{line}\necho "{self.MARK} $?"; echo {self.MARK} >&2\n')
        self.bash.stdin.flush()
        out, err = self.until(self.lines[0]), self.until(self.lines[1])
        code = int(out.pop().split()[1])
        return subprocess.CompletedProcess(line, code, "".join(out), "".join(err[:-1]))

    def until(self, lines):
        got = [lines.get(timeout=FOLLOW_TIMEOUT_S)]
        while not got[-1].startswith(self.MARK):
            got.append(lines.get(timeout=FOLLOW_TIMEOUT_S))
        return got

    def answers(self):
        try:
            with urllib.request.urlopen(self.env["API_URL"] + "/health", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def close(self):
        try:
            self.paste("kill %1 2>/dev/null; wait")  # the receiver, as the page stops it
            self.bash.stdin.close()
            self.bash.wait(30)
        finally:
            if self.bash.poll() is None:
                os.killpg(self.bash.pid, signal.SIGKILL)
                self.bash.wait(30)


@pytest.fixture
def terminal(tmp_path):
    shell = Terminal(tmp_path / "lab")
    yield shell
    shell.close()


def condition_commands(done, says, restarted):
    """A run that ended well with one line on stderr, a lesson's condition missing
    (labs/conditions.py): the line starts with says, and its restart starts the receiver as
    restarted. -> (that restart, the command it names to type next)."""
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(says), line
    (restart,) = restarts(line)
    assert restarted in restart, restart
    (again,) = printed(line)
    return restart, again


def charged(env, reference):
    """The charges committed under reference, once none is pending (?settled=1 waits)."""
    query = f"/payments?reference={reference}&settled=1"
    return workflow.TicketClient(env["API_URL"]).call(query)["payments"]


def test_lab_15_typed_without_its_conditions_names_the_commands_that_make_it_happen(terminal):
    """Lab 15's charge answered at once (the receiver started without its slow-payments file,
    the client's timeout the default 5 s): the line's commands, pasted into the learner's shell
    as printed, start the receiver again slow and charge a new operation that times out, exit 6,
    the payment uncertain; the exit-6 line's own commands then settle it. One charge each."""
    env = terminal.env
    paid = run_workflow_here(["start", "--thread", "pay", "--operation", "case-pay", "--pay"], env)
    restart, again = condition_commands(
        paid,
        "labs: lab 15's slow provider did not happen",
        "FAILPOINTS='payment-commit=sleep(3)' python -m labs.receiver",
    )
    assert again == (
        "API_TIMEOUT_S=0.5 python -m labs start --thread pay-again --operation case-pay-again --pay"
    )
    assert terminal.paste(restart).returncode == 0
    uncertain = terminal.paste(again)  # as pasted next: the client retries a refused connection
    assert uncertain.returncode == 6, uncertain.stderr  # the lesson: no answer in 0.5 s
    (stop,) = uncertain.stderr.splitlines()
    assert stop.startswith("labs: effect payment 'case-pay-again:pay' may have happened"), stop
    look, reconcile = printed(stop)
    assert (look, reconcile) == (
        "python -m labs payments --reference case-pay-again:pay",
        "python -m labs reconcile",
    )
    (charge,) = charged(env, "case-pay-again:pay")  # committed 3 s late: one charge
    looked = typed_here(look, env)  # as printed, in this process (its budget: no interpreter)
    assert looked.returncode == 0 and charge in events(looked.stdout)[0]["payments"], looked
    settled = typed_here(reconcile, env)
    assert settled.returncode == 0, settled.stderr
    reconciled = {"effect": "payment", "event": "reconciled", "key": "case-pay-again:pay",
                  "now": "confirmed", "was": "unknown"}  # fmt: skip
    assert events(settled.stdout)[0] == reconciled, settled.stdout  # found at the provider
    resumed = run_workflow_here(["resume", "--thread", "pay-again"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert events(resumed.stdout)[-1]["payment_id"] == charge["payment_id"]  # from the receipt
    assert len(charged(env, "case-pay-again:pay")) == len(charged(env, "case-pay:pay")) == 1


@pytest.mark.parametrize("mode", ["naive", "inbox"])
def test_lab_18_typed_without_its_webhook_faults_names_the_commands_that_make_them(terminal, mode):
    """Lab 18's hooks with the receiver started without its webhooks file: each event came
    once. The line's commands, pasted as printed, start the receiver again with the faults and
    move the ticket again: each event comes twice, newest first. Naive applies each delivery:
    the double notice and the status going back, the lab's duplicate; the inbox flags the
    second of each and sends one notice. No condition line now, and no ticket more."""
    env = terminal.env
    made = run_workflow_here(["start", "--thread", "hook-1", "--operation", "case-hook-1"], env)
    assert made.returncode == 0, made.stderr
    typed = ["hooks", "--mode", mode] if mode == "naive" else ["hooks"]  # the inbox: the default
    typed += ["--ticket", "1", "--move", "opened,in_progress,resolved"]
    once = run_workflow_here(typed, env)
    restart, again = condition_commands(
        once,
        "labs: each webhook came once (3 deliveries)",
        "FAILPOINTS='redeliver=on;reorder=on' python -m labs.receiver",
    )
    assert again == "python -m labs " + shlex.join(typed)  # a status changes: the move again
    messages = len(receiver_list(env, "messages"))
    assert terminal.paste(restart).returncode == 0
    twice = terminal.paste(again)
    assert twice.returncode == 0 and twice.stderr == "", twice.stderr
    came = [e for e in events(twice.stdout) if e["event"] == "webhook"]
    twice_each = sorted(["evt_4", "evt_5", "evt_6"] * 2)  # ticket 1's second three events
    assert sorted(e["event_id"] for e in came) == twice_each, twice.stdout
    sent = [e for e in events(twice.stdout) if e["event"] == "message_sent"]
    status = events(twice.stdout)[-1]["status"]
    if mode == "naive":  # every delivery applied: resolved's notice twice, then back to opened
        assert (len(sent), status) == (2, "opened"), twice.stdout
    else:  # the second of each flagged; the older ones not applied; one notice
        assert [e["duplicate"] for e in came] == [False, True] * 3, twice.stdout
        assert (len(sent), status) == (1, "resolved"), twice.stdout
    assert len(receiver_list(env, "messages")) == messages + len(sent)  # nothing else was sent
    assert len(receiver_list(env, "tickets")) == 1


def test_lab_06_typed_without_its_lost_answer_names_the_commands_that_make_it_happen(terminal):
    """Lab 06's `--crash-at lost-ack` against a receiver started without its lost-ack file: the
    answer came, and the line says so. Its commands, pasted as printed, start the receiver again
    with the fault and run the lesson on a new thread: that answer is lost (exit 3, the ticket
    made), the lab's condition; naive's resume then makes the second ticket the lab is about."""
    env = terminal.env
    typed = ["start", "--thread", "lost", "--operation", "case-lost", "--mode", "naive"]
    answered = run_workflow_here([*typed, "--crash-at", "lost-ack"], env)
    restart, again = condition_commands(
        answered,
        "labs: --crash-at lost-ack: the receiver answered anyway",
        "FAILPOINTS=before-answer=drop-answer python -m labs.receiver",
    )
    assert again == (
        "python -m labs start --thread lost-again --operation case-lost-again --mode naive "
        "--crash-at lost-ack"
    )
    assert terminal.paste(restart).returncode == 0
    lost = terminal.paste(again)
    assert lost.returncode == 3 and "answered anyway" not in lost.stderr, lost.stderr
    tickets = receiver_list(env, "tickets")
    assert len(tickets) == 2, tickets  # the first run's, and the one whose answer was lost
    resumed = run_workflow_here(["resume", "--thread", "lost-again"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert len(receiver_list(env, "tickets")) == 3  # naive: the lab's duplicate, as taught
