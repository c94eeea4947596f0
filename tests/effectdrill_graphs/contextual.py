"""A graph that takes its dependency through LangGraph's runtime context, as 1.x graphs do.

notify: one unkeyed row per call, into the SQLite file named by the context (Runtime.context).
"""

import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime


@dataclass
class Deps:
    db_path: str


class Message(TypedDict, total=False):
    to: str
    sent: bool


def notify(state: Message, runtime: Runtime[Deps]):
    with closing(sqlite3.connect(runtime.context.db_path)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS sent (recipient TEXT)")
        db.execute("INSERT INTO sent VALUES (?)", (state["to"],))
    return {"sent": True}


def build():
    builder = StateGraph(Message, context_schema=Deps)
    builder.add_node(notify)
    builder.add_edge(START, "notify")
    builder.add_edge("notify", END)
    return builder.compile()


def make_context():
    return Deps(db_path=os.environ["CONTEXT_DB"])


def observe(thread_id):
    with closing(sqlite3.connect(os.environ["CONTEXT_DB"])) as db:
        db.execute("CREATE TABLE IF NOT EXISTS sent (recipient TEXT)")
        count = db.execute("SELECT COUNT(*) FROM sent WHERE recipient = ?", (thread_id,))
        return {"sent": count.fetchone()[0]}
