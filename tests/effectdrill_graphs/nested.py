"""A graph whose effect is inside a subgraph: the parent's node `child` runs a compiled graph.

The subgraph's node `effect` appends a row (no key) to the SQLite file NESTED_DB.
"""

import os
import sqlite3
from contextlib import closing
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class Order(TypedDict, total=False):
    order: str
    done: bool


def effect(state: Order):
    with closing(sqlite3.connect(os.environ["NESTED_DB"])) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS sent (order_id TEXT)")
        db.execute("INSERT INTO sent VALUES (?)", (state["order"],))
    return {"done": True}


def build():
    inner = StateGraph(Order)
    inner.add_node(effect)
    inner.add_edge(START, "effect")
    inner.add_edge("effect", END)
    outer = StateGraph(Order)
    outer.add_node("child", inner.compile())
    outer.add_edge(START, "child")
    outer.add_edge("child", END)
    return outer.compile()


def observe(thread_id):
    with closing(sqlite3.connect(os.environ["NESTED_DB"])) as db:
        db.execute("CREATE TABLE IF NOT EXISTS sent (order_id TEXT)")
        count = db.execute("SELECT COUNT(*) FROM sent WHERE order_id = ?", (thread_id,))
        return {"sent": count.fetchone()[0]}
