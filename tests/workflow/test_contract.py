"""Lab 12: a thread saved by one graph, resumed by another.

First what LangGraph 1.2.24 itself does (a real SqliteSaver on a file, small graphs): a renamed
node, an inserted node and a renamed interrupted node. Then the lab's resume contract
(labs/contract.py): recorded in each checkpoint, a resume under another contract refused with
nothing changed, and `migrate` moving the thread explicitly. In-process (the drain is
workflow.py's own SIGTERM handler, as in lab 09), but for the key tests' kill in the window.
"""

import json
import sqlite3
from typing import NotRequired, TypedDict

import pytest

import checkpoints
import exitcodes
import workflow
from labs import cli as lab_py  # `lab` is the fixture: the lab's environment
from labs import contract as contract_lesson
from labs import lab_graph

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

# --- LangGraph alone -----------------------------------------------------------------------


class Steps(TypedDict):
    done: NotRequired[list]


def chain(saver, names, asks=(), stop_before=None):
    """START -> names... -> END; each node records its name; a node in `asks` interrupts first."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def node(name):
        def run(state):
            answer = interrupt(name) if name in asks else None
            return {"done": [*state.get("done", []), f"{name}:{answer}" if answer else name]}

        return run

    builder = StateGraph(Steps)
    for before, name in zip([START, *names], names, strict=False):
        builder.add_node(name, node(name))
        builder.add_edge(before, name)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=saver, interrupt_before=stop_before)


@pytest.fixture
def saver(tmp_path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(tmp_path / "checkpoints.sqlite", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


THREAD = {"configurable": {"thread_id": "t"}}


def stopped_before_charge(saver):
    """Version 1 of a graph, stopped with `charge` next (as a drained deploy leaves it)."""
    chain(saver, ["prepare", "charge", "email"], stop_before=["charge"]).invoke({}, THREAD)
    assert chain(saver, ["prepare", "charge", "email"]).get_state(THREAD).next == ("charge",)


def test_a_renamed_node_resumes_with_no_error_and_runs_nothing(saver):
    """LangGraph's docs (backward-compatibility page) say the run fails; 1.2.24 finishes it.
    channels_from_checkpoint (pregel/_checkpoint.py) restores only the new graph's channels, so
    `branch:to:charge` is dropped, and prepare_next_tasks (pregel/_algo.py) finds no node."""
    stopped_before_charge(saver)
    v2 = chain(saver, ["prepare", "bill", "email"])
    assert v2.invoke(None, THREAD) == {"done": ["prepare"]}  # no exception: charge never ran
    assert v2.get_state(THREAD).next == ()


def test_an_inserted_node_is_skipped(saver):
    """The saved `branch:to:charge` still triggers charge; prepare, which would route to the new
    node, has already run."""
    stopped_before_charge(saver)
    v2 = chain(saver, ["prepare", "fraud_check", "charge", "email"])
    assert v2.invoke(None, THREAD) == {"done": ["prepare", "charge", "email"]}


def test_a_renamed_interrupted_node_swallows_the_answer(saver):
    """Command(resume=...) becomes a pending RESUME write (map_command, pregel/_io.py) that no
    task of the new graph reads: nothing runs, and the approval is gone."""
    chain(saver, ["prepare", "approve", "email"], asks=["approve"]).invoke({}, THREAD)
    from langgraph.types import Command

    v2 = chain(saver, ["prepare", "approval", "email"], asks=["approval"])
    assert v2.invoke(Command(resume="yes"), THREAD) == {"done": ["prepare"]}
    assert v2.get_state(THREAD).next == ()  # under the new graph, nothing waits any more


def test_config_metadata_is_saved_in_every_checkpoint(saver):
    """get_checkpoint_metadata (langgraph/checkpoint/base) copies config["metadata"]'s strings
    into each checkpoint's metadata: what workflow.run_graph records its contract with."""
    graph = chain(saver, ["prepare", "charge"], stop_before=["charge"])
    graph.invoke({}, {**THREAD, "metadata": {"contract": "one"}})
    graph.invoke(None, {**THREAD, "metadata": {"contract": "two"}})
    contracts = [c.metadata.get("contract") for c in saver.list(THREAD)]
    assert contracts == ["two", "one", "one", "one"], contracts  # newest first: the resume's


# --- the contract --------------------------------------------------------------------------


