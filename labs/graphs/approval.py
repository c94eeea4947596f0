"""An approval graph like lab 07's, for the drill (lab 11): the effect comes before interrupt().

request_refund -> notify. `request_refund` INSERTs a refund request (no key), then waits for a
human with interrupt(); LangGraph resumes an interrupted node by running it again from its
first line, so the request is sent again on every resume, even in a run that never crashed.
The drill reports it as repeated in the clean run.

    python -m effectdrill labs.graphs.approval:graph --input '{"refund": "{thread}"}' \
        --observe labs.graphs.approval:observe --resume-with true

With "mode": "ledger" in the input the request goes through the effect ledger (effects.py,
REQUEST below, in ledger.sqlite beside APPROVAL_DB), keyed by the refund: the re-run of the node
finds its receipt and inserts nothing, however often it is resumed.

The rows go to the SQLite file APPROVAL_DB (default data/approval/approval.sqlite, under the
folder you run from; the folder is made on the first write).
"""

import os
import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import effects

DEFAULT_DB = "data/approval/approval.sqlite"  # relative to the current folder: the learner's own


class Refund(TypedDict, total=False):
    refund: str
    mode: str  # "ledger": the request through the ledger; anything else (or none): without
    approved: bool
    notified: bool


def request_refund(state: Refund):
    if state.get("mode") == "ledger":  # the refund names the operation: the ledger's key
        path = Path(os.environ.get("APPROVAL_DB", DEFAULT_DB)).with_name("ledger.sqlite")
        path.parent.mkdir(parents=True, exist_ok=True)
        with effects.Ledger(path) as ledger:
            REQUEST.perform(ledger, state["refund"], {"refund": state["refund"]}, client=None)
    else:
        ask(state["refund"])  # the effect, before the wait: it runs again when the node resumes
    approved = interrupt({"question": "approve the refund?", "refund": state["refund"]})
    return {"approved": bool(approved)}


def ask(refund):
    """The refund request: every call is one more row."""
    with connect() as db:
        cursor = db.execute("INSERT INTO requests (refund_id) VALUES (?)", (refund,))
        return {"request_id": cursor.lastrowid}


def asked(refund):
    """The request made for refund, or None: what the ledger's lookup asks."""
    with connect() as db:
        row = db.execute("SELECT rowid FROM requests WHERE refund_id = ?", (refund,)).fetchone()
    return None if row is None else {"request_id": row[0]}


# The request, declared once for the ledger: keyed by the refund, looked up by it.
REQUEST = effects.Effect(
    "refund_request",
    send=lambda client, request, key: ask(request["refund"]),
    lookup=lambda client, key: asked(key),
    external_id=lambda answer: answer["request_id"],
)


def notify(state: Refund):
    with connect() as db:  # keyed on the refund: a second call changes nothing
        db.execute("INSERT OR IGNORE INTO notices (refund_id) VALUES (?)", (state["refund"],))
    return {"notified": True}


def build():
    builder = StateGraph(Refund)
    builder.add_node(request_refund)
    builder.add_node(notify)
    builder.add_edge(START, "request_refund")
    builder.add_edge("request_refund", "notify")
    builder.add_edge("notify", END)
    return builder.compile()


graph = build()


def observe(thread_id):
    """How many refund requests and notices the refund named `thread_id` got."""
    with connect() as db:
        requests = db.execute("SELECT COUNT(*) FROM requests WHERE refund_id = ?", (thread_id,))
        notices = db.execute("SELECT COUNT(*) FROM notices WHERE refund_id = ?", (thread_id,))
        return {"request": requests.fetchone()[0], "notice": notices.fetchone()[0]}


# helpers


@contextmanager
def connect():
    """A connection to APPROVAL_DB, committed and closed after the block; tables made on use."""
    path = Path(os.environ.get("APPROVAL_DB", DEFAULT_DB))
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS requests (refund_id TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS notices (refund_id TEXT PRIMARY KEY)")
        yield db
