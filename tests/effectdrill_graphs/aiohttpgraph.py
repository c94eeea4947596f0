"""A node that sends a POST /tickets without a key through aiohttp's ClientSession: every send is
a new ticket. build_sync: a sync node that runs it with asyncio.run (a sync graph);
build_async: an `async def` node that awaits it (an async graph)."""

import asyncio
import os
from typing import TypedDict

import aiohttp
from langgraph.graph import END, START, StateGraph


class Order(TypedDict, total=False):
    order: str
    sent: int


async def post(title):
    async with aiohttp.ClientSession() as session:
        url = os.environ["API_URL"] + "/tickets"
        async with session.post(
            url, json={"title": title}, timeout=aiohttp.ClientTimeout(10)
        ) as answer:
            answer.raise_for_status()
            return (await answer.json())["ticket_id"]


def send(state: Order):
    return {"sent": asyncio.run(post(state["order"]))}


async def asend(state: Order):
    return {"sent": await post(state["order"])}


def build_sync():
    return build(send)


def build_async():
    return build(asend)


def build(node):
    builder = StateGraph(Order)
    builder.add_node("send", node)
    builder.add_node("done", lambda state: {})
    builder.add_edge(START, "send")
    builder.add_edge("send", "done")
    builder.add_edge("done", END)
    return builder.compile()
