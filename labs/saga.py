"""Lab 13: the saga. `saga start|resume|state|refunds`: charge, reserve, and a refund when the
reservation is refused, each through the ledger; --mode naive sends the refund without a key.

The drill's adapter (graph, context, observe, at the end) runs the same graph:

    python -m effectdrill labs.saga:graph --context labs.saga:context \
        --input '{"operation_id": "{thread}", "title": "{thread}", "seats": 11, "mode": "naive"}' \
        --observe labs.saga:observe

11 seats are more than the receiver has (labs/receiver.py's SEATS, 10), so every run's reservation
is refused and its charge refunded. observe(thread) counts the charges (tickets whose title is the
thread id) and the refunds of those tickets. The charge and the reservation go through the ledger
of context() (labs/graphs/ticket.py's: a temporary file of the drill's own) in both modes. With
"mode": "naive" the run refunds twice where the drill kills it after the refund's answer and
before its result is saved; with "safe" it refunds once everywhere.
"""

import contextlib
import dataclasses
import io
import os
import urllib.parse
from typing import NotRequired, TypedDict

import checkpoints
import commandline
import effects
import exitcodes
import workflow
from exitcodes import EXIT_THREAD, UserError, command, emit
from failpoints import fail
from labs.modes import emit_effect_outcome
from labs.threads import RESET_HINT, is_saga, lesson_run, run_ended, saga_resume_line, thread_words

# --- lab 13: the saga: charge, reserve, and a refund when the reservation is refused ---------
#
#     START -> charge -> reserve -> END             (reserved)
#                               \-> refund -> END   (refused: the compensation)
#
# LangGraph 1.2.24 has no saga or compensation feature: the compensation is a node like any
# other, chosen by a conditional edge. Each of the three requests is an effect, declared once
# (CHARGE, RESERVATION, REFUND below) and performed through the ledger, as the core's
# create_ticket performs TICKET: the intent is committed before the request leaves and the
# answer kept as a receipt. A node that runs again finds the receipt and sends nothing; one
# killed between the receiver's answer and the receipt (--crash-at after-send) finds only the
# intent, and asks the receiver by key. --mode naive sends the refund without a key and records
# nothing (the lesson's variant), so a crash after the refund's answer refunds twice on resume.

SAGA_ACKS = ("after-charge-ack", "after-reserve-ack", "after-refund-ack")  # in the nodes
SAGA_POINTS = ("after-send", *SAGA_ACKS)  # --crash-at; after-send: each effect's window
SAGA_MODES = ("naive", "safe")  # the refund without a key (nor the ledger), or by op:refund
MAX_SEATS = 1000  # seats in one reservation: labs/receiver.py's MAX_SEATS


class SagaState(TypedDict):
    operation_id: str
    title: str
    seats: int
    mode: str
    ticket_id: NotRequired[int]
    reservation_id: NotRequired[int]
    refused: NotRequired[str]
    refund_id: NotRequired[int]


def saga_key(state, direction):
    """One key per step and direction: a refund is not a replay of the charge it undoes."""
    return f"{state['operation_id']}:{direction}"


def charge_for_booking(state: SagaState, runtime):
    """The first effect: a ticket stands for the charge."""
    key = saga_key(state, "charge")
    done = perform_in_run(CHARGE, runtime, key, {"title": state["title"]})
    emit_effect_outcome("charged", done, key, ticket_id=done.answer["ticket_id"])
    fail("after-charge-ack")
    return {"ticket_id": done.answer["ticket_id"]}


