"""The lab's own recovery commands must not make the duplicate the lab teaches against.

`migrate` writes a thread's new position as the node that wrote the saved one, checks the
result in a copy before anything is written, and refuses threads of other programs; every
exit-65 line names `migrate` only when migrate would move the thread. In-process (lab.main,
workflow.main) against a real receiver and a real SqliteSaver file (test_recovery_postgres.py:
the same refusal on Postgres).
"""

import json

import pytest

import checkpoints
import effects
import exitcodes
import hints
import workflow
from labs import cli as lab_py  # `lab` is the fixture: the lab's environment
from labs import contract as contract_lesson
from labs import lab_graph, worker_run
from labs import saga as saga_lesson

DOCKER = "Docker: docker compose -p stateful-lab run --rm workflow"  # a hint's Docker form

pytestmark = pytest.mark.fast


def run(capsys, env, *argv):
    """labs/cli.py ARGS in this process: (exit code, events, stderr)."""
    code = lab_py.main(list(argv), env)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def v2(env):
    return {**env, "LAB_GRAPH_VERSION": "2"}


def tickets(env):
    return workflow.TicketClient(env["API_URL"]).tickets()


def history(env, thread):
    """Every checkpoint of the thread, newest first, with its pending writes: what a write adds."""
    with checkpoints.open_checkpointer(env["CHECKPOINT_DB"]) as saver:
        config = checkpoints.thread_config(thread)
        return [(c.checkpoint["id"], c.pending_writes) for c in saver.list(config)]


def test_a_finished_thread_migrated_to_v2_stays_finished(lab, receiver, capsys):
    """The review's A.1: migrate said next [], state then said ["open_ticket"], resume made a
    second ticket (update_state without as_node wrote as prepare, whose edge fired)."""
    assert run(capsys, lab, "start", "--thread", "f", "--mode", "naive")[0] == 0
    code, events, _ = run(capsys, v2(lab), "migrate", "--thread", "f")
    assert code == 0 and events[0]["event"] == "migrated"
    assert (events[0]["was"], events[0]["next"]) == ([], [])
    assert run(capsys, v2(lab), "state", "--thread", "f")[1][0]["next"] == []
    code, events, _ = run(capsys, v2(lab), "resume", "--thread", "f")
    assert code == 0 and [e["event"] for e in events] == ["done"]  # nothing ran
    assert len(tickets(lab)) == 1


def test_a_thread_waiting_at_its_own_node_approval_migrates_and_approve_answers_it(
    lab, receiver, capsys
):
    start = ["start", "--thread", "a", "--approval", "own-node", "--mode", "naive"]
    assert run(capsys, lab, *start)[1][-1]["event"] == "awaiting_approval"
    code, events, _ = run(capsys, v2(lab), "migrate", "--thread", "a")
    assert code == 0 and events[0]["next"] == ["approval"] == events[0]["was"]
    assert run(capsys, v2(lab), "state", "--thread", "a")[1][0]["next"] == ["approval"]
    code, events, err = run(capsys, v2(lab), "approve", "--thread", "a")
    assert code == 0, err
    # the wait, and the ask answered by its receipt in the ledger: no effect sent again
    assert [e["event"] for e in events] == ["approval_requested", "approval", "done"]
    assert events[0]["how"] == "receipt"
    assert len(tickets(lab)) == 2  # the ticket and the ask for approval


def test_a_move_whose_next_would_differ_is_refused_and_nothing_is_written(
    lab, receiver, capsys, monkeypatch
):
    """A mapping that would write the finished thread as `prepare` (whose edge leads to the
    effect): checked in the copy, refused with one line, the saved thread as it was."""
    assert run(capsys, lab, "start", "--thread", "f")[0] == 0
    before = history(lab, "f")
    monkeypatch.setitem(contract_lesson.RENAMES, "2", {"create_ticket": "prepare"})
    code, events, err = run(capsys, v2(lab), "migrate", "--thread", "f")
    assert (code, events) == (contract_lesson.EXIT_CONTRACT, []) and err.count("\n") == 1, err
    assert "its next would be ['open_ticket'], not []" in err and "nothing written" in err
    assert history(lab, "f") == before


def test_migrate_to_the_contract_the_thread_has_writes_nothing_and_says_so(lab, receiver, capsys):
    assert run(capsys, lab, "start", "--thread", "same")[0] == 0
    before = history(lab, "same")
    code, events, _ = run(capsys, lab, "migrate", "--thread", "same")
    current = contract_lesson.contract(lab_graph.build_lab_graph(None))
    assert code == 0 and events == [{"event": "unchanged", "contract": current, "next": []}]
    assert history(lab, "same") == before


def test_migrate_of_no_such_thread_does_not_talk_of_resume(lab, capsys):
    code, events, err = run(capsys, lab, "migrate", "--thread", "nosuch")
    assert (code, events) == (exitcodes.EXIT_THREAD, [])
    assert err == "labs: no thread 'nosuch'; check --thread\n"


