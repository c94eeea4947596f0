"""Every hint is a command a learner can paste (issue 49): the lines for a thread that another
lesson's command runs (labs/threads.py, labs/cli.py, labs/saga.py, labs/outbox.py), a saga
whose key another saga holds, the relay with nothing pending, a ticket's look, and hooks' move
again. Each is reached through the CLI as a learner reaches it, cut out as printed (its Docker
form checked to be the same command: tests/hints_helpers.py), run as a shell splits it, and
checked by its exit code and the receiver's lists: what it names happens, never a second
effect. (A start typed again on a crashed keyed saga, labs/saga.py's saga resume, is followed
in test_hints_as_printed.py; a worker's thread, on Postgres, is lab 10's.)"""

import contextlib
import io
import shlex
import subprocess
import sys

import pytest
from hints_helpers import printed
from test_hints_as_printed import CORE_HINT, follow, receiver_list, typed_here

from labs import relay
from tools.local import ROOT, events, run_workflow_here

EXIT_THREAD = 4  # another command's thread, or one that exists
MADE = {  # a thread of each lesson, as its crash leaves it
    "ticket": ["start", "--crash-at", "after-send"],  # its ticket made, no receipt kept
    "saga": ["saga", "start", "--crash-at", "after-charge-ack"],  # charged (a ticket)
    "outbox": ["outbox", "start", "--crash-at", "after-outbox"],  # its message written: no ticket
}


def lesson_of(values):
    """Whose thread a state shows: only a saga's holds seats, only an outbox run's delivery."""
    return "saga" if "seats" in values else "outbox" if "delivery" in values else "ticket"


def as_printed(command, env):
    """A hint's command as a shell runs it: the lessons' CLI and the relay in this process (the
    same code, no interpreter start), any other program as a process."""
    argv = shlex.split(command)
    if argv[:3] == ["python", "-m", "labs"]:
        return typed_here(command, env)
    if argv[:3] == ["python", "-m", "labs.relay"]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = relay.main(argv[3:], env)
        return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
    return follow(command, env)


def outbox(lab):
    """The outbox's messages, as `python -m labs.relay --show` lists them."""
    shown = as_printed("python -m labs.relay --show", lab)
    assert shown.returncode == 0, shown.stderr
    return events(shown.stdout)[0]["messages"]


def relayed_once(lab):
    """`python -m labs.relay --once`: delivers what is pending."""
    done = as_printed("python -m labs.relay --once", lab)
    assert done.returncode == 0, done.stderr
    return done


def refused_with_one_hint(typed, env, code=EXIT_THREAD):
    """typed refused with exit code, one line: the one command it names."""
    refused = run_workflow_here(typed, env)
    assert refused.returncode == code and refused.stderr.count("\n") == 1, refused.stderr
    (hint,) = printed(refused.stderr)
    return hint


