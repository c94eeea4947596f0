"""An order pipeline: four effects in three nodes, two keyed (INSERT OR IGNORE) and two not.

validate -> pay -> ship. `pay` charges (no key) and writes a keyed ledger row; `ship` books a
keyed shipment and appends an audit row (no key). Rows go to the SQLite file ORDERS_DB.
"""

import os
import sqlite3
from contextlib import closing, contextmanager
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

UNKEYED = {"charge": "pay", "audit": "ship"}  # effect -> its node: a resume repeats these
KEYED = {"ledger": "pay", "shipment": "ship"}  # keyed on the order: a resume changes nothing


class Order(TypedDict, total=False):
    order: str
    valid: bool
    paid: bool
    shipped: bool


def validate(state: Order):
    return {"valid": True}


def pay(state: Order):
    with connect() as db:
        db.execute("INSERT INTO effects (effect, order_id) VALUES ('charge', ?)", (state["order"],))
        db.execute("INSERT OR IGNORE INTO keyed VALUES ('ledger', ?)", (state["order"],))
    return {"paid": True}


def ship(state: Order):
    with connect() as db:
        db.execute("INSERT OR IGNORE INTO keyed VALUES ('shipment', ?)", (state["order"],))
        db.execute("INSERT INTO effects (effect, order_id) VALUES ('audit', ?)", (state["order"],))
    return {"shipped": True}


def build(checkpointer=None):
    builder = StateGraph(Order)
    for node in (validate, pay, ship):
        builder.add_node(node)
    builder.add_edge(START, "validate")
    builder.add_edge("validate", "pay")
    builder.add_edge("pay", "ship")
    builder.add_edge("ship", END)
    return builder.compile(checkpointer=checkpointer)


def observe(thread_id):
    with connect() as db:
        rows = db.execute(
            "SELECT effect, COUNT(*) FROM effects WHERE order_id = ? GROUP BY effect"
            " UNION ALL SELECT effect, COUNT(*) FROM keyed WHERE order_id = ? GROUP BY effect",
            (thread_id, thread_id),
        ).fetchall()
    return {name: 0 for name in (*UNKEYED, *KEYED)} | dict(rows)


@contextmanager
def connect():
    with closing(sqlite3.connect(os.environ["ORDERS_DB"], timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS effects (effect TEXT, order_id TEXT)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS keyed (effect TEXT, order_id TEXT,"
            " PRIMARY KEY (effect, order_id))"
        )
        yield db


class Forgetful:
    """A world that restores nothing (a snapshot engine's bug, or a world declared wrong): the
    resumes see every effect the clean run made later. For --verify's tests."""

    def snapshot(self):
        return None

    def restore(self, image):
        pass


def forgetful_world():
    return Forgetful()