def test_the_contract_names_the_version_and_the_shape(saver, monkeypatch):
    core = contract_lesson.contract(workflow.build_graph(saver))
    assert core == contract_lesson.contract(workflow.build_graph(saver))  # the same code, the same
    assert core.startswith("v1 graph:") and core.endswith(" keys:1")
    assert len(core) == len("v1 graph: keys:1") + 8
    assert contract_lesson.contract(workflow.build_graph(saver), keys="2") == core.replace(
        "keys:1", "keys:2"
    )  # a deploy that changes how the ticket's node derives its key
    assert (
        contract_lesson.contract(lab_graph.build_lab_graph(saver)) == core
    )  # the same nodes and edges
    assert contract_lesson.contract(lab_graph.build_lab_graph(saver, version="2"), "2") != core
    assert contract_lesson.contract(lab_graph.build_lab_graph(saver, "own-node")) != core
    monkeypatch.setattr(contract_lesson, "VERSION", "2")  # a deploy that bumps the code's version
    assert contract_lesson.contract(workflow.build_graph(saver)) == core.replace("v1 ", "v2 ")


def core_main(capsys, env, *argv):  # labs/cli.py's: the contract is the lab's (lab 12)
    code = lab_py.main(list(argv), env)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_resume_under_another_contract_refuses_changes_nothing_and_migrate_moves_it(
    lab, receiver, capsys, monkeypatch
):
    started = core_main(
        capsys, {**lab, "FAILPOINTS": "after-prepare=term"}, "start", "--thread", "t"
    )
    assert started[0] == exitcodes.EXIT_DRAINED and started[1][-1]["next"] == ["create_ticket"]
    old = contract_lesson.contract(workflow.build_graph(None))

    def head():
        with checkpoints.open_checkpointer(lab["CHECKPOINT_DB"]) as saver:
            return saver.get_tuple(checkpoints.thread_config("t"))

    before = head()
    assert before.metadata["contract"] == old
    v2 = {**lab, "LAB_GRAPH_VERSION": "2"}  # the deploy: a change saved threads must see
    new = contract_lesson.contract(lab_graph.build_lab_graph(None, version="2"), "2")
    code, events, err = core_main(capsys, v2, "resume", "--thread", "t")
    assert code == contract_lesson.EXIT_CONTRACT == 65
    assert events == [{"event": "contract_mismatch", "current": new, "saved": old, "thread": "t"}]
    assert err.count("\n") == 1 and old in err and new in err and "migrate --thread t" in err
    assert head().checkpoint["id"] == before.checkpoint["id"]  # nothing saved
    assert workflow.TicketClient(lab["API_URL"]).tickets() == []  # nothing sent

    code, events, _ = core_main(capsys, v2, "migrate", "--thread", "t")
    migrated = {"event": "migrated", "contract": new, "saved": old}
    assert code == 0 and events == [{**migrated, "next": ["open_ticket"], "was": ["create_ticket"]}]
    assert head().metadata["contract"] == new
    code, events, _ = core_main(capsys, v2, "resume", "--thread", "t")
    assert code == 0 and events[-1]["event"] == "done" and events[-1]["ticket_id"] == 1
    assert len(workflow.TicketClient(lab["API_URL"]).tickets()) == 1


def test_a_thread_saved_before_contracts_named_keys_resumes_under_keys_1(lab, receiver, capsys):
    """A checkpoint saved before the contract named the key derivation ("v1 graph:..." with no
    " keys:N") was made under keys:1: the same code resumes it, and migrate has nothing to move."""
    env = {**lab, "FAILPOINTS": "after-prepare=term"}
    assert core_main(capsys, env, "start", "--thread", "t")[0] == exitcodes.EXIT_DRAINED
    with sqlite3.connect(lab["CHECKPOINT_DB"]) as db:  # as the code before keys: saved it
        db.execute("UPDATE checkpoints SET metadata = replace(metadata, ' keys:1', '')")
    with checkpoints.open_checkpointer(lab["CHECKPOINT_DB"]) as saver:
        old = saver.get_tuple(checkpoints.thread_config("t")).metadata["contract"]
    assert old.startswith("v1 graph:") and " keys:" not in old
    code, events, _ = core_main(capsys, lab, "migrate", "--thread", "t")
    assert code == 0 and [e["event"] for e in events] == ["unchanged"], events
    code, events, err = core_main(capsys, lab, "resume", "--thread", "t")
    assert code == 0 and events[-1]["event"] == "done", err
    assert len(workflow.TicketClient(lab["API_URL"]).tickets()) == 1


def test_migrate_of_an_unknown_thread_is_one_line_and_exit_4(lab, capsys):
    code, events, err = core_main(capsys, lab, "migrate", "--thread", "nobody")
    assert (code, events) == (exitcodes.EXIT_THREAD, []) and err.count("\n") == 1


def test_a_bad_graph_version_is_one_line_and_exit_2(lab, capsys):
    assert lab_main(capsys, {**lab, "LAB_GRAPH_VERSION": "3"}, "state") == exitcodes.EXIT_USAGE


def lab_main(capsys, env, *argv, name="LAB_GRAPH_VERSION"):
    code = lab_py.main(list(argv), env)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}=" in err
    return code


