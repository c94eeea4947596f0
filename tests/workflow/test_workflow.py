"""workflow.py as a learner and an engineer meet it: the graph, the CLI contract, its errors."""

import subprocess
import sys

import pytest

from tools.local import ROOT, events, free_port, lab_env


def test_build_graph_is_prepare_then_create_ticket(tmp_path):
    from langgraph.checkpoint.memory import InMemorySaver

    import workflow

    graph = workflow.build_graph(InMemorySaver())
    edges = {(e.source, e.target) for e in graph.get_graph().edges}
    assert edges == {
        ("__start__", "prepare"),
        ("prepare", "create_ticket"),
        ("create_ticket", "__end__"),
    }


@pytest.mark.parametrize(
    "module",
    ["workflow", "api", "labs.cli", "labs.workers", "failpoints", "effects", "commandline"],
)
def test_importing_a_module_has_no_side_effects(module, tmp_path):
    """No files, no output, no server, and (for workflow) no langgraph until a graph is built."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}; "
        "print(sorted(m for m in sys.modules if m.startswith('langgraph')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]" and done.stderr == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["tickets"], ["post", "--operation", "k-1"]])
def test_http_only_commands_do_not_import_langgraph(args, receiver, lab):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "workflow.py"), *args],
        env=lab,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert imported and not [m for m in imported if m.startswith("langgraph")]


def test_start_runs_both_nodes_and_state_shows_the_finished_run(receiver, workflow):
    done = workflow("start", "--thread", "t1", "--operation", "op-1", "--mode", "safe")
    assert done.returncode == 0, done.stderr
    assert [e["event"] for e in events(done.stdout)] == ["prepare", "effect_ack", "done"]
    state = events(workflow("state", "--thread", "t1").stdout)[0]
    assert state["next"] == [] and state["values"]["ticket_id"] == 1
    assert state["values"]["key"] == "op-1"


def test_naive_mode_sends_no_key_and_safe_mode_sends_the_operation(receiver, workflow):
    workflow("start", "--thread", "n", "--operation", "op-n", "--mode", "naive")
    workflow("start", "--thread", "s", "--operation", "op-s", "--mode", "safe")
    tickets = events(workflow("tickets").stdout)[0]["tickets"]
    assert [t["key"] for t in tickets] == [None, "op-s"]
    only = events(workflow("tickets", "--operation", "op-s").stdout)[0]["tickets"]
    assert [t["ticket_id"] for t in only] == [2]


def test_crash_is_a_real_sigkill_after_the_ack(receiver, workflow):
    done = workflow("start", "--thread", "c", "--operation", "op-c", "--crash")
    assert done.returncode == -9  # a shell shows 137
    assert events(done.stdout)[-1] == {"event": "crash", "at": "after-ack"}
    assert events(workflow("tickets").stdout)[0]["tickets"][0]["ticket_id"] == 1


def one_line_error(done, exit_code, text):
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert text in done.stderr


@pytest.mark.parametrize(
    "args, text",
    [
        (["start", "--mode", "careful"], "invalid choice: 'careful'"),
        (["tickets", "--mode", "safe"], "unrecognized arguments: --mode safe"),
        (["state", "--crash"], "unrecognized arguments: --crash"),
        (["resume", "--title", "x"], "unrecognized arguments: --title x"),
        (["launch"], "invalid choice: 'launch'"),
        ([], "the following arguments are required"),
    ],
)
def test_argument_mistakes_exit_2_with_one_line(args, text, lab):
    from tools.local import run_workflow

    one_line_error(run_workflow(args, lab), 2, text)


@pytest.mark.parametrize("args", [["tickets"], ["post"], ["start", "--thread", "x"]])
def test_receiver_unreachable_exits_3_with_one_line(args, tmp_path):
    from tools.local import run_workflow

    env = lab_env(tmp_path / "data", free_port())  # nothing listens on this port
    done = run_workflow(args, env)
    if args[0] == "start":  # prepare ran and printed before the node found no receiver
        assert events(done.stdout)[0]["event"] == "prepare"
        done.stdout = ""
        assert done.stderr.rstrip().endswith(
            "; the run is saved: once the receiver answers, python -m labs resume --thread x "
            "(Docker: docker compose -p stateful-lab run --rm workflow resume --thread x)"
        ), done.stderr  # typed again, start would say the thread exists
        assert run_workflow(["start", "--thread", "x"], env).returncode == 4
    one_line_error(done, 3, "cannot reach the receiver")


def test_thread_mistakes_exit_4_with_one_line(receiver, workflow):
    one_line_error(workflow("resume", "--thread", "ghost"), 4, "no thread 'ghost' to resume")
    one_line_error(workflow("state", "--thread", "ghost"), 4, "no thread 'ghost'")
    assert workflow("start", "--thread", "t").returncode == 0
    one_line_error(workflow("start", "--thread", "t"), 4, "thread 't' already exists")


def test_receiver_refusal_is_http_error_exit_1(receiver, workflow):
    assert workflow("post", "--operation", "k", "--title", "one").returncode == 0
    done = workflow("post", "--operation", "k", "--title", "two")
    assert done.returncode == 1
    (event,) = events(done.stdout)
    assert event["event"] == "http_error" and event["status"] == 409
    assert "different body" in event["body"]["error"]


@pytest.mark.fast
def test_each_event_line_is_one_write(monkeypatch):
    """Unbuffered (PYTHONUNBUFFERED, as the lab runs), print() writes a line's text and its
    newline apart; the drill's crash child and the resume before it share one stderr pipe, and
    lab 11 showed two events spliced on one line. emit() hands the whole line to one write."""
    import exitcodes

    class Writes:
        def __init__(self):
            self.calls = []

        def write(self, text):
            self.calls.append(text)

        def flush(self):
            pass

    writes = Writes()
    monkeypatch.setattr(sys, "stdout", writes)
    exitcodes.emit("prepare", operation="op")
    exitcodes.emit("effect_ack", created=True, ticket_id=1)
    assert writes.calls == [
        '{"event": "prepare", "operation": "op"}\n',
        '{"created": true, "event": "effect_ack", "ticket_id": 1}\n',
    ]