def reserve(state: SagaState, runtime):
    """The step that can be refused: a 409 "no_capacity" (no seats left) reserved nothing, so it
    is an outcome, not a failure: the run goes on to undo the charge. The ledger records it as
    failed, and answers every later attempt with that refusal. A "key_conflict" is no outcome:
    a reservation exists under this key (for another body), and refunding its charge would undo
    a booking that stands. The run stops there, exit 1; so it does when this ledger holds the
    key for another reservation (an earlier saga with this --operation)."""
    key = saga_key(state, "reserve")
    request = {"ticket_id": state["ticket_id"], "seats": state["seats"]}
    try:
        done = perform_in_run(RESERVATION, runtime, key, request)
    except effects.Refused as refused:
        code = refused.refusal.get("code")
        if code == "key_conflict":  # a protocol error, not a business refusal
            raise not_refunded(state, "refused 409 key_conflict: the receiver holds") from None
        if code != "no_capacity":
            raise
        # Effect.perform raises Refused from the receiver's answer when it sent the request,
        # and from the ledger's record (no cause) when an earlier attempt was refused.
        how = {} if refused.__cause__ else {"how": "receipt", "key": key}
        emit("refused", error=refused.refusal["error"], **how)
        return {"refused": refused.refusal["error"]}
    except effects.Conflict:
        raise not_refunded(state, "not sent: the ledger holds") from None
    emit_effect_outcome("reserved", done, key, reservation_id=done.answer["reservation_id"])
    fail("after-reserve-ack")
    return {"reservation_id": done.answer["reservation_id"]}


def refund(state: SagaState, runtime):
    """The compensation, an effect like any other. Naive sends it without a key and records
    nothing, so a resumed run refunds again; safe keys it by the operation and the direction
    (op:refund) and performs it through the ledger."""
    request = {"ticket_id": state["ticket_id"]}
    if state["mode"] == "naive":  # the lesson's variant: no key, no ledger
        answer = runtime.context.client.call("/refunds", request)
        emit("refunded", created=answer["created"], refund_id=answer["refund_id"])
    else:
        key = saga_key(state, "refund")
        done = perform_in_run(REFUND, runtime, key, request)
        emit_effect_outcome("refunded", done, key, refund_id=done.answer["refund_id"])
        answer = done.answer
    fail("after-refund-ack")
    return {"refund_id": answer["refund_id"]}


# The saga's effects, declared once each: what is sent, how the receiver is asked what a key
# made (GET ...?key=), the id in the receipt, and which answers are a "no" (a 4xx: the receiver
# made nothing). The charge is a ticket, so it is the core's TICKET under its own name.
CHARGE = dataclasses.replace(workflow.ticket, name="charge")


def receiver_effect(name, path):
    """An effect on one of the receiver's keyed POST routes, looked up by GET path?key=."""
    return effects.Effect(  # keyed, its settle time and its refusals: workflow.API's
        name,  # (reservations: no_capacity, the saga's outcome; a key used for another body)
        provider=workflow.API,
        send=lambda client, request, key: client.call(path, request, key),
        lookup=lambda client, key: looked_up(client, path.strip("/"), key),
        external_id=lambda answer: answer[f"{name}_id"],
        answer_of=lambda made_id: {f"{name}_id": int(made_id), "created": False},
        look_with=f"GET {path}?key={{key}} on API_URL",
    )


RESERVATION = receiver_effect("reservation", "/reservations")
REFUND = receiver_effect("refund", "/refunds")


def build_saga(checkpointer):
    """The saga's graph: the refund runs only when the reservation was refused."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(SagaState, context_schema=workflow.Context)
    builder.add_node("charge", charge_for_booking)
    builder.add_node("reserve", reserve)
    builder.add_node("refund", refund)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "reserve")
    builder.add_conditional_edges(
        "reserve", lambda state: "refund" if "refused" in state else END, ["refund", END]
    )
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=checkpointer)


def perform_in_run(effect, runtime, key, request):
    """effect performed through the run's ledger: its Outcome (effects.py)."""
    return effect.perform(runtime.context.ledger, key, request, runtime.context.client)


def looked_up(client, table, key):
    """What the receiver made under key (GET /TABLE?key=), as a replay answers it, or None."""
    found = client.call(f"/{table}?" + urllib.parse.urlencode({"key": key}))[table]
    noun = table.removesuffix("s")
    return {f"{noun}_id": found[0][f"{noun}_id"], "created": False} if found else None


def not_refunded(state, why):
    """The line of a reservation key used for another body: the run stops, nothing refunded."""
    return UserError(
        f"reservation {why} the key {saga_key(state, 'reserve')} for another reservation (an "
        f"earlier saga with this --operation?), so ticket {state['ticket_id']} is not refunded; "
        f"look at that saga's state ({command('saga state --thread ITS-THREAD')})",
        exitcodes.EXIT_HTTP_ERROR,
    )


