"""A publishing graph that waits for a reviewer: interrupt() in a node of its own.

draft -> review -> publish. `draft` saves a keyed draft, `review` only asks (interrupt), and
`publish` appends a post with no key. The SQLite file is the module-level DB_PATH, set by the
test before the drill.
"""

import sqlite3
from contextlib import closing, contextmanager
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

DB_PATH = None  # set by the test: the SQLite file the effects go to


class Post(TypedDict, total=False):
    post: str
    verdict: str
    published: bool


def draft(state: Post):
    with connect() as db:
        db.execute("INSERT OR IGNORE INTO drafts VALUES (?)", (state["post"],))
    return {}


def review(state: Post):
    return {"verdict": interrupt({"review": state["post"]})}


def publish(state: Post):
    with connect() as db:
        db.execute("INSERT INTO posts VALUES (?, ?)", (state["post"], state["verdict"]))
    return {"published": True}


def build():
    builder = StateGraph(Post)
    for node in (draft, review, publish):
        builder.add_node(node)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile()


def observe(thread_id):
    with connect() as db:
        drafts = db.execute("SELECT COUNT(*) FROM drafts WHERE post = ?", (thread_id,))
        n_drafts = drafts.fetchone()[0]
        posts = db.execute("SELECT COUNT(*) FROM posts WHERE post = ?", (thread_id,))
        return {"draft": n_drafts, "post": posts.fetchone()[0]}


def observe_drafts(thread_id):
    """Only the keyed effect: a drill of it finds nothing."""
    return {"draft": observe(thread_id)["draft"]}


@contextmanager
def connect():
    with closing(sqlite3.connect(DB_PATH, timeout=10)) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS drafts (post TEXT PRIMARY KEY)")
        db.execute("CREATE TABLE IF NOT EXISTS posts (post TEXT, verdict TEXT)")
        yield db
