"""Lab 13: the saga. `saga start|resume|state|refunds|releases`: charge, reserve seats, book
the shipment; when a step is refused, the steps that completed are undone in reverse order
(release the seats, then refund the charge), each undo an effect through the ledger under a key
derived from what its step made. --mode naive sends the undos without a key.

The drill's adapter (graph, context, observe, at the end) runs the same graph:

    python -m effectdrill labs.saga:graph --context labs.saga:context \
        --input '{"operation_id": "{thread}", "title": "{thread}", "seats": 2, "ship_to": "AQ",
        "mode": "naive"}' --observe labs.saga:observe

No carrier ships to AQ (labs/saga_store.py's CARRIERS), so every run's shipment is refused, its
seats released and its charge refunded. observe(thread) counts the charges (tickets whose title
is the thread id), their reservations, the releases of those and the refunds of the charges. The
forward steps go through the ledger of context() (labs/graphs/ticket.py's: a temporary file of
the drill's own) in both modes. With "mode": "naive" the run releases twice, or refunds twice,
where the drill kills it after that undo's answer and before its result is saved; with "safe"
each happens once everywhere.
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
from labs.threads import (
    RESET_HINT,
    is_saga,
    lesson_run,
    own_command,
    run_ended,
    saga_resume_line,
    thread_words,
)

# --- lab 13: the saga: three steps forward, the completed ones undone backward -----------------
#
#     START -> charge -> reserve -> ship -> END                (shipped)
#                           |         \-> release -> refund -> END   (no carrier: undo both)
#                           \-> refund -> END                    (no seats: undo the charge)
#
# LangGraph 1.2.24 has no saga or compensation feature: each undo is a node like any other,
# chosen by a conditional edge (undo_next). Each request is an effect performed through the
# ledger: the intent committed before the request leaves, the answer kept as a receipt. A node
# that runs again finds the receipt and sends nothing; one killed between the receiver's answer
# and the receipt (--crash-at after-send) finds only the intent, and asks the receiver by key.
# --mode naive sends the undos without a key and records nothing (the lesson's variant), so a
# crash after an undo's answer undoes twice on resume.

SAGA_ACKS = tuple(
    f"after-{name}-ack" for name in ("charge", "reserve", "ship", "release", "refund")
)  # in the nodes: each effect's answer in (and its receipt kept), the node not returned
SAGA_POINTS = ("after-send", *SAGA_ACKS)  # --crash-at; after-send: each effect's window
SAGA_MODES = ("naive", "safe")  # the undos without a key (nor the ledger), or keyed
MAX_SEATS = 1000  # seats in one reservation: labs/saga_store.py's MAX_SEATS
SHIP_TO = "FR"  # where the shipment goes unless --ship-to says (AQ: no carrier ships there)


class SagaState(TypedDict):
    operation_id: str
    title: str
    seats: int
    mode: str
    ship_to: NotRequired[str]
    ticket_id: NotRequired[int]
    reservation_id: NotRequired[int]
    shipment_id: NotRequired[int]
    refused: NotRequired[str]
    release_id: NotRequired[int]
    refund_id: NotRequired[int]


# --- the effects, each undo declared beside the step it undoes ---------------------------------


def on_receiver(table):
    """@effects.effect's arguments for a keyed POST /TABLE of the receiver: the id in its answer,
    its lookup by key (GET /TABLE?key=), and what a person's id stands for (reconcile)."""
    made = f"{table.removesuffix('s')}_id"
    return dict(
        external_id=made,
        lookup=lambda client, key: looked_up(client, table, key),
        answer_of=lambda made_id: {made: int(made_id), "created": False},
        look_with=f"GET /{table}?key={{key}} on API_URL",
    )


CHARGE = dataclasses.replace(workflow.ticket, name="charge")  # a ticket stands for the charge


@effects.effect(workflow.API, name="refund", **on_receiver("refunds"))
def refund_charge(client, request, key):  # undoes CHARGE: {"ticket_id": N}
    return client.call("/refunds", request, key)


