"""`python -m effectdrill replay`: the lab's real checkpoint database, left by labs/cli.py runs that
were killed (--crash, a real SIGKILL) or drained (--term-at), resumed on a copy under lab 12's
version 2 (create_ticket renamed open_ticket) and under version 1, against a real receiver.
"""

import hashlib
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

import checkpoints
import workflow
from effectdrill import replay
from effectdrill.__main__ import main
from labs import contract as contract_lesson
from labs import lab_graph
from labs.graphs import ticket
from tools.local import ReceiverProcess, free_port, lab_env, run_command, run_workflow_here

EFFECT_V1 = contract_lesson.EFFECT_NODE[
    "1"
]  # the node version 1 saved as next; version 2 renamed it
THREADS = {  # thread -> labs/cli.py start's switches; its title is the thread (ticket.observe)
    "safe-crash": ["--mode", "safe", "--crash"],  # killed after the ticket's answer
    "naive-crash": ["--mode", "naive", "--crash"],
    "drained": ["--term-at", "after-prepare"],  # stopped before create_ticket sent anything
    "finished": [],
}
EXITS = {"safe-crash": -9, "naive-crash": -9, "drained": 75, "finished": 0}  # -9: SIGKILL
SENT_BEFORE = {"safe-crash": 1, "naive-crash": 1, "drained": 0}  # tickets before the replay


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One receiver and one checkpoint file for the module: every replay works on a copy."""
    env = lab_env(tmp_path_factory.mktemp("replay") / "data", free_port())
    server = ReceiverProcess(env).start()
    yield env
    server.stop()


@pytest.fixture(scope="module")
def saved(lab):
    """The lab's checkpoint file with THREADS in it, as labs/cli.py left them."""
    for thread, switches in THREADS.items():
        args = ["start", "--thread", thread, "--operation", f"op-{thread}", "--title", thread]
        done = run_workflow_here([*args, *switches], lab)  # a process where it kills itself
        assert done.returncode == EXITS[thread], done.stderr
    return Path(lab["CHECKPOINT_DB"])


@pytest.fixture(autouse=True)
def api_url(lab, monkeypatch):
    monkeypatch.setenv("API_URL", lab["API_URL"])  # for ticket.context() and ticket.observe()


def test_under_version_2_every_unfinished_thread_is_lost_and_the_original_is_untouched(
    saved, lab, tmp_path
):
    assert EFFECT_V1 not in ticket.graph_v2().nodes  # the rename lab 12 deploys
    before, tickets = files_of(saved), receiver_tickets()
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = os.environ | {"API_URL": lab["API_URL"], "TMPDIR": str(temp)}
    env["CHECKPOINT_DB"] = str(saved)  # the default database, as labs/cli.py reads it

    done = run_command(
        [sys.executable, "-m", "effectdrill", "replay", "labs.graphs.ticket:graph_v2"]
        + ["--context", "labs.graphs.ticket:context", "--observe", "http"],
        env=env,
    )

    assert done.returncode == 1, done.stderr
    header, *rows, blank, summary = done.stdout.splitlines()
    assert header.split()[:5] == ["thread", "saved", "next", "next", "now"]
    unfinished = [t for t in THREADS if THREADS[t]]
    assert sorted(row.split()[0] for row in rows) == sorted(unfinished)
    lost = f"LOST: no node {EFFECT_V1} in this graph: its work never runs"
    assert all(row.endswith(lost) and f"  {EFFECT_V1}  " in row for row in rows)
    assert (blank, summary) == ("", f"summary: {len(unfinished)} unfinished threads, 3 LOST")
    assert receiver_tickets() == tickets  # nothing ran, nothing was sent
    assert files_of(saved) == before  # the original, -wal and all, byte for byte
    assert list(temp.iterdir()) == []  # the copy is gone


