"""Lab 13's saga for the drill: labs/cli.py's charge, reserve, refund, the receiver as the world.

    python -m effectdrill labs.graphs.saga:graph --context labs.graphs.saga:context \
        --input '{"operation_id": "{thread}", "title": "{thread}", "seats": 11, "mode": "naive"}' \
        --observe labs.graphs.saga:observe

11 seats are more than the receiver has (labs/receiver.py's SEATS, 10), so every run's reservation
is
refused and its charge refunded. observe(thread) counts the charges (tickets whose title is the
thread id) and the refunds of those tickets. The charge and the reservation go through the
ledger of context() (labs.graphs.ticket's: a temporary file of the drill's own) in both modes.
With "mode": "naive" in the input the refund goes without a key and without the ledger, and the
run refunds twice where the drill kills it after the refund's answer and before its result is
saved; with "safe" the refund goes through the ledger too, and it refunds once everywhere.
"""

import contextlib
import io
import os

import workflow
from labs import saga as saga_lesson
from labs.graphs.ticket import context  # noqa: F401 (the drill's --context)


def graph():
    """labs/cli.py's saga, without a checkpointer: the drill gives it its own."""
    return saga_lesson.build_saga(None)


def observe(thread):
    client = workflow.Settings.from_environ(os.environ).client()
    with contextlib.redirect_stdout(io.StringIO()):  # the client prints nothing; be sure
        charges = {t["ticket_id"] for t in client.tickets() if t["payload"]["title"] == thread}
        refunds = client.call("/refunds")["refunds"]
    return {"charge": len(charges), "refund": sum(r["ticket_id"] in charges for r in refunds)}
