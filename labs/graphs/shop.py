"""A three-node shop for the drill (lab 11): one effect without a key, one with a key.

take_order -> charge -> send_receipt. `charge` INSERTs a row for every call, as a payment API
without an idempotency key would; `send_receipt` INSERT OR IGNOREs on the order's id, as a
service that keeps one answer per key would. observe(thread) counts both for one order.

    python -m effectdrill labs.graphs.shop:graph --input '{"order": "{thread}"}' \
        --observe labs.graphs.shop:observe

The rows go to the SQLite file SHOP_DB (default data/shop/shop.sqlite, under the folder you
run from; the folder is made on the first write).
"""

import os
import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

DEFAULT_DB = "data/shop/shop.sqlite"  # relative to the current folder: the learner's own


class Order(TypedDict, total=False):
    order: str
    amount_cents: int
    charged: bool
    receipt_sent: bool


def take_order(state: Order):
    return {"amount_cents": 1999}


def charge(state: Order):
    with connect() as db:  # no key: a second call is a second charge
        db.execute(
            "INSERT INTO charges (order_id, amount_cents) VALUES (?, ?)",
            (state["order"], state["amount_cents"]),
        )
    return {"charged": True}


def send_receipt(state: Order):
    with connect() as db:  # keyed on the order: a second call changes nothing
        db.execute("INSERT OR IGNORE INTO receipts (order_id) VALUES (?)", (state["order"],))
    return {"receipt_sent": True}


def build():
    builder = StateGraph(Order)
    builder.add_node(take_order)
    builder.add_node(charge)
    builder.add_node(send_receipt)
    builder.add_edge(START, "take_order")
    builder.add_edge("take_order", "charge")
    builder.add_edge("charge", "send_receipt")
    builder.add_edge("send_receipt", END)
    return builder.compile()


graph = build()


def observe(thread_id):
    """How many charges and receipts the order named `thread_id` got."""
    with connect() as db:
        charges = db.execute("SELECT COUNT(*) FROM charges WHERE order_id = ?", (thread_id,))
        receipts = db.execute("SELECT COUNT(*) FROM receipts WHERE order_id = ?", (thread_id,))
        return {"charge": charges.fetchone()[0], "receipt": receipts.fetchone()[0]}


# helpers


@contextmanager
def connect():
    """A connection to SHOP_DB, committed and closed after the block; tables made on first use."""
    path = Path(os.environ.get("SHOP_DB", DEFAULT_DB))
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS charges (order_id TEXT, amount_cents INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS receipts (order_id TEXT PRIMARY KEY)")
        yield db
