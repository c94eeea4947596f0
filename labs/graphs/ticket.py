"""The lab's own graph for the drill (lab 11): labs/lab_graph.py's graph, the receiver as the
outside world.

    python -m effectdrill labs.graphs.ticket:graph \
        --input '{"operation_id": "{thread}", "title": "{thread}", "mode": "naive"}' \
        --context labs.graphs.ticket:context --observe labs.graphs.ticket:observe

The nodes take the receiver's client from the run's context (workflow.Context); context() makes
it from API_URL, as workflow.py does. observe(thread) counts the receiver's tickets whose title
is the thread id: the drill puts each crash run's thread id into the input, so each run's
tickets are its own, whether the run sent a key (safe) or none (naive).

graph_v2 is lab 12's deployed version 2, for `python -m effectdrill replay` (lab 11).
"""

import contextlib
import io
import os
import tempfile
from pathlib import Path

import effects
import workflow
from labs import lab_graph


def graph():
    """labs/lab_graph.py's graph, without a checkpointer: the drill gives it its own."""
    return lab_graph.build_lab_graph(None)


def graph_v2():
    """Version 2 of it (lab 12's deploy, LAB_GRAPH_VERSION=2): create_ticket is open_ticket."""
    return lab_graph.build_lab_graph(None, version="2")


def context():
    """The receiver's client, and a ledger of the drill's own (a new temporary file): the drill's
    crash runs are forked from one process, and each opens its own connection to it."""
    return drill_context(effects.Ledger)


def drill_context(make_ledger):
    """A drill's --context: the receiver's client (API_URL), and make_ledger(path) on a new file
    in a temporary folder, removed once the drill lets go of the context (at exit at the latest)."""
    folder = tempfile.TemporaryDirectory(prefix="drill-ledger-")
    ledger = make_ledger(Path(folder.name) / "ledger.sqlite")
    ledger.folder = folder  # the folder lives as long as the ledger
    return workflow.Context(workflow.Settings.from_environ(os.environ).client(), ledger)


def observe(thread):
    with contextlib.redirect_stdout(io.StringIO()):  # the client prints nothing; be sure
        tickets = workflow.Settings.from_environ(os.environ).client().tickets()
    return {"ticket": sum(t["payload"]["title"] == thread for t in tickets)}
