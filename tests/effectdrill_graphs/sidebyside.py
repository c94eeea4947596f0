"""gate -> send, to show the drill's crash children running side by side.

In a crash run or its resume (any run but the clean one, whose thread ends in "-clean"),
`gate` leaves a mark in SIDE_DIR/marks and waits for a second run's mark; past WAIT_S it writes
SIDE_DIR/alone and goes on. `send` records one unkeyed effect in SIDE_DIR/effects.sqlite.
"""

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

WAIT_S = 20.0  # far past a second child's start, even on a loaded machine: failure's bound


class Run(TypedDict, total=False):
    run: str
    sent: bool


def gate(state: Run):
    if state["run"].endswith("-clean"):  # the drill's clean run: alone by design
        return {}
    marks = Path(os.environ["SIDE_DIR"]) / "marks"
    (marks / state["run"]).touch()
    deadline = time.monotonic() + WAIT_S
    while len(list(marks.iterdir())) < 2:
        if time.monotonic() > deadline:
            (marks.parent / "alone").write_text(state["run"])
            break
        time.sleep(0.01)  # polls a condition (another child's mark), bounded by WAIT_S
    return {}


def send(state: Run):
    with closing(connect()) as db, db:
        db.execute("INSERT INTO effects VALUES (?)", (state["run"],))
    return {"sent": True}


def build():
    builder = StateGraph(Run)
    builder.add_node(gate)
    builder.add_node(send)
    builder.add_edge(START, "gate")
    builder.add_edge("gate", "send")
    builder.add_edge("send", END)
    return builder.compile()


def observe(thread_id):
    with closing(connect()) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM effects WHERE run = ?", (thread_id,)).fetchone()
    return {"send": count}


def connect():
    db = sqlite3.connect(Path(os.environ["SIDE_DIR"]) / "effects.sqlite", timeout=30)
    db.execute("CREATE TABLE IF NOT EXISTS effects (run TEXT)")
    return db
