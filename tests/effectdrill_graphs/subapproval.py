"""An approval inside a subgraph, the effect before the question: the clean run repeats it.

assistant -> review (a subgraph: draft -> confirm). `confirm` sends the draft (no key), then
asks with interrupt(); answered, LangGraph runs `confirm` again from its first line, and it
sends again. The repeat belongs to `review/confirm`, not to `review`, the parent's node.
build_async is the same graph of `async def` nodes.
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


async def adraft(state: Mail):
    return {}


async def aconfirm(state: Mail):
    return confirm(state)


def build(nodes=(draft, confirm)):
    inner = StateGraph(Mail)
    inner.add_node("draft", nodes[0])
    inner.add_node("confirm", nodes[1])
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


def build_async():
    return build((adraft, aconfirm))


observe = ledger.observe