def saga_start(args, settings):
    first = {"operation_id": args.operation, "title": args.title, "seats": args.seats}
    return saga_run(args, settings, {**first, "mode": args.mode})


def saga_resume(args, settings):
    return saga_run(args, settings, None)


def saga_run(args, settings, graph_input):
    with lesson_run(args, settings) as (saver, ledger):
        graph = build_saga(saver)
        hint = saga_exists_hint(saver.get_tuple(checkpoints.thread_config(args.thread)))
        snapshot = checkpoints.require_thread(graph, args.thread, graph_input is not None, hint)
        if graph_input is None and "seats" not in snapshot.values:
            raise UserError(
                f"thread {args.thread!r} is not a saga; resume it without saga: "
                f"{command(thread_words('resume', args.thread))}",
                EXIT_THREAD,
            )
        final = workflow.run_graph(graph, graph_input, args.thread, settings.client(), ledger)
    return run_ended(final)


def saga_exists_hint(saved):
    """What to do about a saga start on a thread that exists: the saga's own way on, or none."""
    resume_line = saga_resume_line(saved) if saved and is_saga(saved) else "it is no saga"
    return resume_line + "; or pick a new --thread; or " + RESET_HINT


def saga_state(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_saga(saver).get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if "seats" not in snapshot.values:  # a ticket thread: the saga's graph would misread it
        raise UserError(
            f"thread {args.thread!r} is not a saga; "
            f"{command(thread_words('state', args.thread))} (without saga)",
            EXIT_THREAD,
        )
    emit("state", values=snapshot.values, next=list(snapshot.next))


def saga_refunds(args, settings):
    emit("refunds", refunds=settings.client().call("/refunds")["refunds"])


def seats(text):
    """--seats: what the receiver accepts (1-1000), checked before the charge is made."""
    import argparse

    if not text.isdecimal() or not 1 <= int(text) <= MAX_SEATS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_SEATS}")
    return int(text)


def add_saga_parser(actions):
    saga = actions.add_parser("saga", help="lab 13: charge, reserve, refund when refused")
    steps = saga.add_subparsers(dest="saga_action", required=True, parser_class=commandline.Parser)
    thread = dict(
        default=commandline.Defaulted("saga"), help="checkpoint thread id (default: saga)"
    )
    for name, action in [("start", saga_start), ("resume", saga_resume)]:
        sub = steps.add_parser(name, help=f"{name} a saga")
        sub.set_defaults(run=action, graph_command=True, resume="saga resume")
        sub.add_argument("--thread", **thread)
        sub.add_argument("--crash-at", choices=SAGA_POINTS, help="where the run dies (SIGKILL)")
    start = steps.choices["start"]
    start.add_argument("--operation", default="case-013:book:v1", help="operation id (keys)")
    start.add_argument("--title", default="Charge for case-013", help="the charge's ticket title")
    start.add_argument("--seats", type=seats, default=2, help="seats to reserve (10 in all)")
    start.add_argument("--mode", choices=SAGA_MODES, default="safe", help="the refund's key")
    sub = steps.add_parser("state", help="show a saga's checkpoint")
    sub.set_defaults(run=saga_state)
    sub.add_argument("--thread", **thread)
    steps.add_parser("refunds", help="list the receiver's refunds").set_defaults(run=saga_refunds)


# --- the drill's adapter (effectdrill looks these up by name) --------------------------------


def graph():
    """The saga's graph, without a checkpointer: the drill gives it its own."""
    return build_saga(None)


def context():
    """The receiver's client and a ledger of the drill's own: labs/graphs/ticket.py's."""
    from labs.graphs import ticket

    return ticket.context()


def observe(thread):
    client = workflow.Settings.from_environ(os.environ).client()
    with contextlib.redirect_stdout(io.StringIO()):  # the client prints nothing; be sure
        charges = {t["ticket_id"] for t in client.tickets() if t["payload"]["title"] == thread}
        refunds = client.call("/refunds")["refunds"]
    return {"charge": len(charges), "refund": sum(r["ticket_id"] in charges for r in refunds)}
