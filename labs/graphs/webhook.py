"""Lab 18's webhook handler as a graph, for the drill (lab 11): a re-run node is a redelivery.

take_event -> close. `take_event` applies one ticket event (a webhook's body) and, for a
resolved ticket, notifies the customer: a row in `notices`, one per call, as a message service
that takes no key writes one per request. A crash after the node did its work and before
LangGraph saved its result runs it again on resume, which to the handler is the same event
delivered a second time. Lab 18's endpoint (labs hooks) is an HTTP server, not a graph; this
is the same handling where the drill can kill it.

    python -m effectdrill labs.graphs.webhook:graph --observe labs.graphs.webhook:observe \
        --input '{"event_id": "{thread}", "ticket": "{thread}", "status": "resolved", "version": 1}'

Without "mode" (naive) every run of the node applies the event and notifies. With
"mode": "inbox" the event goes through labs/inbox.py's inbox (its id recorded in the same
transaction as the ticket's status, in WEBHOOK_DB) and the notice through the effect ledger keyed
by the event id (ledger.sqlite beside it): the re-run finds the event seen and the notice's receipt,
and notifies nobody again.

WEBHOOK_DB: default data/webhook/webhook.sqlite, under the folder you run from (made on use).
"""

import os
import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import effects
from labs import inbox

DEFAULT_DB = "data/webhook/webhook.sqlite"  # relative to the current folder: the learner's own


class Event(TypedDict, total=False):
    event_id: str
    ticket: str  # the drill names it after the thread, as the event: each run its own ticket
    status: str
    version: int
    mode: str  # "inbox": the fix; anything else (or none): naive
    applied: bool
    closed: bool


def take_event(state: Event):
    ticket, status, version = state["ticket"], state["status"], state["version"]
    if state.get("mode") != "inbox":  # naive: whatever came is the status, and it notifies
        if status == "resolved":
            notify_customer(state["event_id"])
        return {"applied": True}
    with inbox.open_inbox(webhook_db()) as box:
        seen = box.receive(state["event_id"], ticket, version, status)
    if seen.applied and status == "resolved":  # a re-run too: the ledger holds its receipt
        with effects.Ledger(webhook_db().with_name("ledger.sqlite")) as ledger:
            NOTICE.perform(
                ledger, f"{state['event_id']}:notify", {"event": state["event_id"]}, None
            )
    return {"applied": seen.applied}


def notify_customer(event_id):
    """The customer's notice: every call is one more row."""
    with connect() as db:
        cursor = db.execute("INSERT INTO notices (event_id) VALUES (?)", (event_id,))
        return {"notice_id": cursor.lastrowid}


# The notice, declared once for the ledger: no lookup, as lab 15's message service has none.
NOTICE = effects.Effect(
    "notice",
    send=lambda client, request, key: notify_customer(request["event"]),
    external_id=lambda answer: answer["notice_id"],
)


def close(state: Event):
    return {"closed": True}


def build():
    builder = StateGraph(Event)
    builder.add_node(take_event)
    builder.add_node(close)
    builder.add_edge(START, "take_event")
    builder.add_edge("take_event", "close")
    builder.add_edge("close", END)
    return builder.compile()


graph = build()


def observe(thread_id):
    """How many notices the event named `thread_id` caused."""
    with connect() as db:
        notices = db.execute("SELECT COUNT(*) FROM notices WHERE event_id = ?", (thread_id,))
        return {"notice": notices.fetchone()[0]}


# helpers


@contextmanager
def connect():
    """A connection to WEBHOOK_DB's notices, committed and closed after the block."""
    path = webhook_db()
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS notices (event_id TEXT)")
        yield db


def webhook_db():
    path = Path(os.environ.get("WEBHOOK_DB", DEFAULT_DB))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
