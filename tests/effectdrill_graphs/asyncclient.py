"""An async node sending through one httpx.AsyncClient made at import and kept open, as async
applications are written: its pooled keep-alive connections live on the event loop of their
first request. send POSTs the thread's message to the provider at MAILER_URL (keyed on it)
and observe asks the provider how many times it sent it (tests/effectdrill/test_http_observer.py
starts the provider, which keeps connections alive).
"""

import os
from typing import TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

from effectdrill_graphs.mailer import observe

CLIENT = httpx.AsyncClient(timeout=10)  # at import, never closed: the application's own


class Mail(TypedDict, total=False):
    thread: str
    sent: bool


async def draft(state: Mail):
    await CLIENT.post(os.environ["MAILER_URL"] + "/v1/chat/completions", json={"prompt": "hi"})
    return {}


async def send(state: Mail):
    message = f"msg-{state['thread']}"
    answer = await CLIENT.post(
        f"{os.environ['MAILER_URL']}/v1/messages/{message}/send",
        json={"text": "hello"},
        headers={"Idempotency-Key": message},
    )
    answer.raise_for_status()
    return {"sent": True}


def build():
    builder = StateGraph(Mail)
    builder.add_node(draft)
    builder.add_node(send)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "send")
    builder.add_edge("send", END)
    return builder.compile()


__all__ = ["build", "observe"]
