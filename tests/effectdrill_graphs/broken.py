"""Things the drill must refuse with one line: a failing node, bad observers, not a graph."""

import os
import sqlite3
from contextlib import closing
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

NOT_A_GRAPH = "a string"


class Pick(TypedDict, total=False):
    item: str


def pick(state: Pick):
    raise ValueError(f"no stock for {state['item']}")


def build():
    builder = StateGraph(Pick)
    builder.add_node(pick)
    builder.add_edge(START, "pick")
    builder.add_edge("pick", END)
    return builder.compile()


def observe_nothing(thread_id):
    return {}


def observe_raises(thread_id):
    raise RuntimeError("the shop database is down")


def observe_list(thread_id):
    return [1]


def observe_text_counts(thread_id):
    return {"charge": "1"}


def book(state: Pick):
    """A UNIQUE insert without OR IGNORE: the effect does not repeat, the resume fails."""
    with closing(sqlite3.connect(os.environ["STRICT_DB"])) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS booked (item TEXT PRIMARY KEY)")
        db.execute("INSERT INTO booked VALUES (?)", (state["item"],))
    return {}


def build_strict():
    builder = StateGraph(Pick)
    builder.add_node(book)
    builder.add_edge(START, "book")
    builder.add_edge("book", END)
    return builder.compile()


def observe_strict(thread_id):
    with closing(sqlite3.connect(os.environ["STRICT_DB"])) as db:
        db.execute("CREATE TABLE IF NOT EXISTS booked (item TEXT PRIMARY KEY)")
        count = db.execute("SELECT COUNT(*) FROM booked WHERE item = ?", (thread_id,))
        return {"booked": count.fetchone()[0]}
