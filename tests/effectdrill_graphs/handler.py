"""A node whose failure is taken over by its error handler (LangGraph 1.2's `error_handler=`).

`send` records its effect (no key), then raises; `recover` records one of its own and ends the
run. LangGraph saves the failed task's error before it runs the handler, and waits for that
save (schedule_error_handler in langgraph/pregel/_loop.py): a kill that holds it back is a state
no run can reach. build_async is the same graph of `async def` nodes.
"""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from effectdrill_graphs import ledger


class Job(TypedDict, total=False):
    thread: str
    recovered: bool


def send(state: Job):
    ledger.record("sent", state["thread"])
    raise RuntimeError("the provider answered 503")


def recover(state: Job):
    ledger.record("recovered", state["thread"])
    return {"recovered": True}


async def asend(state: Job):
    return send(state)


async def arecover(state: Job):
    return recover(state)


def build(nodes=(send, recover)):
    builder = StateGraph(Job)
    builder.add_node("send", nodes[0], error_handler=nodes[1])
    builder.add_edge(START, "send")
    builder.add_edge("send", END)
    return builder.compile()


def build_async():
    return build((asend, arecover))


observe = ledger.observe
