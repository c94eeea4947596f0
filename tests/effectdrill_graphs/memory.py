"""A graph that expects the platform's store, as LangGraph's server gives one (`store` argument).

`remember` saves a memory of the thread under a new uuid4 key unless the store already holds
one for it, and records each save (the effect). Run without a store, `store` is None and the
node fails; with one that outlives a kill (a SqliteStore on a file), a resume finds the memory
saved before the kill and saves none again.
"""

import uuid
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from effectdrill_graphs import ledger


class Chat(TypedDict, total=False):
    thread: str
    remembered: bool


def remember(state: Chat, *, store: BaseStore):
    namespace = ("memories", state["thread"])
    if not store.search(namespace):
        store.put(namespace, str(uuid.uuid4()), {"text": "likes tea"})
        ledger.record("memory", state["thread"])
    return {"remembered": True}


def build():
    builder = StateGraph(Chat)
    builder.add_node(remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder.compile()


observe = ledger.observe
