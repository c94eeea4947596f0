"""Interrupts: `twice` asks two questions in a row in one node (the node re-runs from its first
line on each answer); `together` has two nodes side by side that each ask, so two interrupts
are pending at once and LangGraph needs an answer per interrupt id. `answer` answers both."""

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from effectdrill_graphs import ledger


class Form(TypedDict, total=False):
    thread: str
    answers: Annotated[list, operator.add]


def ask_twice(state: Form):
    ledger.record("draft", state["thread"])  # before the first question: repeats on each answer
    name = interrupt("name?")
    city = interrupt("city?")
    ledger.record("submit", state["thread"], "form")
    return {"answers": [name, city]}


def build_twice():
    builder = StateGraph(Form)
    builder.add_node(ask_twice)
    builder.add_edge(START, "ask_twice")
    builder.add_edge("ask_twice", END)
    return builder.compile()


def asker(question):
    def ask(state: Form):
        return {"answers": [interrupt(question)]}

    ask.__name__ = f"ask_{question}"
    return ask


def submit(state: Form):
    ledger.record("submit", state["thread"])
    return {}


def build_together():
    builder = StateGraph(Form)
    builder.add_node("split", lambda state: {})
    builder.add_node(submit)
    builder.add_edge(START, "split")
    for question in ("name", "city"):
        builder.add_node(f"ask_{question}", asker(question))
        builder.add_edge("split", f"ask_{question}")
        builder.add_edge(f"ask_{question}", "submit")
    builder.add_edge("submit", END)
    return builder.compile()


def answer(interrupts):
    """{interrupt id: answer} for every pending interrupt: its question, in capitals."""
    return {i.id: str(i.value).upper() for i in interrupts}


observe = ledger.observe
