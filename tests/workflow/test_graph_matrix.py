"""The crash matrix in-process, in LangGraph's own test style: the graph built here, a counting
fake receiver, a failpoint that raises inside a node, then a resume. Every sync row that an
in-process exception can show, in every mode, in well under a second.

What only a real kill shows stays in the process tier (tests/tools/test_drill.py): the step boundary
(an exception from a saver's put_writes surfaces only when the run ends) and SIGTERM's drain.
The expected ticket counts come from the drill's one matrix (tools/drill.py)."""

import threading

import pytest

import checkpoints
import effects
import exitcodes
import failpoints
import workflow
from labs import lab_graph
from labs import modes as modes_lesson
from tools.drill import MATRIX
from tools.local import wait_until

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

IN_PROCESS = ("after-prepare", "before-request", "lost-ack", "after-ack", "after-checkpoint")
HANG_GUARD_S = 60  # a wait that only a hang reaches: not a bound on how fast anything is
ROWS = [r for r in MATRIX if r.durability == "sync" and r.boundary in IN_PROCESS]


class FakeReceiver:
    """The receiver's contract in memory: one ticket per key, a repeat answered with it.
    lose_first: commit the first POST, then lose its answer (lab 06's fault)."""

    def __init__(self, lose_first=False):
        self.tickets_made, self.lose_first = [], lose_first

    def create(self, title, key=None):
        for ticket in self.tickets_made:
            if key is not None and ticket["key"] == key:
                return {"ticket_id": ticket["ticket_id"], "created": False}
        ticket_id = len(self.tickets_made) + 1
        self.tickets_made.append({"ticket_id": ticket_id, "key": key, "payload": {"title": title}})
        if self.lose_first:
            self.lose_first = False
            raise exitcodes.NoAnswer("connection closed", exitcodes.EXIT_NO_ANSWER)
        return {"ticket_id": ticket_id, "created": True}

    def tickets(self, key=None):
        return [t for t in self.tickets_made if key is None or t["key"] == key]


def run_cell(boundary, mode, saver, ledger):
    receiver = FakeReceiver(lose_first=boundary == "lost-ack")
    graph = lab_graph.build_lab_graph(saver)
    first = {"operation_id": f"op-{boundary}-{mode}", "title": "t", "mode": mode}
    thread = f"{boundary}:{mode}"
    point = {} if boundary == "lost-ack" else {boundary: "raise"}
    try:
        with failpoints.scoped(point):
            workflow.run_graph(graph, first, thread, receiver, ledger)
    except (failpoints.FailpointError, exitcodes.NoAnswer):
        pass
    snapshot = graph.get_state(checkpoints.thread_config(thread))
    if snapshot.next:  # the run stopped in a node: resume it, as `resume` does
        workflow.run_graph(graph, None, thread, receiver, ledger)
    return receiver.tickets_made, graph.get_state(checkpoints.thread_config(thread))


@pytest.mark.parametrize("row", ROWS, ids=[r.boundary for r in ROWS])
def test_every_mode_at_every_in_process_boundary(row, capsys, tmp_path):
    from langgraph.checkpoint.memory import InMemorySaver

    for mode in modes_lesson.MODES:
        with effects.open_ledger(tmp_path / f"{mode}.sqlite") as ledger:
            made, final = run_cell(row.boundary, mode, InMemorySaver(), ledger)
        expected = row.tickets[modes_lesson.MODES.index(mode)]
        assert len(made) == expected, (row.boundary, mode, made)
        assert final.next == () and final.values["ticket_id"] == made[-1]["ticket_id"]


def test_the_failpoint_raises_only_inside_its_block():
    with failpoints.scoped({"after-ack": "raise"}):
        with pytest.raises(failpoints.FailpointError):
            failpoints.fail("after-ack")
    assert failpoints.fail("after-ack") is None


def test_a_pause_holds_every_caller_until_its_go_and_lets_later_callers_pass(tmp_path):
    """pause(PATH): the first caller creates PATH (the test's event: the point is reached), and
    no caller goes on before unpause(PATH); after it, one that arrives passes without waiting."""
    path = tmp_path / "after-ack.pause"
    failpoints.configure(f"after-ack=pause({path})", known=workflow.POINTS)
    went_on = []

    def caller():
        failpoints.fail("after-ack")
        went_on.append(path.read_text())  # what the file said when this caller went on

    try:
        held = [threading.Thread(target=caller, daemon=True) for _ in range(2)]
        for thread in held:
            thread.start()
        wait_until(path.exists, HANG_GUARD_S, "the point reached (its file)")
        assert went_on == []  # nobody went on: the file exists while they wait
        failpoints.unpause(path)
        late = threading.Thread(target=caller, daemon=True)
        late.start()
        for thread in [*held, late]:
            thread.join(HANG_GUARD_S)  # a hang guard: each goes on once the file says go
        assert went_on == [failpoints.GO] * 3, went_on
    finally:
        failpoints.reset()


def test_an_unknown_failpoint_or_action_is_one_line_exit_2(capsys):
    for spec, words in [
        ("after-ak=kill", ["unknown point 'after-ak'", "after-ack"]),
        ("after-ack=explode", ["unknown action 'explode'", "sleep(S)", "pause(PATH)"]),
        ("after-ack=pause()", ["unknown action 'pause()'", "pause(PATH)"]),
    ]:
        assert workflow.main(["tickets"], {"FAILPOINTS": spec}) == exitcodes.EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(w in err for w in words), err
