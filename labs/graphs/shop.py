"""A three-node shop for the drill (lab 11): one effect without a key, one with a key.

take_order -> charge -> send_receipt. `charge` INSERTs a row for every call, as a payment API
without an idempotency key would; `send_receipt` INSERT OR IGNOREs on the order's id, as a
service that keeps one answer per key would. observe(thread) counts both for one order.

    python -m effectdrill labs.graphs.shop:graph --input '{"order": "{thread}"}' \
        --observe labs.graphs.shop:observe

The rows go to the SQLite file SHOP_DB (default data/shop/shop.sqlite, under the folder you
run from; the folder is made on the first write).

With "mode": "ledger" in the input the charge goes through the effect ledger (effects.py,
CHARGE below, in the file ledger.sqlite beside SHOP_DB): the intent is recorded before the row
is written, the receipt after, and a re-run of the node returns the receipt instead of
charging again. The payment API stands for one with no key and no lookup, so a run that died
between the charge and its receipt stops with effects.Unsettled for a person to settle.
"""

import os
import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import effects

DEFAULT_DB = "data/shop/shop.sqlite"  # relative to the current folder: the learner's own


class Order(TypedDict, total=False):
    order: str
    mode: str  # "ledger": the charge through the ledger; anything else (or none): without
    amount_cents: int
    charged: bool
    receipt_sent: bool


def take_order(state: Order):
    return {"amount_cents": 1999}


def charge(state: Order):
    request = {"order": state["order"], "amount_cents": state["amount_cents"]}
    if state.get("mode") == "ledger":  # the order names the operation: the ledger's key
        with effects.Ledger(db_path().with_name("ledger.sqlite")) as ledger:
            CHARGE.perform(ledger, state["order"], request, client=None)
    else:
        pay(request)  # no key: a second call is a second charge
    return {"charged": True}


def pay(request):
    """The payment API: every call is a charge."""
    with connect() as db:
        cursor = db.execute(
            "INSERT INTO charges (order_id, amount_cents) VALUES (?, ?)",
            (request["order"], request["amount_cents"]),
        )
        return {"charge_id": cursor.lastrowid}


# The charge, declared once for the ledger: no lookup, the payment API offers none.
CHARGE = effects.Effect(
    "charge",
    send=lambda client, request, key: pay(request),
    external_id=lambda answer: answer["charge_id"],
)


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
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS charges (order_id TEXT, amount_cents INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS receipts (order_id TEXT PRIMARY KEY)")
        yield db


def db_path():
    return Path(os.environ.get("SHOP_DB", DEFAULT_DB))