@pytest.mark.parametrize(
    "kind,typed,names",
    [
        ("outbox", "resume", "outbox resume"),  # labs/threads.py owning_command_line
        ("outbox", "start", "outbox resume"),  # the same line
        ("saga", "state", "saga state"),  # labs/cli.py show_ticket_state
        ("outbox", "state", "outbox state"),  # the same
        ("ticket", "saga resume", "resume"),  # labs/saga.py saga_run
        ("ticket", "saga state", "state"),  # labs/saga.py saga_state
        ("outbox", "saga resume", "outbox resume"),  # saga_run names `resume`: refused
        ("outbox", "saga state", "outbox state"),  # saga_state names `state`: refused
        ("ticket", "outbox resume", "state"),  # labs/outbox.py outbox_run
        ("ticket", "outbox start", "state"),  # the same line, and "a new --thread"
        ("ticket", "outbox state", "state"),  # labs/outbox.py outbox_state
    ],
    ids=lambda value: value.replace(" ", "-"),
)
def test_a_command_on_another_lessons_thread_names_the_one_that_runs_it(
    lab, receiver, kind, typed, names
):
    """A command typed on a thread another lesson's command runs: exit 4, one line naming that
    command. Typed as printed, it works on the thread: a state shows it and sends nothing; a
    resume finishes it with the one ticket its lesson makes (the outbox's, once relayed)."""
    crashed = run_workflow_here([*MADE[kind], "--thread", "x"], lab)
    assert crashed.returncode == -9, crashed.stderr
    tickets = len(receiver_list(lab, "tickets"))
    hint = refused_with_one_hint([*typed.split(), "--thread", "x"], lab)
    followed = as_printed(hint, lab)
    assert followed.returncode == 0, (hint, followed.stderr)
    if names.endswith("state"):
        shown = events(followed.stdout)[0]
        assert (shown["event"], lesson_of(shown["values"])) == ("state", kind), followed.stdout
        assert len(receiver_list(lab, "tickets")) == tickets  # a look: nothing sent
    else:
        assert events(followed.stdout)[-1]["event"] == "done", followed.stdout
        if kind == "outbox":  # lab 19: the run writes the message; the relay sends it
            assert [m["state"] for m in outbox(lab)] == ["pending"]
            assert receiver_list(lab, "tickets") == []
            relayed_once(lab)
        assert len(receiver_list(lab, "tickets")) == 1  # the crashed run's ticket: not again
    assert hint == f"python -m labs {names} --thread x"


def test_a_thread_workflow_py_saved_names_workflow_pys_resume(lab, receiver):
    """A thread the core's `python workflow.py start` saved (no contract, no worker's job),
    killed after its ticket's answer, then `resume` in the lessons' CLI: exit 4, one line
    naming workflow.py's own resume. Typed as printed, the run finishes with that ticket (its
    key: asked for, not sent again)."""
    env = {**lab, "FAILPOINTS": "after-send=kill"}
    command = [sys.executable, "workflow.py", "start", "--thread", "w", "--operation", "w-op"]
    killed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    refused = run_workflow_here(["resume", "--thread", "w"], lab)
    assert refused.returncode == EXIT_THREAD and refused.stderr.count("\n") == 1, refused.stderr
    (words,) = CORE_HINT.findall(refused.stderr)  # labs/threads.py owning_command_line
    assert words.strip() == "resume --thread w", refused.stderr
    followed = follow(f"python workflow.py {words.strip()}", lab)
    assert followed.returncode == 0, followed.stderr
    (ticket,) = receiver_list(lab, "tickets")
    assert events(followed.stdout)[-1]["ticket_id"] == ticket["ticket_id"], followed.stdout


def test_a_saga_whose_key_another_saga_holds_names_that_sagas_state(lab, receiver):
    """A second saga of the same --operation asking for other seats: exit 1, one line naming
    the saga that holds the key. Typed as printed: that saga's state, done; nothing sent."""
    saga = ["saga", "start", "--operation", "case-k:book:v1"]
    assert run_workflow_here([*saga, "--thread", "a", "--seats", "2"], lab).returncode == 0
    hint = refused_with_one_hint([*saga, "--thread", "b", "--seats", "3"], lab, code=1)
    assert hint == "python -m labs saga state --thread a"  # labs/saga.py not_undone
    followed = as_printed(hint, lab)
    assert followed.returncode == 0, followed.stderr
    (shown,) = events(followed.stdout)
    assert (shown["values"]["seats"], shown["next"]) == (2, []), shown
    assert len(receiver_list(lab, "tickets")) == len(receiver_list(lab, "reservations")) == 1


