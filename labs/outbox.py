"""Lab 19: the outbox. `outbox start|resume|state`: request_ticket writes the ticket as a message
into the outbox (labs/relay.py delivers it) and sends nothing.

The drill's adapter (graph, context, observe, at the end) runs the same graph:

    python -m effectdrill labs.outbox:graph --context labs.outbox:context \
        --input '{"operation_id": "{thread}", "title": "{thread}", "delivery": "outbox"}' \
        --observe labs.outbox:observe

With "delivery": "outbox" the node writes the ticket it wants into the outbox of the SQLite file
OUTBOX_DB (default data/outbox/outbox.sqlite, under the folder you run from) and sends nothing;
observe(thread) first delivers what is pending there, as `python -m labs.relay --once` does
(relay.relay_once), then counts the receiver's tickets whose title is the thread id. With
"delivery": "direct" (the naive variant) the node sends the ticket itself, without a key, and
the drill finds the duplicate where it kills the run after the receiver's answer and before the
node's result is saved.
"""

import contextlib
import io
import os
from pathlib import Path
from typing import NotRequired

import checkpoints
import commandline
import effects
import workflow
from exitcodes import EXIT_THREAD, UserError, command, emit
from failpoints import fail
from labs.threads import (
    RESET_HINT,
    is_outbox,
    lesson_run,
    own_command,
    owning_command_line,
    run_ended,
    thread_words,
)

# --- lab 19: the outbox: the node's only effect is a row in the workflow's own database ------
#
#     START -> prepare -> request_ticket -> END
#
# request_ticket writes the ticket it wants into the outbox (relay.Outbox, in CHECKPOINT_DB
# beside the ledger), keyed by the operation's key, and returns: it sends nothing. labs/relay.py, a
# process of its own, delivers the row to the receiver's POST /tickets with that key as its
# Idempotency-Key. A kill before the write leaves no row, one after it (--crash-at
# before-outbox, after-outbox) the row, and the re-run node writes the same id again: nothing
# changes. The run is done before the ticket exists, so its state holds the message id, never a
# ticket id. "delivery": "direct" in the input (the drill's adapter, below) is the
# naive variant: the node sends the ticket itself, without a key.

OUTBOX_POINTS = ("before-outbox", "after-outbox")


class OutboxState(workflow.State):
    delivery: str  # "outbox" (the lab's), or "direct" (the drill's naive variant)
    message_id: NotRequired[str]


def request_ticket(state: OutboxState, runtime):
    """The ticket as a message in the outbox (or, direct, sent from here without a key)."""
    if state["delivery"] == "direct":
        answer = runtime.context.client.create(state["title"])  # no key: a repeat is a ticket
        emit("effect_ack", created=answer["created"], ticket_id=answer["ticket_id"])
        return {"ticket_id": answer["ticket_id"]}
    from langgraph.config import get_config

    from labs import relay

    fail("before-outbox")
    thread = get_config()["configurable"]["thread_id"]
    outbox = relay.Outbox(runtime.context.ledger)  # the ledger's database and connection
    written = outbox.put(state["key"], "/tickets", {"title": state["title"]}, thread)
    emit("outbox", message_id=state["key"], written=written)
    # Written and committed, and the node's result is not saved yet: a kill here re-runs the
    # node, which writes the same message id again (written: false). Nothing has been sent.
    fail("after-outbox")
    return {"message_id": state["key"]}


def build_outbox(checkpointer):
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(OutboxState, context_schema=workflow.Context)
    builder.add_node("prepare", workflow.prepare)
    builder.add_node("request_ticket", request_ticket)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "request_ticket")
    builder.add_edge("request_ticket", END)
    return builder.compile(checkpointer=checkpointer)


def outbox_start(args, settings):
    first = {"operation_id": args.operation, "title": args.title, "delivery": "outbox"}
    return outbox_run(args, settings, first)


def outbox_resume(args, settings):
    return outbox_run(args, settings, None)


def outbox_run(args, settings, graph_input):
    with lesson_run(args, settings) as (saver, ledger):
        graph = build_outbox(saver)
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        if head and not is_outbox(head):  # a ticket run's resume may repeat its request
            other = (
                owning_command_line(head)
                or f"it is a ticket run: {command(thread_words('state', args.thread))} shows it"
            )
            fresh = "; outbox start takes a new --thread" if graph_input is not None else ""
            raise UserError(
                f"thread {args.thread!r} is not an outbox run; {other}{fresh}", EXIT_THREAD
            )
        resume = command(thread_words("outbox resume", args.thread))
        hint = f"{resume}; or pick a new --thread; or {RESET_HINT}"
        checkpoints.require_thread(graph, args.thread, graph_input is not None, hint)
        final = workflow.run_graph(graph, graph_input, args.thread, settings.client(), ledger)
    return run_ended(final)


def outbox_state(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_outbox(saver).get_state(checkpoints.thread_config(args.thread))
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if "delivery" not in snapshot.values:  # the saved values, whole: the outbox's graph reads
        raise UserError(  # only its own channels
            f"thread {args.thread!r} is not an outbox run; "
            f"{own_command(head.checkpoint['channel_values'], 'state', args.thread)} shows it",
            EXIT_THREAD,
        )
    emit("state", values=snapshot.values, next=list(snapshot.next))


def add_outbox_parser(actions):
    outbox = actions.add_parser("outbox", help="lab 19: the ticket as a message in an outbox")
    steps = outbox.add_subparsers(
        dest="outbox_action", required=True, parser_class=commandline.Parser
    )
    thread = dict(default=commandline.Defaulted("outbox"), help="thread id (default: outbox)")
    for name, action in [("start", outbox_start), ("resume", outbox_resume)]:
        sub = steps.add_parser(name, help=f"{name} a run")
        sub.set_defaults(run=action, graph_command=True, resume="outbox resume")
        sub.add_argument("--thread", **thread)
        sub.add_argument("--crash-at", choices=OUTBOX_POINTS, help="where the run dies (SIGKILL)")
    start = steps.choices["start"]
    start.add_argument("--operation", default="case-019:open-ticket:v1", help="the message id")
    start.add_argument("--title", default="Check supplier configuration", help="ticket title")
    sub = steps.add_parser("state", help="show an outbox run's checkpoint")
    sub.set_defaults(run=outbox_state)
    sub.add_argument("--thread", **thread)


# --- the drill's adapter (effectdrill looks these up by name) --------------------------------

OUTBOX_DB_DEFAULT = "data/outbox/outbox.sqlite"  # relative to the current folder: the learner's


def graph():
    """The outbox graph, without a checkpointer: the drill gives it its own."""
    return build_outbox(None)


def context():
    """The receiver's client, and the ledger of OUTBOX_DB, whose database holds the outbox: the
    drill's crash runs are forked from one process, and each opens its own connection to it."""
    return workflow.Context(receiver_client(), effects.Ledger(outbox_drill_db()))


def observe(thread):
    from labs import relay

    with contextlib.redirect_stdout(io.StringIO()):  # the relay's lines are not the drill's
        with relay.open_outbox(outbox_drill_db()) as outbox:
            relay.relay_once(outbox, receiver_client())
        tickets = receiver_client().tickets()
    return {"ticket": sum(t["payload"]["title"] == thread for t in tickets)}


def receiver_client():
    return workflow.Settings.from_environ(os.environ).client()


def outbox_drill_db():
    """OUTBOX_DB's path, its folder made."""
    path = Path(os.environ.get("OUTBOX_DB", OUTBOX_DB_DEFAULT))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
