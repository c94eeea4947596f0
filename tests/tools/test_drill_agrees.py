"""The drill of any graph (effectdrill) and the lab's hand-made matrix (make drill) agree on every
cell both cover: the same graph, the same receiver, the same ticket counts.

Both kill the process for real. make drill names its points by what the node was doing
(--crash-at after-prepare, ...); effectdrill by the checkpointer call it dies before. On
labs/lab_graph.py's graph under sync durability they meet where the kill lands between the same
two saves."""

import pytest

from labs import modes as modes_lesson
from labs.graphs import ticket
from tools.drill import MATRIX

# make drill's row -> effectdrill's point on labs/lab_graph.py's graph: the first checkpointer
# call after the moment the row kills at.
SAME_MOMENT = {
    ("after-prepare", "sync"): "put_writes prepare [branch:to:create_ticket, key]",
    ("before-request", "sync"): "put step 1",  # prepare saved; create_ticket not yet sending
    ("after-ack", "sync"): "put_writes create_ticket [ticket_id]",
    ("after-checkpoint", "sync"): "put step 2",
    ("after-ack", "exit"): "put step 2",  # exit saves once, at the end
}


@pytest.mark.parametrize("mode", modes_lesson.MODES)
def test_effectdrill_and_make_drill_agree_on_the_lab_graph(mode, receiver, lab, monkeypatch):
    import effectdrill

    monkeypatch.setenv("API_URL", lab["API_URL"])
    run = {"operation_id": "{thread}", "title": "{thread}", "mode": mode}
    counts = {}
    for durability in ("sync", "exit"):
        report = effectdrill.drill(
            ticket.graph(), run, ticket.observe, durability, context=ticket.context()
        )
        counts |= {(r.durability, r.point): r.runs[0].counts["ticket"] for r in report.rows}
    for row in MATRIX:
        point = SAME_MOMENT.get((row.boundary, row.durability))
        if point is not None:
            expected = row.tickets[modes_lesson.MODES.index(mode)]
            assert counts[(row.durability, point)] == expected, (row.boundary, counts)
