"""Two nodes that send a POST /tickets without a key through httpx2, the client openai 3.x and
langsmith send through: `send` by httpx2.post (its sync transport), `asend` by an
httpx2.AsyncClient (its async transport). Every send is a new ticket."""

import os
from typing import TypedDict

import httpx2
from langgraph.graph import END, START, StateGraph


class Order(TypedDict, total=False):
    order: str
    sent: int
    asent: int


def send(state: Order):
    answer = httpx2.post(url(), json={"title": state["order"]}, timeout=10)
    answer.raise_for_status()
    return {"sent": answer.json()["ticket_id"]}


async def asend(state: Order):
    async with httpx2.AsyncClient(timeout=10) as client:
        answer = await client.post(url(), json={"title": state["order"] + "/again"})
    answer.raise_for_status()
    return {"asent": answer.json()["ticket_id"]}


def build():
    builder = StateGraph(Order)
    builder.add_node(send)
    builder.add_node(asend)
    builder.add_edge(START, "send")
    builder.add_edge("send", "asend")
    builder.add_edge("asend", END)
    return builder.compile()


# helpers


def url():
    return os.environ["API_URL"] + "/tickets"
