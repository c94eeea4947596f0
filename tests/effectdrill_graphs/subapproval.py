"""An approval inside a subgraph, the effect before the question: the clean run repeats it.

assistant -> review (a subgraph: draft -> confirm). `confirm` sends the draft (no key), then
asks with interrupt(); answered, LangGraph runs `confirm` again from its first line, and it
sends again. The repeat belongs to `review/confirm`, not to `review`, the parent's node.
"""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from effectdrill_graphs import ledger


class Mail(TypedDict, total=False):
    thread: str
    approved: bool


def draft(state: Mail):
    return {}


def confirm(state: Mail):
    ledger.record("sent", state["thread"])
    return {"approved": bool(interrupt("send it?"))}


def build():
    inner = StateGraph(Mail)
    inner.add_node(draft)
    inner.add_node(confirm)
    inner.add_edge(START, "draft")
    inner.add_edge("draft", "confirm")
    inner.add_edge("confirm", END)
    builder = StateGraph(Mail)
    builder.add_node("assistant", lambda state: {})
    builder.add_node("review", inner.compile())
    builder.add_edge(START, "assistant")
    builder.add_edge("assistant", "review")
    builder.add_edge("review", END)
    return builder.compile()


observe = ledger.observe