def saga(capsys, env, thread):
    """A finished lab 13 saga (refused, refunded) on thread; its state."""
    start = ["saga", "start", "--thread", thread, "--seats", "11", "--mode", "naive"]
    assert run(capsys, env, *start)[0] == 0
    return run(capsys, env, "saga", "state", "--thread", thread)[1]


@pytest.mark.parametrize("command", ["resume", "migrate", "approve"])
def test_a_saga_thread_is_refused_by_the_plain_commands_which_name_saga_resume(
    lab, receiver, capsys, command
):
    """The review's A.2: lab 13's `resume --thread naive` (saga forgotten) said to migrate,
    which rewrote the saga into the ticket graph; resume then charged a second time."""
    before = saga(capsys, lab, "naive"), history(lab, "naive"), tickets(lab)
    code, events, err = run(capsys, v2(lab), command, "--thread", "naive")
    assert (code, events) == (exitcodes.EXIT_THREAD, []) and err.count("\n") == 1, err
    assert "saga resume --thread naive" in err and "migrate" not in err
    code, events, err = run(capsys, lab, "resume", "--thread", "naive", "--no-contract")
    assert (code, events) == (exitcodes.EXIT_THREAD, []) and "saga resume" in err
    after = run(capsys, lab, "saga", "state", "--thread", "naive")[1], history(lab, "naive")
    assert (*after, tickets(lab)) == before


def test_state_and_saga_state_each_refuse_the_others_thread(lab, receiver, capsys):
    """`state --thread naive` in lab 13 (saga forgotten) read the saga with the ticket graph:
    `next: []` for a saga that waits at its refund. `saga state` of a ticket thread, the same."""
    saga(capsys, lab, "naive")
    code, events, err = run(capsys, lab, "state", "--thread", "naive")
    assert (code, events) == (exitcodes.EXIT_THREAD, [])
    assert err == (
        "labs: thread 'naive' is a saga (lab 13): python -m labs saga state --thread naive "
        f"({DOCKER} saga state --thread naive)\n"
    )
    assert run(capsys, lab, "start", "--thread", "plain")[0] == 0
    code, events, err = run(capsys, lab, "saga", "state", "--thread", "plain")
    assert (code, events) == (exitcodes.EXIT_THREAD, [])
    assert err == (
        "labs: thread 'plain' is not a saga; python -m labs state --thread plain "
        f"({DOCKER} state --thread plain) shows it\n"
    )


def test_a_naive_saga_waiting_at_its_refund_is_not_offered_a_plain_saga_resume(
    lab, receiver, capsys
):
    """A naive saga killed after its refund's answer waits at the refund, which goes without a
    key: `saga resume` refunds again (lab 13's duplicate). The lines that name it say so, and a
    line typed as printed before the colon changes nothing."""
    with checkpoints.open_checkpointer(lab["CHECKPOINT_DB"]) as saver:  # refused, refund pending
        values = {"operation_id": "o", "title": "t", "seats": 11, "mode": "naive"}
        graph = saga_lesson.build_saga(saver)
        config = checkpoints.thread_config("n")
        graph.update_state(config, {**values, "ticket_id": 1}, as_node="charge")
        graph.update_state(config, {"refused": "no capacity"}, as_node="reserve")
        assert graph.get_state(config).next == ("refund",)
    for command in (["resume"], ["migrate"], ["saga", "start"]):
        code, events, err = run(capsys, lab, *command, "--thread", "n")
        assert (code, events) == (exitcodes.EXIT_THREAD, []) and err.count("\n") == 1, err
        assert "without a key (--mode naive)" in err and "refunds again" in err, err
        assert (
            f"look at the refunds first, python -m labs saga refunds ({DOCKER} saga refunds)" in err
        )
    assert run(capsys, lab, "saga", "refunds")[1][0]["refunds"] == []


def test_a_worker_thread_is_refused_with_the_command_that_owns_it(lab, receiver, capsys):
    """A thread saved by labs/workers.py's run_thread (no contract in its checkpoints)."""
    from langgraph.runtime import RunControl

    operation = {"thread": "w", "operation_id": "w:open-ticket:v1", "title": "W", "mode": "safe"}
    with (
        checkpoints.open_checkpointer(lab["CHECKPOINT_DB"]) as saver,
        effects.open_ledger(lab["CHECKPOINT_DB"]) as ledger,
    ):
        client = workflow.TicketClient(lab["API_URL"])
        graph = lab_graph.build_lab_graph(
            saver
        )  # the graph labs/workers.py runs by default (WORKER_GRAPH)
        done = worker_run.run_job_thread(graph, client, ledger, operation, 1, RunControl())
        assert done["ticket_id"] == 1
    capsys.readouterr()
    before = history(lab, "w")
    for command in ("migrate", "resume"):
        code, events, err = run(capsys, lab, command, "--thread", "w")
        assert (code, events) == (exitcodes.EXIT_THREAD, []) and err.count("\n") == 1, err
        workers = "docker compose -p stateful-lab run --rm worker"
        assert f"python -m labs.workers state --thread w (Docker: {workers} state" in err, err
        assert "migrate" not in err
    assert history(lab, "w") == before


