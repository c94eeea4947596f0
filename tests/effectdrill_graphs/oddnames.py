"""A graph whose node and effect carry names a terminal or a page could choke on: the effect's
name holds a byte the command line could not decode (a lone surrogate) and an escape sequence.
send records one unkeyed effect (ledger.py)."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from effectdrill_graphs import ledger

EFFECT = "caf\udce9\x1b[2J"  # b"caf\xe9" as os.fsdecode reads it, then "clear the screen"


class Run(TypedDict, total=False):
    thread: str


def send(state: Run):
    ledger.record("sent", state["thread"])
    return {}


def build():
    builder = StateGraph(Run)
    builder.add_node("send\x07", send)
    builder.add_edge(START, "send\x07")
    builder.add_edge("send\x07", END)
    return builder.compile()


def observe(thread):
    return {EFFECT: ledger.observe(thread).get("sent", 0)}