@effects.effect(workflow.API, name="reservation", **on_receiver("reservations"))
def reserve_seats(client, request, key):  # {"ticket_id": N, "seats": S}; 409 no_capacity
    return client.call("/reservations", request, key)


@effects.effect(workflow.API, name="release", **on_receiver("releases"))
def release_seats(client, request, key):  # undoes reserve_seats: {"reservation_id": N}
    return client.call("/releases", request, key)


@effects.effect(workflow.API, name="shipment", **on_receiver("shipments"))
def book_shipment(client, request, key):  # {"reservation_id": N, "country": C}; 409 no_carrier
    return client.call("/shipments", request, key)


@dataclasses.dataclass(frozen=True)
class SagaStep:
    """A forward step and, beside it, its undo: the effect that compensates what it made.

    made: the state field of the id the step's effect made (the receiver's); undo: the effect
    that compensates it, sent {made: id}, under a key derived from that id, so each thing made
    is undone once (None: the last step, which nothing after it can refuse)."""

    node: str
    effect: effects.Effect
    made: str
    undo: effects.Effect | None = None
    refusal: str | None = None  # the provider's "no" (its code) that the saga compensates

    @property
    def undone(self):
        return f"{self.undo.name}_id"

    def undo_key(self, state):
        """OPERATION:refund:ticket-3: the undo's own key, from the forward step's result."""
        made = f"{self.made.removesuffix('_id')}-{state[self.made]}"
        return f"{state['operation_id']}:{self.undo.name}:{made}"


STEPS = (  # in the order they run forward; undone in the reverse order
    SagaStep("charge", CHARGE, "ticket_id", undo=refund_charge),
    SagaStep("reserve", reserve_seats, "reservation_id", undo=release_seats, refusal="no_capacity"),
    SagaStep("ship", book_shipment, "shipment_id", refusal="no_carrier"),
)
EVENTS = {"charge": "charged", "reserve": "reserved", "ship": "shipped"}
UNDONE = {"refund": "refunded", "release": "released"}


def saga_key(state, direction):
    """One key per step: OPERATION:charge, OPERATION:reserve, OPERATION:ship."""
    return f"{state['operation_id']}:{direction}"


def forward(step, request_of):
    """The node that performs step: its result, or, for the refusal it names (a 409 the receiver
    answers with that code: it made nothing), {"refused": why}, which turns the saga back. The
    ledger records the refusal as failed, and answers every later attempt with it. A
    "key_conflict" is no outcome: something stands under this key (for another body), and
    undoing the earlier steps would undo a booking that stands. The run stops there, exit 1; so
    it does when this ledger holds the key for another request (an earlier saga with this
    --operation)."""

    def node(state: SagaState, runtime):
        key = saga_key(state, step.node)
        try:
            done = perform_in_run(step.effect, runtime, key, request_of(state))
        except effects.Refused as refused:
            code = refused.refusal.get("code")
            if step.refusal and code == "key_conflict":  # a protocol error, not a refusal
                raise not_undone(
                    state, step, "refused 409 key_conflict: the receiver holds", runtime
                ) from None
            if code != step.refusal or step.refusal is None:
                raise
            # Effect.perform raises Refused from the receiver's answer when it sent the request,
            # and from the ledger's record (no cause) when an earlier attempt was refused.
            how = {} if refused.__cause__ else {"how": "receipt", "key": key}
            emit("refused", error=refused.refusal["error"], **how)
            return {"refused": refused.refusal["error"]}
        except effects.Conflict:
            if step.refusal is None:
                raise
            raise not_undone(state, step, "not sent: the ledger holds", runtime) from None
        made = done.answer[step.made]
        emit_effect_outcome(EVENTS[step.node], done, key, **{step.made: made})
        fail(f"after-{step.node}-ack")
        return {step.made: made}

    node.__name__ = step.node
    return node