def test_the_exit_65_line_offers_migrate_only_toward_a_graph_it_can_move_to(lab, receiver, capsys):
    """Saved by version 2 (drained before open_ticket), resumed by version 1: migrate to
    version 1 has no open_ticket to send it to, so the line does not offer it."""
    env = {**v2(lab), "FAILPOINTS": "after-prepare=term"}
    assert run(capsys, env, "start", "--thread", "new")[0] == exitcodes.EXIT_DRAINED
    code, events, err = run(capsys, lab, "resume", "--thread", "new")
    assert code == contract_lesson.EXIT_CONTRACT and events[0]["event"] == "contract_mismatch"
    assert err.count("\n") == 1 and "migrate --thread" not in err, err
    assert "migrate cannot move it (this graph has no node ['open_ticket'])" in err
    assert run(capsys, lab, "migrate", "--thread", "new")[0] == contract_lesson.EXIT_CONTRACT
    assert tickets(lab) == []


def test_the_state_of_a_naive_thread_says_its_key_was_never_sent(lab, receiver, capsys):
    """Lab 01 says naive sends no key, and state shows one: prepare's, computed, not sent."""
    assert run(capsys, lab, "start", "--thread", "n", "--mode", "naive")[0] == 0
    code, events, err = run(capsys, lab, "state", "--thread", "n")
    assert code == 0 and events[0]["values"]["key"] == "case-001:open-ticket:v1"
    assert err == "labs: --mode naive: the key is what prepare computed; create_ticket sends none\n"
    assert tickets(lab)[0]["key"] is None  # the receiver got none
    assert run(capsys, lab, "start", "--thread", "s")[0] == 0
    assert run(capsys, lab, "state", "--thread", "s")[2] == ""  # safe: the key was sent


def test_the_lines_after_a_naive_run_stopped_in_its_window_do_not_offer_resume(
    lab, receiver, capsys
):
    """Naive sends no key: typed as printed, a resume would repeat the request. A start typed
    again and a Ctrl-C line say so instead of naming resume; a safe thread's lines name it."""
    env = {**lab, "FAILPOINTS": "after-prepare=term"}
    assert run(capsys, env, "start", "--thread", "n", "--mode", "naive")[0] == 75
    code, _, err = run(capsys, lab, "start", "--thread", "n", "--mode", "naive")
    assert code == exitcodes.EXIT_THREAD and "a resume repeats its request" in err, err
    assert "resume it" not in err and "pick a new --thread" not in err
    args = lab_py.build_lab_parser().parse_args(["resume", "--thread", "n"])
    hint = hints.interrupted_hint(args, workflow.Settings.from_environ(lab))
    assert hint.endswith(
        "it sends no key, so resume would send it again: look at the receiver first, "
        f"python -m labs tickets ({DOCKER} tickets)"
    )
    assert run(capsys, env, "start", "--thread", "s")[0] == 75
    args = lab_py.build_lab_parser().parse_args(["resume", "--thread", "s"])
    hint = hints.interrupted_hint(args, workflow.Settings.from_environ(lab))
    assert hint.endswith(
        f"resume it with: python -m labs resume --thread s ({DOCKER} resume --thread s)"
    )
    again = f"resume it: python -m labs resume --thread s ({DOCKER} resume --thread s); or pick"
    assert again in run(capsys, lab, "start", "--thread", "s")[2]


def test_a_new_checkpoint_file_waits_for_another_command_making_it(tmp_path, monkeypatch):
    """Two commands on a new lab at once (`make chaos`'s two starts): one holds the new file's
    write lock while the other opens it. SqliteSaver's setup would answer "database is locked"
    at once (its `PRAGMA journal_mode=WAL` does not busy-wait); open_checkpointer waits it out.
    The other command's lock is let go in the opener's first wait, so nothing here is timed."""
    import sqlite3

    import ledger_tables

    path = tmp_path / "checkpoints.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the other command, mid-write on the new file
    waits = []

    def let_go(seconds):
        waits.append(seconds)
        if other.in_transaction:
            other.execute("COMMIT")

    monkeypatch.setattr(ledger_tables.time, "sleep", let_go)
    try:
        with checkpoints.open_checkpointer(str(path)) as saver:
            assert saver.get_tuple(checkpoints.thread_config("new")) is None
    finally:
        other.close()
    assert waits, "the opener never met the other command's lock"
