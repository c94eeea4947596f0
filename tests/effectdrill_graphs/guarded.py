"""A graph whose node guards its send with a module-level set of the ids it sent: it skips an
id it has seen. The id is the customer's (the same in every run of a drill), the row the
run's thread. In one process the guard holds; a restarted process starts with an empty set,
so a crash after the send and before the node's writes are saved sends again.

prepare -> welcome (the guarded send, no key at the service) -> done. Effects: ledger.py.
"""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from effectdrill_graphs import ledger

SENT = set()  # the ids this process sent: what a cache or an in-memory guard holds


class Signup(TypedDict, total=False):
    thread: str
    customer: str
    done: bool


def welcome(state: Signup):
    message = f"welcome-{state['customer']}"
    if message not in SENT:
        ledger.record("welcome", state["thread"])
        SENT.add(message)
    return {"done": True}


def welcome_then_ask(state: Signup):
    """The send, then interrupt(): a resume runs the node again from its first line."""
    welcome(state)
    interrupt("confirm?")
    return {"done": True}


def build(node=welcome):
    builder = StateGraph(Signup)
    builder.add_node("prepare", lambda state: {"done": False})
    builder.add_node("welcome", node)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "welcome")
    builder.add_edge("welcome", END)
    return builder.compile()


def build_asking():
    return build(welcome_then_ask)


observe = ledger.observe