def test_migrate_names_a_node_the_new_graph_does_not_have_and_changes_nothing(
    lab, capsys, monkeypatch
):
    """A saved next with no counterpart (here: renamed, and RENAMES forgot it) is refused."""
    env = {**lab, "FAILPOINTS": "after-prepare=term"}
    assert lab_py.main(["start", "--thread", "t"], env) == exitcodes.EXIT_DRAINED
    monkeypatch.setitem(contract_lesson.RENAMES, "2", {})
    capsys.readouterr()
    code = lab_py.main(["migrate", "--thread", "t"], {**lab, "LAB_GRAPH_VERSION": "2"})
    out, err = capsys.readouterr()
    assert code == contract_lesson.EXIT_CONTRACT and out == "" and "create_ticket" in err
    assert lab_py.main(["state", "--thread", "t"], lab) == 0
    assert json.loads(capsys.readouterr().out)["next"] == ["create_ticket"]


def test_approve_under_another_contract_refuses_instead_of_swallowing(lab, receiver, capsys):
    """In-node approval (lab 07), then version 2 renames the waiting node: the contract refuses
    the answer; migrate carries the question over to the renamed node, and the answer runs it
    from its first line (lab 07's trap, through the ledger: the ticket's and the ask's receipts,
    nothing sent again)."""
    assert lab_py.main(["start", "--thread", "a", "--approval"], lab) == 0
    v2 = {**lab, "LAB_GRAPH_VERSION": "2"}
    assert lab_py.main(["approve", "--thread", "a"], v2) == contract_lesson.EXIT_CONTRACT
    assert lab_py.main(["migrate", "--thread", "a"], v2) == 0
    capsys.readouterr()
    assert lab_py.main(["approve", "--thread", "a"], v2) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    key = "case-001:open-ticket:v1"
    assert events[:3] == [
        {"event": "effect_receipt", "key": key, "ticket_id": 1},
        {
            "event": "approval_requested",
            "how": "receipt",
            "key": f"{key}:approval",
            "request_id": 2,
        },
        {"event": "approval", "approved": True},
    ]
    assert events[-1]["event"] == "done" and events[-1]["approved"] is True
    assert len(workflow.TicketClient(lab["API_URL"]).tickets()) == 2  # the ticket, the ask


def test_a_resumed_thread_sends_the_key_it_saved_whatever_prepare_derives_now(
    lab, receiver, capsys, monkeypatch
):
    """Lab 12's reason prepare's derivation is not in the contract: the key is prepare's output,
    in the checkpoint. Killed in the window (a real SIGKILL), then a deploy whose prepare derives
    keys another way (same graph, same contract): the resume sends the saved key, one ticket."""
    from tools.local import run_workflow

    start = ["start", "--thread", "k", "--operation", "op-k", "--mode", "safe", "--crash"]
    crashed = run_workflow(start, lab)  # safe: the key alone, so the resume sends it
    assert crashed.returncode == -9, crashed.stderr
    monkeypatch.setattr(workflow, "prepare", lambda state: {"key": "derived:another:way"})
    assert lab_py.main(["resume", "--thread", "k"], lab) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[0] == {"event": "effect_ack", "created": False, "ticket_id": 1}
    assert [t["key"] for t in workflow.TicketClient(lab["API_URL"]).tickets()] == ["op-k"]


def test_a_key_derived_in_the_node_by_another_version_is_a_second_ticket_without_the_contract(
    lab, receiver, capsys
):
    """Lab 12's key derivation: killed in the window under version 1 (a real SIGKILL), resumed
    by LAB_KEY_VERSION=2 with --no-contract, the node sends KEY:ticket, which neither the
    receiver nor the ledger has seen: a second ticket. A thread started under version 2 sends
    version 2's key. (The contract's refusal and migrate's kept keys: lab 12's guide.)"""
    from tools.local import run_workflow_here

    start = ["start", "--thread", "k", "--operation", "op-k", "--crash"]
    crashed = run_workflow_here(start, lab)  # through the ledger, its receipt kept
    assert crashed.returncode == -9, crashed.stderr
    v2 = {**lab, "LAB_KEY_VERSION": "2"}
    assert lab_py.main(["resume", "--thread", "k", "--no-contract"], v2) == 0
    assert lab_py.main(["start", "--thread", "n", "--operation", "op-n"], v2) == 0
    tickets = workflow.TicketClient(lab["API_URL"]).tickets()
    assert [t["key"] for t in tickets] == ["op-k", "op-k:ticket", "op-n:ticket"]
    bad = lab_main(capsys, {**lab, "LAB_KEY_VERSION": "3"}, "state", name="LAB_KEY_VERSION")
    assert bad == exitcodes.EXIT_USAGE
