"""The map-reduce example of LangGraph's Graph API guide ("Map-Reduce and the Send API",
docs.langchain.com/oss/python/langgraph/use-graph-api), its nodes and subjects as there:
generate_topics makes three subjects, a Send per subject runs generate_joke, best_joke picks
one. Added: each joke is an effect without a key (as a model call is), the pick is keyed;
{"keyed": true} keys each joke on its subject.
"""

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from effectdrill_graphs import ledger

SUBJECTS = ["lions", "elephants", "penguins"]


class Overall(TypedDict, total=False):
    thread: str
    keyed: bool
    subjects: list
    jokes: Annotated[list, operator.add]
    best: str


def generate_topics(state: Overall):
    return {"subjects": SUBJECTS}


def continue_to_jokes(state: Overall):
    return [
        Send(
            "generate_joke", {"subject": s, "thread": state["thread"], "keyed": state.get("keyed")}
        )
        for s in state["subjects"]
    ]


def generate_joke(state: dict):
    ledger.record("joke", state["thread"], state["subject"] if state["keyed"] else None)
    return {"jokes": [f"a joke about {state['subject']}"]}


def best_joke(state: Overall):
    ledger.record("pick", state["thread"], "best")
    return {"best": state["jokes"][0]}


def build():
    builder = StateGraph(Overall)
    builder.add_node(generate_topics)
    builder.add_node(generate_joke)
    builder.add_node(best_joke)
    builder.add_edge(START, "generate_topics")
    builder.add_conditional_edges("generate_topics", continue_to_jokes, ["generate_joke"])
    builder.add_edge("generate_joke", "best_joke")
    builder.add_edge("best_joke", END)
    return builder.compile()


observe = ledger.observe
