"""A node with a RetryPolicy whose first attempt sends, then fails: the retry sends again.

`notify` records a notice (no key), then raises on its first attempt of each thread (a timeout
after the provider took the request, say); LangGraph's RetryPolicy runs it again in-process, and
the second attempt sends a second notice. No crash is needed: the clean run repeats it.
`ack` after it is keyed. With "keyed": true the notice is keyed on the thread too.
"""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from effectdrill_graphs import ledger


class Notice(TypedDict, total=False):
    thread: str
    keyed: bool
    sent: bool


def notify(state: Notice):
    ledger.record("notice", state["thread"], state["thread"] if state.get("keyed") else None)
    if ledger.observe(state["thread"]).get("attempt", 0) == 0:
        ledger.record("attempt", state["thread"], "first")  # a marker, keyed: counted once
        raise TimeoutError("the provider did not answer in time")
    return {"sent": True}


def ack(state: Notice):
    ledger.record("ack", state["thread"], state["thread"])
    return {}


def build():
    builder = StateGraph(Notice)
    builder.add_node(
        "notify",
        notify,
        retry_policy=RetryPolicy(initial_interval=0.01, jitter=False, retry_on=TimeoutError),
    )
    builder.add_node(ack)
    builder.add_edge(START, "notify")
    builder.add_edge("notify", "ack")
    builder.add_edge("ack", END)
    return builder.compile()


observe = ledger.observe
