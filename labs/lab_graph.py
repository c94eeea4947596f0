"""The lab's ticket graph: the core's prepare and the lessons' variants of create_ticket, each
switch in its lesson's module. WORKER_GRAPH's default (labs/workers.py): build_lab_graph.

    START -> prepare -> create_ticket [-> approval] [-> notify] [-> pay] -> END
    START -> prepare -> approval -> create_ticket -> END      (--approval before; a no: END)
"""

import workflow
from labs.approval import (
    after_approval,
    approval_node,
    ask_first,
    create_ticket_then_ask,
    send_approved,
)
from labs.contract import EFFECT_NODE, derive_keys
from labs.keyless import add_notify, add_pay
from labs.modes import MODES, LabTicketState, create_ticket_by_mode
from labs.retries import failing_once_after

__all__ = ["MODES", "build_lab_graph"]  # MODES: labs/workers.py's --mode choices


def build_lab_graph(
    checkpointer,
    approval=None,
    version="1",
    notify=False,
    retry_after_ack=None,
    pay=False,
    keys="1",
):
    """The lab's graph: the core's prepare, create_ticket keyed by --mode, and the approval;
    version 2 names create_ticket open_ticket, as a refactoring deploy would; keys: how that
    node derives the ticket's key (labs/contract.py's KEY_DERIVATIONS); notify and pay: the
    message and the payment after the ticket (lab 15); retry_after_ack: lab 17's failure after
    the answer, under a RetryPolicy (failing_once_after)."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(LabTicketState, context_schema=workflow.Context)
    builder.add_node("prepare", workflow.prepare)
    shapes = {"in-node": create_ticket_then_ask, "before": send_approved}
    effect, name = shapes.get(approval, create_ticket_by_mode), EFFECT_NODE[version]
    effect = derive_keys(effect, keys)
    effect, retry = failing_once_after(effect, retry_after_ack)  # (effect, None) when off
    builder.add_node(name, effect, retry_policy=retry)
    builder.add_edge(START, "prepare")
    if approval == "before":  # lab 07's bound approval: asked first, checked at the send
        builder.add_node("approval", ask_first)
        builder.add_edge("prepare", "approval")
        builder.add_conditional_edges("approval", after_approval, {"send": name, "end": END})
        builder.add_edge(name, END)
        return builder.compile(checkpointer=checkpointer)
    builder.add_edge("prepare", name)
    last = name
    if approval == "own-node":  # the better shape: the effect's node has returned before the wait
        builder.add_node("approval", approval_node)
        builder.add_edge(name, "approval")
        last = "approval"
    if notify:
        last = add_notify(builder, last)
    if pay:
        last = add_pay(builder, last)
    builder.add_edge(last, END)
    return builder.compile(checkpointer=checkpointer)
