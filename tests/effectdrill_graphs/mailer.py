"""A graph whose requests carry the run's thread id in their path, as an email API's do.

draft -> send. `draft` asks a model (POST /v1/chat/completions, no key: it changes nothing);
`send` sends the message made from the thread (POST /v1/messages/msg-THREAD/send) under the
key msg-THREAD: a provider that honours keys sends it once. Both go to MAILER_URL.
observe(thread) asks that provider how many messages of the thread it sent.
"""

import json
import os
import urllib.request
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class Mail(TypedDict, total=False):
    thread: str
    text: str
    sent: bool


def draft(state: Mail):
    return {"text": post("/v1/chat/completions", {"prompt": "write it"}, None)["text"]}


def send(state: Mail):
    message = f"msg-{state['thread']}"
    post(f"/v1/messages/{message}/send", {"text": state["text"]}, message)
    return {"sent": True}


def build():
    builder = StateGraph(Mail)
    builder.add_node(draft)
    builder.add_node(send)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "send")
    builder.add_edge("send", END)
    return builder.compile()


def observe(thread):
    with urllib.request.urlopen(f"{os.environ['MAILER_URL']}/sent/msg-{thread}") as answer:
        return {"sent": json.load(answer)["sent"]}


# helpers


def post(path, body, key):
    headers = {"Content-Type": "application/json"} | ({"Idempotency-Key": key} if key else {})
    request = urllib.request.Request(
        os.environ["MAILER_URL"] + path, json.dumps(body).encode(), headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)