def compensation(step):
    """The node that undoes step, an effect like any other. Naive sends it without a key and
    records nothing, so a resumed run undoes again; safe performs it through the ledger, keyed by
    what step made (SagaStep.undo_key)."""

    def node(state: SagaState, runtime):
        request = {step.made: state[step.made]}
        if state["mode"] == "naive":  # the lesson's variant: no key, no ledger
            answer = step.undo.send(runtime.context.client, request, None)
            emit(
                UNDONE[step.undo.name],
                created=answer["created"],
                **{step.undone: answer[step.undone]},
            )
        else:
            key = step.undo_key(state)
            done = perform_in_run(step.undo, runtime, key, request)
            answer = done.answer
            emit_effect_outcome(
                UNDONE[step.undo.name], done, key, **{step.undone: answer[step.undone]}
            )
        fail(f"after-{step.undo.name}-ack")
        return {step.undone: answer[step.undone]}

    node.__name__ = step.undo.name
    return node


def undo_next(state):
    """After a refusal, the undo of the last step that completed and is not undone yet (the
    reverse order), then END; None while nothing was refused. A step refused, or never sent,
    made nothing: it has no id in the state, and nothing undoes it."""
    from langgraph.graph import END

    if "refused" not in state:
        return None
    for step in reversed(STEPS):
        if step.undo and step.made in state and step.undone not in state:
            return step.undo.name
    return END


