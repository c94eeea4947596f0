"""Lab 07: the approval that runs twice. --approval [in-node|own-node] asks a human after the
ticket and waits with interrupt(); `approve [--reject]` answers.

in-node (the trap): the effect's node waits, so the answer re-runs it from its first line and its
request goes again (unless keyed). own-node: the effect's node has returned before the wait, so
only the wait repeats. The ask itself is an effect (a ticket keyed OPERATION:approval) through
the ledger in every --mode.
"""

import dataclasses
import shlex

import workflow
from exitcodes import EXIT_THREAD, UserError, command, emit
from labs.modes import create_ticket_by_mode, emit_effect_outcome

APPROVAL_SHAPES = ("in-node", "own-node")  # where --approval waits for a human
# The ask for approval, declared once: a ticket on the receiver, under a name of its own.
APPROVAL = dataclasses.replace(workflow.ticket, name="approval")
MAX_TITLE = 200  # characters in a ticket's title: labs/receiver.py's MAX_TITLE_CHARS


def create_ticket_then_ask(state, runtime):
    """Lab 07's trap: the node waits for a human after its effect, so the answer re-runs it."""
    result = create_ticket_by_mode(state, runtime)
    return {**result, "approved": ask_approval(state, runtime, result["ticket_id"])}


def approval_node(state, runtime):
    """The approval in a node of its own: on the answer it runs again, and its ask, an effect
    through the ledger, is answered by its receipt: only the wait repeats."""
    return {"approved": ask_approval(state, runtime, state["ticket_id"])}


def ask_approval(state, runtime, ticket_id):
    """Ask a human, then wait: the ask is a ticket on the receiver, keyed OPERATION:approval
    and performed through the ledger in every --mode, before interrupt() stops the run. The
    answer (`approve`) runs the node again from its first line: the ask finds its receipt and
    sends nothing, and interrupt() returns the answer."""
    from langgraph.types import interrupt

    key = f"{state['operation_id']}:approval"
    # The ask names the operation's title, not the ticket: a naive in-node re-run makes another
    # ticket, and the same key with another request is a conflict, never a second ask.
    request = {"title": f"Approval wanted: {state['title']}"[:MAX_TITLE]}
    done = APPROVAL.perform(runtime.context.ledger, key, request, runtime.context.client)
    emit_effect_outcome("approval_requested", done, key, request_id=done.answer["ticket_id"])
    approved = interrupt({"ticket_id": ticket_id})
    emit("approval", approved=approved)
    return approved


def check_approval(args, snapshot):
    """`approve` needs a run that waits for approval; `resume` must not answer one by accident."""
    waiting, approving = bool(snapshot.interrupts), args.action == "approve"
    if approving and not snapshot.values:
        raise UserError(
            f"no thread {args.thread!r} waits for approval; check --thread", EXIT_THREAD
        )
    if approving and not waiting:
        raise UserError(f"thread {args.thread!r} is not waiting for approval", EXIT_THREAD)
    if waiting and not approving:
        raise UserError(
            f"thread {args.thread!r} waits for approval; answer with "
            f"{command(f'approve --thread {shlex.quote(args.thread)}')} (or --reject)",
            EXIT_THREAD,
        )
