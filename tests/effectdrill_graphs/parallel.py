"""Three nodes side by side: `start` fans out to email, sms and push (one notify effect each,
no key), `join` waits for all three."""

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from effectdrill_graphs import ledger

CHANNELS = ("email", "sms", "push")


class Alert(TypedDict, total=False):
    thread: str
    sent: Annotated[list, operator.add]


def notifier(channel):
    def send(state: Alert):
        ledger.record("notify", state["thread"])
        return {"sent": [channel]}

    send.__name__ = channel
    return send


def join(state: Alert):
    return {}


def build():
    builder = StateGraph(Alert)
    builder.add_node("start", lambda state: {})
    builder.add_node(join)
    builder.add_edge(START, "start")
    for channel in CHANNELS:
        builder.add_node(channel, notifier(channel))
        builder.add_edge("start", channel)
        builder.add_edge(channel, "join")
    builder.add_edge("join", END)
    return builder.compile()


observe = ledger.observe