def test_under_version_1_each_thread_resumes_once_and_the_unkeyed_one_repeats(saved):
    """The only test here whose replay sends requests: the counts before are labs/cli.py's."""
    before = files_of(saved)
    outcomes = replay.replay(ticket.graph, saved, observe=ticket.observe, context=ticket.context())

    found = {o.thread: o for o in outcomes}
    assert sorted(found) == sorted(SENT_BEFORE)  # the finished thread is not resumed
    for thread, outcome in found.items():
        assert outcome.saved == outcome.next_now == outcome.ran == [EFFECT_V1]
        (request,) = outcome.requests  # the node's one POST /tickets
        key = None if "naive" in THREADS[thread] else f"op-{thread}"  # workflow.prepare's key
        assert (request.endpoint, request.key) == ("POST /tickets", key)
        assert outcome.before == {"ticket": SENT_BEFORE[thread]}
    assert found["naive-crash"].after == {"ticket": 2}  # the crash window, without a key
    assert found["naive-crash"].verdict == replay.REPEATED
    assert found["safe-crash"].after == {"ticket": 1} and found["safe-crash"].verdict == "ok"
    assert found["drained"].after == {"ticket": 1} and found["drained"].verdict == "ok"

    # Replayed again with the requests as the effects: the copy is fresh, the resend unkeyed.
    again = {
        o.thread: o
        for o in replay.replay(ticket.graph, saved, observe="http", context=ticket.context())
    }
    assert again["naive-crash"].verdict == replay.RESENT
    assert again["safe-crash"].verdict == again["drained"].verdict == "ok"
    assert files_of(saved) == before  # resumed twice, on copies


def test_commits_only_in_the_write_ahead_log_are_replayed(tmp_path):
    """A live writer's last commits are in the -wal file only: the copy must take it along."""
    database = tmp_path / "checkpoints.sqlite"
    writer = sqlite3.connect(database, check_same_thread=False)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        graph = lab_graph.build_lab_graph(SqliteSaver(writer))
        start = {"operation_id": "op-wal", "title": "in the log", "mode": "safe"}
        config = checkpoints.thread_config("in-the-log")
        graph.invoke(start, config, interrupt_before=[EFFECT_V1])  # saved, create_ticket next
        alone = tmp_path / "without-its-log.sqlite"
        shutil.copyfile(database, alone)
        assert threads_in(alone) == []  # nothing of it in the main file yet
        before = files_of(database)

        outcomes = replay.replay(ticket.graph_v2, database)

        assert [(o.thread, o.saved, o.verdict) for o in outcomes] == [
            ("in-the-log", [EFFECT_V1], replay.LOST)
        ]
        assert files_of(database) == before
    finally:
        writer.close()


V2 = "labs.graphs.ticket:graph_v2"
BAD = {
    "postgres": ([V2, "--checkpoint-db", "postgresql://u:p@127.0.0.1:1/x"], "a postgresql:// "),
    "no file": ([V2, "--checkpoint-db", "{tmp}/none.sqlite"], "no checkpoint database at {tmp}/"),
    "no database named": ([V2], "name the checkpoint database: --checkpoint-db PATH"),
    "not sqlite": ([V2, "--checkpoint-db", "{tmp}/notes.txt"], "cannot read the SQLite database"),
    "unknown thread": (
        [V2, "--checkpoint-db", "{tmp}/empty.sqlite", "--thread", "nope"],
        "no thread nope in the checkpoint database",
    ),
    "bad graph": (["nosuch:graph", "--checkpoint-db", "{tmp}/empty.sqlite"], "cannot import"),
    "bad option": ([V2, "--durability", "sync"], "unrecognized arguments: --durability"),
}


@pytest.mark.fast
@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CHECKPOINT_DB", raising=False)
    (tmp_path / "notes.txt").write_text("not a database, " * 100)
    with SqliteSaver.from_conn_string(str(tmp_path / "empty.sqlite")) as empty:
        empty.setup()
    argv, message = BAD[case]

    code = main(["replay", *(arg.replace("{tmp}", str(tmp_path)) for arg in argv)])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("effectdrill: "), err
    assert message.replace("{tmp}", str(tmp_path)) in err


# helpers


def files_of(database):
    """The database's files (its -wal and -shm too), each with the SHA-256 of its bytes."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in Path(database).parent.iterdir()
        if p.name.startswith(Path(database).name)
    }


def receiver_tickets():
    return workflow.TicketClient(os.environ["API_URL"]).tickets()


def threads_in(path):
    with sqlite3.connect(path) as db:
        try:
            return [r[0] for r in db.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        except sqlite3.OperationalError:  # no table yet: the log holds that too
            return []
