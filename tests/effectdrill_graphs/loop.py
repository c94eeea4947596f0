"""An agent loop: `agent` calls the model (an unkeyed effect) and asks for a tool once; `tools`
looks the answer up (keyed on the turn) and loops back. A clean run calls the model twice.

With {"keyed": true} in the input the model call carries a key (the turn): nothing repeats.
"""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from effectdrill_graphs import ledger


class Chat(TypedDict, total=False):
    thread: str
    keyed: bool
    turn: int


def agent(state: Chat):
    turn = state.get("turn", 0) + 1
    ledger.record("model_call", state["thread"], turn if state.get("keyed") else None)
    return {"turn": turn}


def route(state: Chat):
    return "tools" if state["turn"] < 2 else END


def tools(state: Chat):
    ledger.record("lookup", state["thread"], state["turn"])
    return {}


def build():
    builder = StateGraph(Chat)
    builder.add_node(agent)
    builder.add_node(tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile()


observe = ledger.observe
