"""Lab 19's outbox for the drill: labs/cli.py's request_ticket, the receiver as the outside world.

    python -m effectdrill labs.graphs.outbox:graph --context labs.graphs.outbox:context \
        --input '{"operation_id": "{thread}", "title": "{thread}", "delivery": "outbox"}' \
        --observe labs.graphs.outbox:observe

With "delivery": "outbox" the node writes the ticket it wants into the outbox of the SQLite file
OUTBOX_DB (default data/outbox/outbox.sqlite, under the folder you run from) and sends nothing;
observe(thread) first delivers what is pending there, as `python -m labs.relay --once` does
(relay.relay_once), then counts the receiver's tickets whose title is the thread id. With
"delivery": "direct" (the naive variant) the node sends the ticket itself, without a key, and
the drill finds the duplicate where it kills the run after the receiver's answer and before the
node's result is saved.
"""

import contextlib
import io
import os
from pathlib import Path

import effects
import workflow
from labs import outbox as outbox_lesson
from labs import relay

DEFAULT_DB = "data/outbox/outbox.sqlite"  # relative to the current folder: the learner's own


def graph():
    """labs/cli.py's outbox graph, without a checkpointer: the drill gives it its own."""
    return outbox_lesson.build_outbox(None)


def context():
    """The receiver's client, and the ledger of OUTBOX_DB, whose database holds the outbox: the
    drill's crash runs are forked from one process, and each opens its own connection to it."""
    return workflow.Context(client(), effects.Ledger(db_path()))


def observe(thread):
    with contextlib.redirect_stdout(io.StringIO()):  # the relay's lines are not the drill's
        with relay.open_outbox(db_path()) as outbox:
            relay.relay_once(outbox, client())
        tickets = client().tickets()
    return {"ticket": sum(t["payload"]["title"] == thread for t in tickets)}


# helpers


def client():
    return workflow.Settings.from_environ(os.environ).client()


def db_path():
    path = Path(os.environ.get("OUTBOX_DB", DEFAULT_DB))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
