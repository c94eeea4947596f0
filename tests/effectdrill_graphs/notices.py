"""A graph whose requests carry the run's thread id in their query and body, not their path.

notify -> confirm, both to MAILER_URL:
    notify   requests (urllib3 sends the body after the headers), no key:
             POST /v1/notices?message=msg-THREAD  {"message": "msg-THREAD", "text": "hello"}
    confirm  httpx, keyed on the message: POST /v1/confirmations?message=msg-THREAD, the same body
A resume that runs notify again sends the same notice again: the same request, no key.
"""

import json
import os
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class Notice(TypedDict, total=False):
    thread: str
    notified: bool
    confirmed: bool


def notify(state: Notice):
    import requests

    message = f"msg-{state['thread']}"
    answer = requests.post(
        f"{os.environ['MAILER_URL']}/v1/notices",
        params={"message": message},
        data=body(message),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    answer.raise_for_status()
    return {"notified": True}


def confirm(state: Notice):
    import httpx

    message = f"msg-{state['thread']}"
    answer = httpx.post(
        f"{os.environ['MAILER_URL']}/v1/confirmations",
        params={"message": message},
        content=body(message),
        headers={"Content-Type": "application/json", "Idempotency-Key": message},
        timeout=10,
    )
    answer.raise_for_status()
    return {"confirmed": True}


def build():
    builder = StateGraph(Notice)
    builder.add_node(notify)
    builder.add_node(confirm)
    builder.add_edge(START, "notify")
    builder.add_edge("notify", "confirm")
    builder.add_edge("confirm", END)
    return builder.compile()


def body(message):
    return json.dumps({"message": message, "text": "hello"})