def build_saga(checkpointer):
    """The saga's graph: forward while nothing is refused, then backward through the undos."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(SagaState, context_schema=workflow.Context)
    charge, reserve, ship = STEPS
    builder.add_node(forward(charge, lambda s: {"title": s["title"]}))
    builder.add_node(forward(reserve, lambda s: {"ticket_id": s["ticket_id"], "seats": s["seats"]}))
    builder.add_node(
        forward(
            ship,
            lambda s: {"reservation_id": s["reservation_id"], "country": s.get("ship_to", SHIP_TO)},
        )
    )
    undos = [step.undo.name for step in STEPS if step.undo]
    for step in STEPS:
        if step.undo:
            builder.add_node(compensation(step))
            builder.add_conditional_edges(step.undo.name, undo_next, [*undos, END])
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "reserve")
    builder.add_conditional_edges(
        "reserve", lambda s: undo_next(s) or "ship", ["ship", *undos, END]
    )
    builder.add_conditional_edges("ship", lambda s: undo_next(s) or END, [*undos, END])
    return builder.compile(checkpointer=checkpointer)


def perform_in_run(effect, runtime, key, request):
    """effect performed through the run's ledger, its row naming the run's thread: its Outcome
    (effects.py)."""
    context = runtime.context
    return effect.perform(context.ledger, key, request, context.client, this_thread())


def this_thread():
    """The thread of the saga whose node is running (LangGraph's config of the running node)."""
    from langgraph.config import get_config

    return get_config()["configurable"]["thread_id"]


def looked_up(client, table, key):
    """What the receiver made under key (GET /TABLE?key=), as a replay answers it, or None."""
    found = client.call(f"/{table}?" + urllib.parse.urlencode({"key": key}))[table]
    made = f"{table.removesuffix('s')}_id"
    return {made: found[0][made], "created": False} if found else None


def not_undone(state, step, why, runtime):
    """The line of a step's key used for another body: the run stops, nothing undone. It names
    the saga that holds the key where the run's ledger row says (its thread); a row of this
    run's own (the receiver's 409 to a ledger that did not know the key) names none."""
    noun, key = step.effect.name, saga_key(state, step.node)
    kept = [f"ticket {state['ticket_id']} is not refunded"]
    if "reservation_id" in state:
        kept.append(f"reservation {state['reservation_id']} is not released")
    row = runtime.context.ledger.row(key)
    holder = row["thread"] if row is not None else None
    if holder and holder != this_thread():
        look = f"look at that saga's state ({command(thread_words('saga state', holder))})"
    else:  # made through another CHECKPOINT_DB's ledger, or before rows named their thread
        look = "this ledger does not name that saga's thread"
    return UserError(
        f"{noun} {why} the key {key} for another {noun} (an earlier saga with this "
        f"--operation?), so {' and '.join(kept)}; {look}",
        exitcodes.EXIT_HTTP_ERROR,
    )


def saga_start(args, settings):
    first = {"operation_id": args.operation, "title": args.title, "seats": args.seats}
    first["ship_to"] = args.ship_to
    return saga_run(args, settings, {**first, "mode": args.mode})


def saga_resume(args, settings):
    return saga_run(args, settings, None)


def saga_run(args, settings, graph_input):
    with lesson_run(args, settings) as (saver, ledger):
        graph = build_saga(saver)
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        snapshot = checkpoints.require_thread(
            graph, args.thread, graph_input is not None, saga_exists_hint(head)
        )
        if graph_input is None and "seats" not in snapshot.values:
            saved = head.checkpoint["channel_values"]  # whole: the saga's graph reads its own
            raise UserError(
                f"thread {args.thread!r} is not a saga; its own resume: "
                f"{own_command(saved, 'resume', args.thread)}",
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
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if "seats" not in snapshot.values:  # another lesson's: the saga's graph would misread it
        saved = head.checkpoint["channel_values"]  # whole: the saga's graph reads its own
        raise UserError(
            f"thread {args.thread!r} is not a saga; "
            f"{own_command(saved, 'state', args.thread)} shows it",
            EXIT_THREAD,
        )
    emit("state", values=snapshot.values, next=list(snapshot.next))


def saga_refunds(args, settings):
    emit("refunds", refunds=settings.client().call("/refunds")["refunds"])


def saga_releases(args, settings):
    emit("releases", **settings.client().call("/releases"))


def country(text):
    """--ship-to: a two-letter country code, as the receiver takes it."""
    import argparse

    if not (len(text) == 2 and text.isascii() and text.isalpha()):
        raise argparse.ArgumentTypeError("must be a two-letter country code, e.g. FR")
    return text.upper()


def seats(text):
    """--seats: what the receiver accepts (1-1000), checked before the charge is made."""
    import argparse

    if not text.isdecimal() or not 1 <= int(text) <= MAX_SEATS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_SEATS}")
    return int(text)


def add_saga_parser(actions):
    saga = actions.add_parser("saga", help="lab 13: charge, reserve, ship; undo when refused")
    steps = saga.add_subparsers(  # metavar: a missing one is "action", as labs' own is
        dest="saga_action", metavar="action", required=True, parser_class=commandline.Parser
    )
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
    start.add_argument(
        "--ship-to", type=country, default=SHIP_TO, help="country (AQ: no carrier ships there)"
    )
    start.add_argument("--mode", choices=SAGA_MODES, default="safe", help="the undos' keys")
    sub = steps.add_parser("state", help="show a saga's checkpoint")
    sub.set_defaults(run=saga_state)
    sub.add_argument("--thread", **thread)
    steps.add_parser("refunds", help="list the receiver's refunds").set_defaults(run=saga_refunds)
    listed = steps.add_parser("releases", help="list the receiver's releases and seats left")
    listed.set_defaults(run=saga_releases)


# --- the drill's adapter (effectdrill looks these up by name) --------------------------------


def graph():
    """The saga's graph, without a checkpointer: the drill gives it its own."""
    return build_saga(None)


def context():
    """The receiver's client and a ledger of the drill's own: labs/graphs/ticket.py's."""
    from labs.graphs import ticket

    return ticket.context()


def observe(thread):
    """What the receiver made for thread's run: its charges, their reservations, the releases of
    those and the refunds of the charges."""
    client = workflow.Settings.from_environ(os.environ).client()
    with contextlib.redirect_stdout(io.StringIO()):  # the client prints nothing; be sure
        charges = {t["ticket_id"] for t in client.tickets() if t["payload"]["title"] == thread}
        seats = {
            r["reservation_id"]
            for r in client.call("/reservations")["reservations"]
            if r["ticket_id"] in charges
        }
        releases = client.call("/releases")["releases"]
        refunds = client.call("/refunds")["refunds"]
    return {
        "charge": len(charges),
        "reservation": len(seats),
        "release": sum(r["reservation_id"] in seats for r in releases),
        "refund": sum(r["ticket_id"] in charges for r in refunds),
    }
