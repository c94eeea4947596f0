"""An assistant that sends email, in the shape found in public assistants, for the drill (lab 20).

    naive: agent -> approval[review_and_send] -> END
    fixed: agent -> approval[review] -> send -> END

`agent` stands in for the model: from the run's input it writes two send_email tool calls, each
with an id made from the conversation (`{conversation}-call-1`, `-call-2`), the same on every run.
`approval` is a subgraph, as in those assistants. Its one node goes through the tool calls and
asks a person about each with interrupt(), one call after the other.

naive: the handler sends each email itself, once the person says "accept", and then goes on to
the next call. LangGraph runs an interrupted node again from its first line when it is resumed,
so the answer to the second call re-runs the loop: the first call's saved answer comes back at
once, and its email goes out again. Two tool calls answered by two approvals: the first email
twice on every run, with no crash at all. A kill anywhere between an email and the save of the
handler's results sends it once more.

fixed: `review` only records the decisions, and sends nothing: re-running it repeats questions.
`send`, a node of its own after the subgraph, sends each accepted email through the ledger
(labs/keyless.py's MESSAGE, lab 15's message effect), keyed by its tool call's id: a re-run
finds the receipt.

    python -m effectdrill labs.graphs.assistant:naive --input '{"conversation": "{thread}"}' \
        --context labs.graphs.assistant:context --observe labs.graphs.assistant:observe \
        --resume-with '"accept"'

The emails go to the receiver's POST /messages (API_URL), which reads no key: each request is an
email. observe(thread) counts the emails of the conversation named `thread`, one column per call.
"""

import contextlib
import io
import os
from typing import TypedDict

import workflow
from labs import keyless as keyless_lesson
from labs.graphs import classify

TEXT = {  # the two emails the agent drafts, by the number of their tool call
    1: "Thursday at 10 works, see you then",
    2: "I sent the invite for Thursday at 10",
}


class Conversation(TypedDict, total=False):
    conversation: str  # the run's input: whom the emails go to, and the tool calls' ids
    tool_calls: list  # [{"id", "name", "args": {"to", "text"}}], written by agent
    decisions: dict  # fixed: {tool call id: the person's answer}, written by review
    sent: list  # the ids of the emails sent


def agent(state: Conversation):
    """The model's turn, without a model: two send_email tool calls with stable ids."""
    to = state["conversation"]
    calls = [
        {"id": f"{to}-call-{n}", "name": "send_email", "args": {"to": to, "text": text}}
        for n, text in TEXT.items()
    ]
    return {"tool_calls": calls}


def review_and_send(state: Conversation, runtime):
    """Naive: ask about each call and send it once accepted, then return. Resumed, this node
    runs again from here: every call answered before is sent again."""
    from langgraph.types import interrupt

    sent = []
    for call in state["tool_calls"]:
        if interrupt({"action": call["name"], "args": call["args"]}) == "accept":
            runtime.context.client.call("/messages", call["args"])  # no key: none is read
            sent.append(call["id"])
    return {"sent": sent}


def review(state: Conversation):
    """Fixed: ask about each call and record the answer; nothing leaves this node."""
    from langgraph.types import interrupt

    return {
        "decisions": {
            call["id"]: interrupt({"action": call["name"], "args": call["args"]})
            for call in state["tool_calls"]
        }
    }


def send(state: Conversation, runtime):
    """Fixed: each accepted email once, through the ledger, keyed by its tool call's id."""
    ledger, client = runtime.context.ledger, runtime.context.client
    sent = []
    for call in state["tool_calls"]:
        if state["decisions"].get(call["id"]) == "accept":
            keyless_lesson.MESSAGE.perform(ledger, call["id"], call["args"], client)
            sent.append(call["id"])
    return {"sent": sent}


def naive():
    return build(review_and_send)


def fixed():
    return build(review, send)


context = classify.context  # the receiver's client, and a ledger of the drill's own


def observe(thread):
    """{email-1, email-2}: how many times each of the two emails of `thread` was sent."""
    with contextlib.redirect_stdout(io.StringIO()):
        client = workflow.Settings.from_environ(os.environ).client()
        messages = client.call("/messages")["messages"]
    mine = [m for m in messages if m["to"] == thread]
    return {f"email-{n}": sum(m["text"] == text for m in mine) for n, text in TEXT.items()}


# helpers


def build(handler, after=None):
    """agent -> approval (a subgraph: START -> handler -> END) [-> after] -> END, without a
    checkpointer: the drill gives it its own, and the subgraph uses its parent's."""
    from langgraph.graph import END, START, StateGraph

    sub = StateGraph(Conversation, context_schema=workflow.Context)
    sub.add_node(handler)
    sub.add_edge(START, handler.__name__)
    sub.add_edge(handler.__name__, END)
    builder = StateGraph(Conversation, context_schema=workflow.Context)
    builder.add_node(agent)
    builder.add_node("approval", sub.compile())
    nodes = ["agent", "approval", *([after.__name__] if after else [])]
    if after:
        builder.add_node(after)
    for a, b in zip([START, *nodes], [*nodes, END], strict=True):
        builder.add_edge(a, b)
    return builder.compile()
