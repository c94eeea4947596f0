"""A StateGraph of `async def` nodes: prepare, then charge (no key), then receipt (keyed)."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from effectdrill_graphs import ledger


class Order(TypedDict, total=False):
    thread: str
    charged: bool


async def prepare(state: Order):
    return {}


async def charge(state: Order):
    ledger.record("charge", state["thread"])
    return {"charged": True}


async def receipt(state: Order):
    ledger.record("receipt", state["thread"], "receipt")
    return {}


def build():
    builder = StateGraph(Order)
    for node in (prepare, charge, receipt):
        builder.add_node(node)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "charge")
    builder.add_edge("charge", "receipt")
    builder.add_edge("receipt", END)
    return builder.compile()


observe = ledger.observe