@pytest.mark.parametrize("before", ["nothing", "the lesson's run"])
def test_the_relay_with_nothing_pending_names_the_outbox_start_that_writes_one(
    lab, receiver, before
):
    """`labs.relay --once` with nothing pending, before any outbox start or after lab 19's run
    (its --thread outbox) was relayed: exit 0, a line naming the list and the outbox start that
    writes a message. Typed as printed: one message pending, no ticket until the relay, which
    then makes one ticket per message."""
    if before != "nothing":
        lesson = "outbox start --thread outbox --operation case-outbox:open-ticket:v1"
        assert run_workflow_here(lesson.split(), lab).returncode == 0
        relayed_once(lab)
    tickets = len(receiver_list(lab, "tickets"))
    nothing = relayed_once(lab)
    show, start = printed(nothing.stderr)  # labs/relay.py main's
    again = (
        "--thread outbox-2 --operation case-outbox-2:open-ticket:v1" if before != "nothing" else ""
    )
    assert (show, start) == (
        "python -m labs.relay --show",
        f"python -m labs outbox start {again}".strip(),
    )
    written = as_printed(start, lab)
    assert written.returncode == 0, written.stderr
    assert [m["state"] for m in outbox(lab)].count("pending") == 1
    assert len(receiver_list(lab, "tickets")) == tickets  # written, not sent
    relayed_once(lab)
    assert len(receiver_list(lab, "tickets")) == len(outbox(lab)) == tickets + 1


def test_a_refused_word_on_a_ticket_names_the_look_and_the_word_that_settles_it(lab, receiver):
    """reconcile --not-sent on a ticket the receiver holds (its run killed after the send):
    exit 4, one line naming the --confirmed that records it and the tickets --operation to look
    with. Typed as printed: the look lists the ticket; the word settles it; the resume ends with
    that ticket, sent once."""
    killed = run_workflow_here(["start", "--operation", "ct", "--crash-at", "after-send"], lab)
    assert killed.returncode == -9, killed.stderr
    refused = run_workflow_here(["reconcile", "--not-sent", "ct"], lab)
    assert refused.returncode == EXIT_THREAD and refused.stderr.count("\n") == 1, refused.stderr
    confirm, look = printed(refused.stderr)  # workflow.py's ticket: its look_with
    assert (confirm, look) == (
        "python -m labs reconcile --confirmed ct",
        "python -m labs tickets --operation ct",
    )
    listed = as_printed(look, lab)
    assert listed.returncode == 0, listed.stderr
    assert [t["ticket_id"] for t in events(listed.stdout)[0]["tickets"]] == [1], listed.stdout
    settled = as_printed(confirm, lab)
    assert settled.returncode == 0, settled.stderr
    resumed = run_workflow_here(["resume"], lab)
    assert resumed.returncode == 0 and events(resumed.stdout)[-1]["ticket_id"] == 1, resumed
    assert len(receiver_list(lab, "tickets")) == 1


@pytest.mark.parametrize("mode", ["naive", "inbox"])
def test_hooks_whose_move_is_the_tickets_status_names_a_move_that_changes_it(lab, receiver, mode):
    """Lab 18's faults off (each webhook came once): hooks --move resolved leaves the ticket
    resolved, so the line's move again is opened,resolved (labs/hooks.py moved_again). Typed as
    printed: the ticket moves, each event comes once, one notice is sent."""
    assert run_workflow_here(["start", "--thread", "h"], lab).returncode == 0
    naive = ["--mode", "naive"] if mode == "naive" else []
    moved = run_workflow_here(["hooks", *naive, "--ticket", "1", "--move", "resolved"], lab)
    assert moved.returncode == 0 and events(moved.stdout)[-1]["status"] == "resolved", moved
    (again,) = printed(moved.stderr)
    assert again == shlex.join(
        ["python", "-m", "labs", "hooks", *naive, "--ticket", "1", "--move", "opened,resolved"]
    )
    messages = len(receiver_list(lab, "messages"))
    followed = as_printed(again, lab)
    assert followed.returncode == 0, followed.stderr
    came = [e for e in events(followed.stdout) if e["event"] == "webhook"]
    assert [e["status"] for e in came] == ["opened", "resolved"], followed.stdout
    assert len({e["event_id"] for e in came}) == 2  # each event once
    assert events(followed.stdout)[-1]["status"] == "resolved", followed.stdout
    assert len(receiver_list(lab, "messages")) == messages + 1  # one notice
    assert len(receiver_list(lab, "tickets")) == 1
