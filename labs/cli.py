"""The lab's workflow: workflow.py's graph and CLI, plus the switches the lessons use.

compose.yaml's `workflow` service runs this file; natively it is `python -m labs ARGS`. Every
command of workflow.py works here unchanged. The switches are of two kinds:

Failpoints (failpoints.py) turned on for one run, at the points the core marks with fail(...):
    --crash-at POINT  kill the process there (SIGKILL, exit 137): after-prepare, before-request,
                      after-ack, after-checkpoint (workflow.py), step-boundary (below)
    --crash           same as --crash-at after-ack: inside the crash window
    --term-at POINT   SIGTERM there, as a deploy sends it (lab 09): the run drains
    --crash-at lost-ack  not a kill: the request carries a Failpoint-Token, and a receiver run with
                      FAILPOINTS=before-answer=drop-answer commits the ticket and drops its answer,
                      once per token (lab 06)
Variants, built here from the core's nodes (the core's State and build_graph know none of them):
    --mode naive      no key: every attempt is a new ticket
    --mode safe       the key from the run's input (the default; the core's only way)
    --mode node-uuid  a fresh key minted inside the node: looks keyed, still duplicates on resume
    --approval [in-node|own-node], approve [--reject]  ask a human after the ticket (the ask:
                      a ticket keyed OPERATION:approval, through the ledger in every mode) and
                      wait, inside the effect's node or in a node of its own (lab 07)
    --durability      LangGraph's durability mode: sync (the core's), async, exit (lab 04)
    step-boundary     a SqliteSaver that dies as create_ticket's result is about to be saved
                      (lab 08)
    LAB_GRAPH_VERSION the deployed graph (lab 12): 1 (the default), or 2, where create_ticket is
                      renamed open_ticket; `migrate` moves a thread saved by 1 to 2 (RENAMES)
    --no-contract     resume without checking the thread's contract, as LangGraph alone does
    --notify          a message about the ticket after it, to a provider that takes no key (lab
                      15): see the message section below; `messages` lists what it holds
    --pay             a payment after the ticket, to a provider that takes no key, looks up by
                      reference and commits late (lab 15): see the payment section below;
                      `payments` lists what it holds
    --mode lookup-resend  the payment as the ledger made it before its settle rule: a lookup
                      that finds nothing is taken as proof, and the request goes again
    --retry-after-ack timeout|parse  start with a LangGraph RetryPolicy on the effect's node, and
                      a line after the answer that fails once: LangGraph runs the node again in
                      the same process (lab 17; see the section below)
Lab 18's `hooks`: the workflow's endpoint for the receiver's webhooks (see its section below),
    signed ones only (WEBHOOK_SECRET, the lab's own unless set, as labs/receiver.py's; several
    secrets,
    space-separated, while one replaces another: it accepts any):
    --mode naive applies every delivery; inbox (the default) applies each event once
    (labs/inbox.py);
    --move STATUS,... moves --ticket through them; --crash-at after-inbox kills it after its
    commit, before its answer
The saga (lab 13), a graph of its own: `saga start|resume|state|refunds`, see add_saga_parser:
    charge, reserve, and a refund when the reservation is refused, each through the ledger;
    --mode naive sends the refund without a key and records nothing, safe performs it keyed
    OPERATION:refund; --crash-at after-charge-ack, after-reserve-ack or after-refund-ack kills
    the run once the receipt is kept, after-send before it (the window of whichever effect sends
    first)
The outbox (lab 19), a graph of its own: `outbox start|resume|state`, see add_outbox_parser:
    request_ticket writes the ticket as a message into the outbox (labs/relay.py) and sends nothing;
    --crash-at before-outbox or after-outbox kills the run around that write; `python -m labs.relay`
    delivers it
"""

import dataclasses
import hashlib
import hmac
import json
import os
import pathlib
import re
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import uuid
from typing import NotRequired, TypedDict

import checkpoints
import commandline
import effects
import exitcodes
import failpoints
import httpguard
import providers
import workflow
from exitcodes import EXIT_THREAD, EXIT_USAGE, UserError, emit
from failpoints import fail
from httpguard import DEFAULT_WEBHOOK_SECRET as LAB_SECRET
from labs import inbox, relay

MODES = ("naive", "safe", "node-uuid", "ledger")  # ledger: the core's; the others, lessons
PAYMENT_MODES = ("lookup-resend",)  # lab 15: the ticket as in ledger, the payment without settle_s
CRASH_POINTS = (
    "after-prepare",
    "before-request",
    "after-send",
    "lost-ack",
    "after-ack",
    "step-boundary",
    "after-checkpoint",
)
TERM_POINTS = ("after-prepare", "after-ack")  # where --term-at sends SIGTERM (lab 09)
APPROVAL_SHAPES = ("in-node", "own-node")  # where --approval waits for a human (lab 07)
DURABILITIES = ("sync", "async", "exit")
POINTS = (*workflow.POINTS, "step-boundary")
FAILPOINT_TOKEN = "Failpoint-Token"  # labs/receiver.py's before-answer point fires once per token
EFFECT_NODE = {"1": "create_ticket", "2": "open_ticket"}  # LAB_GRAPH_VERSION: the effect's name
RENAMES = {"2": {"create_ticket": "open_ticket"}}  # what migrate maps a saved next through
LAB_TABLES = {**inbox.COLUMNS, **relay.COLUMNS}  # beside the checkpoints: the core knows none


class State(workflow.State):
    mode: NotRequired[str]
    approval: NotRequired[str]
    approved: NotRequired[bool]
    notify: NotRequired[bool]  # --notify: the message section below
    message_id: NotRequired[int | None]
    pay: NotRequired[bool]  # --pay: the payment section below
    payment_id: NotRequired[int | None]


def create_ticket(state: State, runtime):
    """The core's create_ticket (--mode ledger), or a lesson's: the request sent with the key
    --mode picks (none, the run's, a fresh one) and nothing recorded before it leaves."""
    if state["mode"] in ("ledger", *PAYMENT_MODES):  # the ticket as the core makes it
        return workflow.create_ticket(state)
    key = {"naive": None, "safe": state["key"], "node-uuid": str(uuid.uuid4())}[state["mode"]]
    client = runtime.context.client
    fail("before-request")
    try:
        result = client.create(state["title"], key)
    except exitcodes.NoAnswer as error:
        # Sent, and no answer: committed or not, nobody here can tell (lab 06). A refused
        # connection or a 503 is not NoAnswer: nothing was committed, and the client tried again.
        emit("effect_unknown", error=str(error.__cause__ or error))
        if key is None:  # a request without a key cannot be looked up: the outcome stays unknown
            raise
        result = reconcile_by_key(client, state["title"], key)
    emit("effect_ack", created=result["created"], ticket_id=result["ticket_id"])
    # The receiver has committed the ticket and this node has not returned, so its result is
    # not saved yet: a process that dies here is the crash window.
    fail("after-ack")
    return {"ticket_id": result["ticket_id"]}


def reconcile_by_key(client, title, key):
    """Settle an unknown outcome: adopt the ticket the key already made, or send again."""
    found = client.tickets(key)
    emit("reconcile", found=[t["ticket_id"] for t in found], key=key)
    for ticket in found:
        if ticket["payload"] == {"title": title}:  # this very request: adopt it
            return {"ticket_id": ticket["ticket_id"], "created": False}
    # Nothing, or the key made something else: send again with the same key and let the
    # receiver decide (create it, or refuse a reused key with 409).
    return client.create(title, key)


def create_ticket_then_ask(state: State, runtime):
    """Lab 07's trap: the node waits for a human after its effect, so the answer re-runs it."""
    result = create_ticket(state, runtime)
    return {**result, "approved": ask_approval(state, runtime, result["ticket_id"])}


def approval_node(state: State, runtime):
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
    said("approval_requested", done, key, request_id=done.answer["ticket_id"])
    approved = interrupt({"ticket_id": ticket_id})
    emit("approval", approved=approved)
    return approved


def said(event, done, key, **values):
    """An effect's line, as workflow.create_ticket says it: the receiver's answer (created) when
    the request was sent; else how it was answered without a request (how: receipt, the
    ledger's; adopted, what the receiver holds under the key), and the key."""
    if done.how == "sent":
        emit(event, created=done.answer["created"], **values)
    else:
        emit(event, how=done.how, key=key, **values)


# The ask for approval, declared once: a ticket on the receiver, under a name of its own.
APPROVAL = dataclasses.replace(workflow.ticket, name="approval")
MAX_TITLE = 200  # characters in a ticket's title: labs/receiver.py's MAX_TITLE_CHARS


def build_graph(
    checkpointer, approval=None, version="1", notify=False, retry_after_ack=None, pay=False
):
    """The lab's graph: the core's prepare, create_ticket keyed by --mode, and the approval;
    version 2 names create_ticket open_ticket, as a refactoring deploy would; notify: the
    message about the ticket, last (lab 15); retry_after_ack: lab 17's failure after the
    answer, under a RetryPolicy (failing_once_after)."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(State, context_schema=workflow.Context)
    builder.add_node("prepare", workflow.prepare)
    effect, name = (
        create_ticket_then_ask if approval == "in-node" else create_ticket,
        EFFECT_NODE[version],
    )
    effect, retry = failing_once_after(effect, retry_after_ack)  # (effect, None) when off
    builder.add_node(name, effect, retry_policy=retry)
    builder.add_edge(START, "prepare")
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


def step_boundary_saver():
    """A SqliteSaver that passes failpoint step-boundary as create_ticket's result is about to
    be saved (lab 08): with it set to kill, the node has returned and its result is on no disk.

    LangGraph 1.2.24 saves a finished node with two background writes that have no order between
    them (langgraph#8039): the node's writes (put_writes) and the next checkpoint (put). Whichever
    comes first with the ticket_id passes the point; the other waits behind it for the kill.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    dying = threading.Lock()

    def step_boundary():
        with dying:
            fail("step-boundary")

    class StepBoundarySaver(SqliteSaver):
        def put_writes(self, config, writes, task_id, task_path=""):
            if any(channel == "ticket_id" for channel, _ in writes):
                step_boundary()
            return super().put_writes(config, writes, task_id, task_path)

        def put(self, config, checkpoint, metadata, new_versions):
            if "ticket_id" in checkpoint["channel_values"]:
                step_boundary()
            return super().put(config, checkpoint, metadata, new_versions)

    return StepBoundarySaver


# --- lab 15: a message about the ticket, to a provider that takes no key (--notify) ----------
#
#     ... -> create_ticket [-> approval] -> notify -> END
#
# The receiver's POST /messages stands in for an email or SMS service: every request is one more
# message, it reads no Idempotency-Key, and nothing can be asked about a key afterwards. The
# message goes through the ledger like the ticket: its intent is committed before the request
# leaves, its receipt once the answer is back. A kill between the two (--crash-at after-send on
# the run that sends it) leaves the intent alone, and the next attempt cannot look it up: the
# ledger marks it unknown and the run stops (exit 6) instead of sending it again. A person looks
# (`messages`) and settles it: reconcile --confirmed KEY (resume sends nothing) or --not-sent KEY
# (resume sends it, once).

MESSAGE_TO = "oncall@example.com"

MESSAGE = effects.Effect(
    "message",
    send=lambda client, request, key: client.call("/messages", request),  # no key: none is read
    external_id=lambda answer: answer["message_id"],
    lookup=None,  # GET /messages lists them; no key finds one
    not_sent=providers.did_nothing,
    refused=providers.refusal,
    settle_s=workflow.RECEIVER_SETTLE_S,  # a person's word on it waits this long after a send
    answer_of=lambda message_id: {"message_id": int(message_id)},  # reconcile --confirmed KEY=ID
    look_with=(
        "python -m labs messages"
        " (Docker: docker compose -p stateful-lab run --rm workflow messages)"
    ),
)


def notify(state: State, runtime):
    """Send the message once, through the ledger; its key is the operation's, for the message."""
    key = f"{state['key']}:notify"
    request = {"to": MESSAGE_TO, "text": f"ticket {state['ticket_id']} opened"}
    done = MESSAGE.perform(runtime.context.ledger, key, request, runtime.context.client)
    if done.how == "sent":
        emit("message_sent", key=key, message_id=done.answer["message_id"])
    else:  # the receipt: the provider is not called (settled by a person: no message id)
        emit("effect_receipt", key=key, receipt=done.answer)
    return {"message_id": done.answer.get("message_id")}


def add_notify(builder, after):
    builder.add_node("notify", notify)
    builder.add_edge(after, "notify")
    return "notify"


def messages(args, settings):
    emit("messages", messages=settings.client().call("/messages")["messages"])


def add_message_parser(parser):
    """--notify on start, `messages`, and the lab's effects for reconcile."""
    parser.set_defaults(effects={**parser.get_default("effects"), MESSAGE.name: MESSAGE})
    parser.actions.choices["start"].add_argument(
        "--notify", action="store_true", help="send a message about the ticket after it (lab 15)"
    )
    sub = parser.actions.add_parser("messages", help="list the receiver's messages (lab 15)")
    sub.set_defaults(run=messages)


# --- lab 15: a payment, to a provider that takes no key and commits late (--pay) ------------
#
#     ... -> create_ticket [-> notify] -> pay -> END
#
# The receiver's POST /payments stands in for a card provider: it reads no Idempotency-Key, so
# every request is one more charge, and GET /payments?reference=R is its lookup by our reference
# (the ledger's key). With FAILPOINTS=payment-commit=sleep(S) it commits each charge S seconds
# after it accepted it: a client that gave up sooner has no answer, and a lookup made at once
# finds nothing. PAYMENT declares what the provider promises: it commits within settle_s. The
# ledger takes a lookup that finds nothing as proof only that long after the last send; until
# then the run stops (exit 6) and `reconcile` asks again. --mode lookup-resend is the ledger
# without that rule (as it was before it): nothing found, sent again, a second charge.

PAYMENT_AMOUNT = 1200  # cents, the same for every lab payment
PAYMENT_SETTLE_S = 10.0  # what the provider promises: a charge it accepted is committed by then

PAYMENT = effects.Effect(
    "payment",
    send=lambda client, request, key: client.call("/payments", request),  # no key: none is read
    lookup=lambda client, key: paid(client, key),
    external_id=lambda answer: answer["payment_id"],
    not_sent=providers.did_nothing,
    refused=providers.refusal,
    keyed=False,  # a resend is a second charge
    settle_s=PAYMENT_SETTLE_S,
    answer_of=lambda payment_id: {"payment_id": int(payment_id)},  # reconcile --confirmed KEY=ID
    look_with=(
        "python -m labs payments --reference {key} (Docker: docker compose -p stateful-lab run "
        "--rm workflow payments --reference {key})"
    ),
)


def pay(state: State, runtime):
    """Charge once for the operation, through the ledger; the reference is the ledger's key."""
    key = f"{state['key']}:pay"
    request = {"reference": key, "amount": PAYMENT_AMOUNT}
    effect = PAYMENT
    if state["mode"] == "lookup-resend":  # the lesson's: any empty lookup counts as proof
        effect = dataclasses.replace(PAYMENT, keyed=True)  # which this provider is not
    done = effect.perform(runtime.context.ledger, key, request, runtime.context.client)
    if done.how == "sent":
        emit("payment_sent", key=key, payment_id=done.answer["payment_id"])
    else:  # adopted (found by the lookup) or the receipt (the provider is not called)
        emit(f"effect_{done.how}", key=key, payment_id=done.answer["payment_id"])
    return {"payment_id": done.answer["payment_id"]}


def paid(client, reference):
    """The lookup: the first charge committed under reference, or None (none yet)."""
    query = urllib.parse.urlencode({"reference": reference})
    found = client.call(f"/payments?{query}")["payments"]
    return {"payment_id": found[0]["payment_id"]} if found else None


def add_pay(builder, after):
    builder.add_node("pay", pay)
    builder.add_edge(after, "pay")
    return "pay"


def payments(args, settings):
    query = {"reference": args.reference} if args.reference else {}
    query |= {"settled": "1"} if args.settled else {}
    listed = settings.client().call("/payments?" + urllib.parse.urlencode(query))
    emit("payments", payments=listed["payments"], pending=listed["pending"])


def add_payment_parser(parser):
    """--pay on start, and `payments`."""
    parser.actions.choices["start"].add_argument(
        "--pay", action="store_true", help="charge a payment after the ticket (lab 15)"
    )
    sub = parser.actions.add_parser("payments", help="list the receiver's payments (lab 15)")
    sub.add_argument("--reference", help="only those charged under this reference")
    sub.add_argument(
        "--settled", action="store_true", help="first wait until none is pending (at most 4 s)"
    )
    sub.set_defaults(run=payments)


# --- the CLI: workflow.py's, with the switches ---------------------------------------------


def start(args, settings):
    if args.mode in PAYMENT_MODES and not args.pay:
        raise UserError(f"--mode {args.mode} changes only the payment: add --pay", EXIT_USAGE)
    first = {"operation_id": args.operation, "title": args.title, "mode": args.mode}
    if args.approval:
        first["approval"] = args.approval
    if args.notify:
        first["notify"] = True
    if args.pay:
        first["pay"] = True
    return run(args, settings, first)


def resume(args, settings):
    return run(args, settings, None)


def approve(args, settings):
    from langgraph.types import Command

    if not args.approve:  # a stop below names this answer, not the other one
        args.resume = "approve --reject"
    return run(args, settings, Command(resume=args.approve))


def run(args, settings, graph_input):
    """commandline.start_or_resume with the lab's failpoints, graph and client (LAB below)."""
    if args.crash_at == "step-boundary" and checkpoints.is_postgres(settings.checkpoint_db):
        raise UserError(
            "--crash-at step-boundary needs the SQLite checkpointer (its saver is a SqliteSaver); "
            "unset CHECKPOINT_DB",
            EXIT_USAGE,
        )
    points = {args.crash_at: "kill"} if args.crash_at not in (None, "lost-ack") else {}
    points |= {args.term_at: "term"} if args.term_at else {}
    with failpoints.scoped(points):
        return program_run(args, settings, graph_input)


def state(args, settings):
    version = getattr(args, "graph_version", "1")  # labs/workers.py's state passes its own args
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        if head and is_saga(head):  # read by the ticket graph, its refund would not show
            raise UserError(
                f"thread {args.thread!r} is a saga (lab 13): saga state --thread {args.thread}",
                EXIT_THREAD,
            )
        if head and is_outbox(head):  # lab 19's graph: outbox state reads it
            raise UserError(
                f"thread {args.thread!r} is an outbox run (lab 19): outbox state --thread "
                f"{args.thread}",
                EXIT_THREAD,
            )
        notify = saved(saver, args, "notify")
        pay = saved(saver, args, "pay")
        graph = build_graph(saver, saved(saver, args, "approval"), version, notify, pay=pay)
        snapshot = graph.get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))
    if snapshot.values.get("mode") == "naive" and "key" in snapshot.values:
        print(
            "labs: --mode naive: the key is what prepare computed; create_ticket sends none",
            file=sys.stderr,
        )


# helpers


def graph_for(saver, args, head):
    """The lab's graph for a thread (its saved head, or None): built as the thread was started
    (with its --approval), in the deployed version."""
    values = head.checkpoint["channel_values"] if head else {}
    approval = values.get("approval") if head else getattr(args, "approval", None)
    notify = values.get("notify") if head else getattr(args, "notify", None)
    pay = values.get("pay") if head else getattr(args, "pay", None)
    return build_graph(saver, approval, args.graph_version, notify, args.retry_after_ack, pay)


def client_for(args, settings):
    """The receiver's client; --crash-at lost-ack's, whose request asks to lose its answer."""
    client = settings.client()
    return LostAckClient(client, args.thread) if args.crash_at == "lost-ack" else client


def saver_for(args, settings):
    """The step-boundary saver for runs that may pass that point; SQLite's plain one otherwise."""
    if args.graph_command and not checkpoints.is_postgres(settings.checkpoint_db):
        return step_boundary_saver()
    return None


def saved(saver, args, field):
    """A value the thread was started with (its graph must be built the same way)."""
    return build_graph(saver).get_state(checkpoints.thread_config(args.thread)).values.get(field)


RESET_HINT = (
    "reset the lab: docker compose -p stateful-lab down -v --remove-orphans (natively: make reset)"
)


def exists_hint(saved):
    """What to do about a start of a thread that exists: a naive one sends no key, so its
    resume would repeat a request that may have taken effect."""
    reset = RESET_HINT
    values = saved.checkpoint["channel_values"] if saved else {}
    if values.get("mode") == "naive" and any(c.startswith(BRANCH) for c in values):
        return f"it sends no key (--mode naive), so a resume repeats its request; or {reset}"
    return f"resume it or pick a new --thread; or {reset}"


def owner(saved):
    """The line for a thread that another command runs (a CheckpointTuple), or None: lab 13's
    saga (its values hold seats), or a thread of labs/workers.py, which records no contract."""
    thread = saved.config["configurable"]["thread_id"]
    if is_saga(saved):
        return f"thread {thread!r} is a saga (lab 13): {saga_goes_on(saved)}"
    if is_outbox(saved):
        return f"thread {thread!r} is an outbox run (lab 19): outbox resume --thread {thread}"
    if "contract" not in saved.metadata:
        return (
            f"thread {thread!r} records no contract: labs/workers.py saves its threads so and runs "
            f"them from its queue (lab 10): labs/workers.py state --thread {thread}"
        )
    return None


def is_saga(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 13's: only its state holds seats."""
    return "seats" in saved.checkpoint["channel_values"]


def saga_goes_on(saved):
    """The saga command that goes on from a saved saga thread: a naive one waiting at its refund
    sends that refund without a key, so its resume refunds again if the first went through."""
    thread = saved.config["configurable"]["thread_id"]
    values = saved.checkpoint["channel_values"]
    if values.get("mode") == "naive" and f"{BRANCH}refund" in values:
        return (
            "its refund goes without a key (--mode naive), so saga resume --thread "
            f"{thread} refunds again if the first refund went through: look at saga refunds first"
        )
    return f"saga resume --thread {thread}"


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
            f"thread {args.thread!r} waits for approval; answer with approve (or --reject)",
            EXIT_THREAD,
        )


class LostAckClient(workflow.TicketClient):
    """--crash-at lost-ack: the request names a token, and a receiver whose before-answer
    failpoint is set to drop-answer commits it and hangs up, once per token."""

    def __init__(self, client, token):
        super().__init__(
            client.url, client.timeout_s, client.attempts, {FAILPOINT_TOKEN: token}, client.name
        )
        self.label, self.first = client.label, True  # named as its provider is ("the receiver")

    def create(self, title, key=None):
        first, self.first = self.first, False
        result = super().create(title, key)
        if first:  # an answer came to the request that was to lose it: no fault happened
            print(
                "labs: --crash-at lost-ack: the receiver answered anyway: its FAILPOINTS has no "
                "before-answer=drop-answer (lab 06's up line sets it: docker compose -p "
                "stateful-lab -f compose.yaml -f labs/lost-ack.compose.yaml up -d --build api), "
                "or it already dropped an answer for this thread",
                file=sys.stderr,
            )
        return result


# --- lab 17: the retry LangGraph made for you ----------------------------------------------
#
# A node given a RetryPolicy is run again by LangGraph, in the same process, when it raises an
# exception the policy retries: no crash, no checkpoint between the attempts, and the second
# attempt starts from the node's first line, so a request the first attempt had sent goes out
# again. --retry-after-ack gives the effect's node a policy and makes the line after the answer
# (a model call that summarises the ticket, the parse of its reply) fail once in this process.
#
# Which exceptions LangGraph's default policy retries: default_retry_on in the installed
# langgraph/_internal/_retry.py (RetryPolicy.retry_on's default, langgraph/types.py). It retries
# any ConnectionError (ConnectionResetError, http.client.RemoteDisconnected, ...), httpx's
# HTTPStatusError for a 5xx, requests' HTTPError, and every exception that is not a ValueError,
# TypeError, ArithmeticError, ImportError, LookupError, NameError, SyntaxError, RuntimeError,
# ReferenceError, StopIteration, StopAsyncIteration or OSError: httpx's timeouts are retried,
# the standard library's TimeoutError (an OSError) and a JSONDecodeError (a ValueError) are not.
# tests/workflow/test_retry.py runs it on each of them.

RETRY_INTERVAL_S = 0.1  # the policy's wait before the second attempt (LangGraph's default: 0.5)


def timeout_after_ack():
    """What a model call made through httpx raises when its answer takes too long."""
    import httpx

    return httpx.ReadTimeout("The read operation timed out")


def parse_error_after_ack():
    """What json.loads raises for a reply that is not JSON (an empty one)."""
    try:
        json.loads("")
    except json.JSONDecodeError as error:
        return error
    raise AssertionError("json.loads('') parsed")  # pragma: no cover


# --retry-after-ack FAILURE -> (the exception the line raises, the policy's retry_on)
RETRY_FAILURES = {
    "timeout": (timeout_after_ack, None),  # None: LangGraph's default_retry_on retries it
    "parse": (parse_error_after_ack, json.JSONDecodeError),  # the default would not
}


def failing_once_after(node, failure):
    """The node, then a line that raises `failure`'s exception the first time it runs in this
    process, and the RetryPolicy that retries it; (node, None) when failure is None."""
    if failure is None:
        return node, None
    from langgraph.types import RetryPolicy

    make_error, retry_on = RETRY_FAILURES[failure]
    policy = RetryPolicy(initial_interval=RETRY_INTERVAL_S, jitter=False)
    if retry_on is not None:
        policy = policy._replace(retry_on=retry_on)
    failed = threading.Event()  # once per graph built: once per command

    def node_then_failing_line(state, runtime):
        result = node(state, runtime)  # the request went out and its answer came back
        if not failed.is_set():
            failed.set()
            error = make_error()
            emit("after_ack_failed", error=f"{type(error).__name__}: {error}")
            raise error  # LangGraph's retry runs this node again, from its first line
        return result

    return node_then_failing_line, policy


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


def charge(state: SagaState, runtime):
    """The first effect: a ticket stands for the charge."""
    key = saga_key(state, "charge")
    done = perform(CHARGE, runtime, key, {"title": state["title"]})
    said("charged", done, key, ticket_id=done.answer["ticket_id"])
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
        done = perform(RESERVATION, runtime, key, request)
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
    said("reserved", done, key, reservation_id=done.answer["reservation_id"])
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
        done = perform(REFUND, runtime, key, request)
        said("refunded", done, key, refund_id=done.answer["refund_id"])
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
    builder.add_node("charge", charge)
    builder.add_node("reserve", reserve)
    builder.add_node("refund", refund)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "reserve")
    builder.add_conditional_edges(
        "reserve", lambda state: "refund" if "refused" in state else END, ["refund", END]
    )
    builder.add_edge("refund", END)
    return builder.compile(checkpointer=checkpointer)


def perform(effect, runtime, key, request):
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
        "look at that saga's state (saga state --thread ITS-THREAD)",
        exitcodes.EXIT_HTTP_ERROR,
    )


def saga_start(args, settings):
    first = {"operation_id": args.operation, "title": args.title, "seats": args.seats}
    return saga_run(args, settings, {**first, "mode": args.mode})


def saga_resume(args, settings):
    return saga_run(args, settings, None)


def saga_run(args, settings, graph_input):
    points = {args.crash_at: "kill"} if args.crash_at else {}
    with (
        failpoints.scoped(points),
        checkpoints.open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db) as ledger,
    ):
        graph = build_saga(saver)
        hint = saga_exists_hint(saver.get_tuple(checkpoints.thread_config(args.thread)))
        snapshot = checkpoints.require_thread(graph, args.thread, graph_input is not None, hint)
        if graph_input is None and "seats" not in snapshot.values:
            raise UserError(
                f"thread {args.thread!r} is not a saga; resume it without saga", EXIT_THREAD
            )
        final = workflow.run_graph(graph, graph_input, args.thread, settings.client(), ledger)
    if final is None:
        return exitcodes.EXIT_DRAINED
    emit("done", **final)
    return 0


def saga_exists_hint(saved):
    """What to do about a saga start on a thread that exists: the saga's own way on, or none."""
    goes_on = saga_goes_on(saved) if saved and is_saga(saved) else "it is no saga"
    return goes_on + "; or pick a new --thread; or " + RESET_HINT


def saga_state(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_saga(saver).get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if "seats" not in snapshot.values:  # a ticket thread: the saga's graph would misread it
        raise UserError(
            f"thread {args.thread!r} is not a saga; state --thread {args.thread} (without saga)",
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
# ticket id. "delivery": "direct" in the input (labs/graphs/outbox.py, for the drill) is the
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


def is_outbox(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 19's: only its state holds delivery."""
    return "delivery" in saved.checkpoint["channel_values"]


def outbox_start(args, settings):
    first = {"operation_id": args.operation, "title": args.title, "delivery": "outbox"}
    return outbox_run(args, settings, first)


def outbox_resume(args, settings):
    return outbox_run(args, settings, None)


def outbox_run(args, settings, graph_input):
    points = {args.crash_at: "kill"} if args.crash_at else {}
    with (
        failpoints.scoped(points),
        checkpoints.open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db) as ledger,
    ):
        graph = build_outbox(saver)
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        if head and not is_outbox(head):  # a ticket run's resume may repeat its request
            other = owner(head) or f"it is a ticket run: state --thread {args.thread} shows it"
            fresh = "; outbox start takes a new --thread" if graph_input is not None else ""
            raise UserError(
                f"thread {args.thread!r} is not an outbox run; {other}{fresh}", EXIT_THREAD
            )
        hint = f"outbox resume --thread {args.thread}; or pick a new --thread; or {RESET_HINT}"
        checkpoints.require_thread(graph, args.thread, graph_input is not None, hint)
        final = workflow.run_graph(graph, graph_input, args.thread, settings.client(), ledger)
    if final is None:
        return exitcodes.EXIT_DRAINED
    emit("done", **final)
    return 0


def outbox_state(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_outbox(saver).get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if "delivery" not in snapshot.values:
        raise UserError(
            f"thread {args.thread!r} is not an outbox run; state --thread {args.thread} shows it",
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


# --- lab 18: the webhook that came twice ---------------------------------------------------
# The receiver (labs/receiver.py) tells the workflow about a ticket's progress by webhook, at least
# once:
# `hooks` is the workflow's endpoint for them, a standard-library HTTP server on LISTEN_HOST
# (default 127.0.0.1; compose sets 0.0.0.0 and the container's address is the one given), for
# as long as the command runs: it subscribes (POST /webhooks, which delivers what is pending),
# moves the ticket if asked (POST /progress), and exits once the receiver has answered.
# --mode naive applies every delivery (but none of a ticket the inbox took: it would set its
# status back); inbox (the default) records it in labs/inbox.py's inbox in the same transaction as
# the ticket's status, ignores an older version, and notifies through the ledger keyed by the
# event id. --crash-at after-inbox kills it after that commit, before its answer to the sender.
# The endpoint is httpguard's server, and takes only webhooks signed with WEBHOOK_SECRET
# (check_signed); what it refuses is a 4xx and one line on stdout.

HOOK_MODES = ("naive", "inbox")
HOOK_POINTS = ("after-inbox",)  # committed, not yet answered: the sender will deliver it again
HOOK_STATUSES = ("opened", "in_progress", "resolved")  # labs/receiver.py's STATUSES
CUSTOMER = "customer@example.com"
HOOKS_TIMEOUT_S = 60.0  # seconds for the receiver's answer to /webhooks and /progress
HOOKS_WAIT_S = 30  # seconds the receiver waits for its delivery round before it answers
HOOK_CONNECTIONS = 32  # deliveries served at once, a thread each; one more gets a quick 503
TIMESTAMP = re.compile(r"[0-9]{1,12}")  # a webhook-timestamp: Unix seconds (10 digits until 2286)
SIGNATURE_TOLERANCE_S = 300  # seconds a webhook's timestamp may be away from our clock (the
#                             spec's example: 5 minutes); an older one is a replay, refused


def hooks(args, settings):
    """Subscribe, move the ticket if asked, take what is delivered; print where the ticket is."""
    if args.mode == "naive" and args.crash_at:
        raise UserError(  # naive commits nothing of its own: the window is the inbox's
            f"--crash-at {args.crash_at} is the inbox's window: drop --mode naive", EXIT_USAGE
        )
    try:
        keys = httpguard.webhook_keys(args.webhook_secret)
    except ValueError as error:
        raise UserError(f"WEBHOOK_SECRET: {error}", EXIT_USAGE) from None
    client = settings.client()
    # The receiver delivers apart from the requests; ?wait=S asks it to answer /webhooks and
    # /progress once the delivery round after them is over (a round tries a silent subscriber
    # 3 times, 2 s each), so what it delivers is taken before this command ends.
    sender = workflow.TicketClient(settings.api_url, HOOKS_TIMEOUT_S, settings.attempts)
    if not checkpoints.is_postgres(settings.checkpoint_db):  # as open_checkpointer checks it
        path = pathlib.Path(settings.checkpoint_db)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
        checkpoints.require_checkpoint_file(path)
    with (
        inbox.open_inbox(settings.checkpoint_db) as box,
        effects.open_ledger(settings.checkpoint_db) as ledger,
    ):
        if args.mode == "naive" and inbox_handles(box, args.ticket):
            raise UserError(
                f"ticket {args.ticket} is the inbox's (a hooks without --mode naive took its "
                "events): naive would apply them again and set its status back; drop --mode "
                "naive, or name another --ticket",
                EXIT_USAGE,
            )
        taker = Taker(args.mode, box, ledger, client)
        points = {args.crash_at: "kill"} if args.crash_at else {}
        handler = type("Hook", (HookHandler,), {"taker": taker, "points": points, "keys": keys})
        try:
            server = open_endpoint(args.listen_host, handler)
        except OSError as error:
            raise UserError(
                f"cannot listen on LISTEN_HOST {args.listen_host!r} ({error.strerror or error}); "
                "set LISTEN_HOST to an address of this machine",
                EXIT_USAGE,
            ) from None
        serving = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        serving.start()
        delivered, moved = 0, None
        try:
            url = hook_url(args.listen_host, server.server_port)
            delivered += sender.call(f"/webhooks?wait={HOOKS_WAIT_S}", {"url": url})["delivered"]
            if args.move:
                move = {"ticket_id": args.ticket, "statuses": args.move}
                moved = sender.call(f"/progress?wait={HOOKS_WAIT_S}", move)
                delivered += moved["delivered"]
        except KeyboardInterrupt:  # Ctrl-C: what got no 2xx waits at the receiver
            again = f"hooks --ticket {args.ticket} takes it"
            if args.mode == "naive":  # and applies it, however often it came
                again = "--mode naive applies it again"
            raise UserError(
                f"interrupted; the receiver keeps what got no answer pending: {again}",
                exitcodes.EXIT_INTERRUPTED,
            ) from None
        finally:
            server.shutdown()  # the accepting loop; a client still sending holds only its
            server.server_close()  # own daemon thread, which dies with the process
        with taker.taking:  # a delivery still being applied finishes first
            if taker.stopped is not None:
                raise taker.stopped
            status, version = box.state(str(args.ticket)) or (None, 0)
            taken = set(taker.taken)
        emit("ticket_status", ticket_id=args.ticket, status=status, version=version)
    said = []
    if moved is not None and not moved["events"]:
        said.append(f"ticket {args.ticket} has each status of --move already: no event, no message")
    # One subscriber at a time: what the receiver delivered and this endpoint never took, or
    # the events of --move that went nowhere pending, another endpoint subscribed after it took.
    moved_elsewhere = moved and not moved["pending"] and {e["event_id"] for e in moved["events"]}
    if delivered > len(taken) or (moved_elsewhere and moved_elsewhere - taken):
        said.append(
            "the receiver delivered webhooks to another endpoint, subscribed after this one "
            "(another hooks running?): that one took them"
        )
    elif status is None:  # nothing moved it yet, or --ticket names another ticket
        said.append(
            f"no webhook for ticket {args.ticket} yet: --move opened,resolved moves it "
            "(tickets lists the receiver's)"
        )
    for line in said:
        print(f"labs: {line}", file=sys.stderr)


def inbox_handles(box, ticket):
    """Whether the inbox took an event of ticket (naive never writes an inbox row)."""
    return box.sql("SELECT 1 FROM inbox WHERE subject = ?", (str(ticket),)).fetchone() is not None


class Taker:
    """What the endpoint does with one valid event, in one mode: one event at a time."""

    def __init__(self, mode, box, ledger, client):
        self.mode, self.box, self.ledger, self.client = mode, box, ledger, client
        self.stopped = None  # a LedgerError that stopped a notification: the command's exit
        self.taking = threading.Lock()  # deliveries come on threads of their own
        self.taken = []  # the event ids of the deliveries answered 2xx

    def take(self, event):
        """Apply the event (or not); notify the customer of a resolved ticket."""
        ticket, status, version = event["ticket_id"], event["status"], event["version"]
        shown = {"event_id": event["event_id"], "status": status, "version": version}
        if self.mode == "naive":  # every delivery applies, whatever came before it
            if inbox_handles(self.box, ticket):  # an event of a ticket the inbox keeps
                raise httpguard.ClientError(
                    409, f"ticket {ticket} is the inbox's: --mode naive does not take its events"
                )
            with self.box.transaction():  # the same status row as the inbox's, overwritten
                self.box.sql(OVERWRITE, (str(ticket), status, version, event["event_id"]))
            emit("webhook", applied=True, **shown)
            if status == "resolved":
                sent = self.client.call("/messages", notice(event))
                emit("message_sent", message_id=sent["message_id"])
            return
        seen = self.box.receive(event["event_id"], str(ticket), version, status)
        emit("webhook", applied=seen.applied, duplicate=not seen.first, **shown)
        fail("after-inbox")  # committed: a kill here leaves the sender without its 2xx
        if seen.applied and status == "resolved":  # on a redelivery too: the ledger knows
            key = f"{event['event_id']}:notify"
            done = MESSAGE.perform(self.ledger, key, notice(event), self.client)
            if done.how == "sent":
                emit("message_sent", key=key, message_id=done.answer["message_id"])
            else:
                emit("effect_receipt", key=key, receipt=done.answer)


OVERWRITE = (  # naive: the ticket's status is what the last delivery said, older or not
    "INSERT INTO inbox_subjects (subject, status, version, event_id) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (subject) DO UPDATE SET status = excluded.status, "
    "version = excluded.version, event_id = excluded.event_id"
)


def notice(event):
    text = f"ticket {event['ticket_id']} resolved ({event['event_id']})"
    return {"to": CUSTOMER, "text": text}


def hook_url(host, port):
    """The address the receiver posts to: this machine's, as the receiver can reach it."""
    import socket

    if host in ("0.0.0.0", ""):  # every interface (a container): its own address on the network
        host = socket.gethostbyname(socket.gethostname())
    return f"http://{host}:{port}/webhook"


def open_endpoint(host, handler):
    """The endpoint's server, as hardened as the receiver's (httpguard): a thread per
    delivery, at most HOOK_CONNECTIONS, each with REQUEST_TIMEOUT_S for its whole request."""
    return httpguard.GuardedServer(
        (host, 0), handler, httpguard.REQUEST_TIMEOUT_S, HOOK_CONNECTIONS
    )


class HookHandler(httpguard.GuardedHandler):
    """POST /webhook: a signed event (WEBHOOK_SECRET), checked before any of it is trusted,
    then taken. What it refuses is a 4xx with a JSON reason, and one line on stdout."""

    routes = {"/webhook": "POST"}
    log_prefix = "labs hooks"
    unavailable_errors = (sqlite3.Error,)  # the inbox busy: a 503, and the sender retries
    taker = None
    points = {}
    keys = ()  # WEBHOOK_SECRET's HMAC keys: one, or several while one replaces another

    def post(self, path):
        body = self.read_body()  # a Content-Length of at most 4096 bytes, as the receiver's
        check_signed(self.keys, self.headers, body)  # signed, and recently
        event = parse_event(body)
        with self.taker.taking, failpoints.scoped(self.points):
            try:
                self.taker.take(event)
            except inbox.EventConflict as error:
                raise httpguard.ClientError(409, str(error)) from None
            except effects.LedgerError as error:  # the message may be out: a person settles it
                self.taker.stopped = error
                return 503, {"error": str(error)}
            except (UserError, urllib.error.HTTPError) as error:  # the message was not sent
                return 503, {"error": f"the notification failed: {error}; retry"}
            self.taker.taken.append(event["event_id"])
        return 200, {"ok": True}

    def refused(self, error):
        emit("webhook_refused", status=error.status, error=error.message)


def check_signed(keys, headers, body, now=None, tolerance_s=SIGNATURE_TOLERANCE_S):
    """The webhook-id of a body signed with one of keys (bytes: one key), its timestamp within
    tolerance_s of now; ClientError 400 (headers missing or malformed) or 403 (a signature
    that does not match: another secret or a changed body; or a timestamp out of the window:
    a replay of an old delivery) otherwise. Signatures are compared in constant time."""
    message_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp") or ""
    sent = (headers.get("webhook-signature") or "").split()
    if not message_id or not sent or not timestamp:
        raise httpguard.ClientError(
            400, "a webhook is signed: send webhook-id, webhook-timestamp and webhook-signature"
        )
    if not TIMESTAMP.fullmatch(timestamp):  # bounded before int(): 400 digits overflow a float
        raise httpguard.ClientError(400, "webhook-timestamp is Unix seconds: 1 to 12 digits")
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance_s:
        raise httpguard.ClientError(
            403,
            f"webhook-timestamp is {abs(age):.0f} s {'old' if age > 0 else 'ahead'}, over "
            f"{tolerance_s:g} s: a replayed or delayed delivery is refused",
        )
    keys = (keys,) if isinstance(keys, bytes) else keys
    expected = [httpguard.signature(k, message_id, timestamp, body).encode() for k in keys]
    if not any(hmac.compare_digest(e, each.encode()) for e in expected for each in sent):
        raise httpguard.ClientError(
            403, "webhook-signature does not match: another secret, or a changed body"
        )
    return message_id


def parse_event(body):
    """The event in a webhook's body, checked field by field; ClientError(400) says what is
    wrong (httpguard.parse_json_body: not UTF-8, not JSON, nested too deeply)."""
    fields = {"event_id", "ticket_id", "status", "version"}
    event = httpguard.parse_json_body(body, "an event")
    if not isinstance(event, dict) or set(event) != fields:
        raise httpguard.ClientError(
            400, f"the body must be an object with exactly {', '.join(sorted(fields))}"
        )
    event_id = event["event_id"]
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= 200 or not event_id.isprintable():
        raise httpguard.ClientError(400, "event_id must be a string of 1-200 printable characters")
    for field in ("ticket_id", "version"):
        if type(event[field]) is not int or not 1 <= event[field] <= 2**63 - 1:
            raise httpguard.ClientError(400, f"{field} must be a whole number from 1")
    if event["status"] not in HOOK_STATUSES:
        raise httpguard.ClientError(400, f"status must be one of {', '.join(HOOK_STATUSES)}")
    return event


def statuses(text):
    """--move: a comma-separated list of statuses, each one labs/receiver.py knows."""
    import argparse

    moves = text.split(",")
    for move in moves:
        if move not in HOOK_STATUSES:
            raise argparse.ArgumentTypeError(
                f"{move!r} is not a status: each must be one of {', '.join(HOOK_STATUSES)}"
            )
    return moves


def add_hooks_parser(actions):
    sub = actions.add_parser("hooks", help="lab 18: take the receiver's webhooks")
    sub.set_defaults(run=hooks)
    sub.add_argument("--ticket", type=int, default=1, help="the ticket to move and show")
    sub.add_argument(
        "--move", type=statuses, help="statuses to move it through, like opened,resolved"
    )
    sub.add_argument("--mode", choices=HOOK_MODES, default="inbox", help="naive: apply them all")
    sub.add_argument("--crash-at", choices=HOOK_POINTS, help="where the endpoint dies (SIGKILL)")


# --- lab 12: the contract a run is saved under, and migrate -------------------------------
#
# Each checkpoint records the run's contract (the code's version and the graph's shape): `resume`
# under another refuses (exit 65, EXIT_CONTRACT), and `migrate` moves a thread to this one,
# explicitly. The core (workflow.py) records none: its starter has one graph.

VERSION = "1"  # the code's; bump it for a change that saved threads must not meet silently
BRANCH = "branch:to:"  # the channel that sends a run to a node (LangGraph's graph/state.py)
INTERRUPT = "__interrupt__"  # the write of a node waiting in interrupt() (_internal/_constants.py)
EXIT_CONTRACT = 65  # resume of a thread saved under another contract: migrate it (EX_DATAERR)


def program_run(args, settings, graph_input):
    """Start (graph_input) or resume (None) args.thread with the lab's graph, client and saver,
    under its contract: only a thread saved under it resumes (--no-contract skips that)."""
    starting = isinstance(graph_input, dict)  # not a resume's Command
    client = client_for(args, settings)
    with (
        checkpoints.open_checkpointer(settings.checkpoint_db, saver_for(args, settings)) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        graph = graph_for(saver, args, head)
        current = contract(graph, args.graph_version)
        if head and (line := owner(head)):  # another command's thread
            raise UserError(line, EXIT_THREAD)
        if head and not starting and not args.no_contract:  # only under its saved contract
            require_contract(graph, args.thread, current, RENAMES.get(args.graph_version))
        check_approval(args, graph.get_state(checkpoints.thread_config(args.thread)))
        checkpoints.require_thread(graph, args.thread, starting, exists_hint(head))
        final = workflow.run_graph(
            graph, graph_input, args.thread, client, ledger, args.durability, {"contract": current}
        )
    if final is None:
        return exitcodes.EXIT_DRAINED
    if INTERRUPT in final:  # the run waits for a human (a graph with interrupt())
        emit("awaiting_approval", **final[INTERRUPT][0].value)
        return 0
    emit("done", **final)
    return 0


def migrate(args, settings):
    with checkpoints.open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(checkpoints.thread_config(args.thread))
        graph = graph_for(saver, args, head)
        current = contract(graph, args.graph_version)
        migrate_thread(graph, args.thread, current, RENAMES.get(args.graph_version), owner)


def contract(graph, version=None):
    """What a run's checkpoints are made under: the code's version (VERSION unless given) and the
    graph's shape. Not how prepare derives the key: the key is prepare's output, saved in the
    checkpoint, so a resumed thread sends the key it saved whatever prepare would derive now."""
    shape = graph.get_graph()
    edges = sorted([edge.source, edge.target, edge.conditional] for edge in shape.edges)
    digest = hashlib.sha256(json.dumps([sorted(shape.nodes), edges]).encode()).hexdigest()[:8]
    return f"v{version or VERSION} graph:{digest}"


def require_contract(graph, thread, current, renames=None):
    """Refuse, changing nothing, to resume a thread saved under another contract. The line says
    whether `migrate` can move it here (tried in a copy, as migrate does) or why it cannot."""
    saved = graph.checkpointer.get_tuple(checkpoints.thread_config(thread))
    if saved.metadata.get("contract") == current:
        return
    was = saved.metadata.get("contract")
    emit("contract_mismatch", current=current, saved=was, thread=thread)
    why = f"thread {thread!r} was saved under {was!r}, this code is {current!r}"
    try:
        plan_migration(graph, saved, current, renames)
    except CannotMigrate as error:  # no migrate hint that would be refused, or undo the thread
        why += f"; migrate cannot move it ({error}): resume it with the code that saved it"
        raise UserError(why, EXIT_CONTRACT) from None
    raise UserError(f"{why}; migrate --thread {thread} moves it here", EXIT_CONTRACT)


def migrate_thread(graph, thread, current, renames=None, owner=None):
    """Move a thread to the current contract: its values kept, its saved next run next, by this
    graph's names (renames: old name -> new). Nothing runs. The move is made in a copy of the
    thread first (plan_migration), and written only when its next is what this prints.
    owner(saved): the line for a thread another command runs, or None."""
    saved = graph.checkpointer.get_tuple(checkpoints.thread_config(thread))
    if saved is None:
        raise UserError(f"no thread {thread!r}; check --thread", EXIT_THREAD)
    if owner and (line := owner(saved)):
        raise UserError(line, EXIT_THREAD)
    if saved.metadata.get("contract") == current:  # nothing to move: write nothing
        emit("unchanged", contract=current, next=list(graph.get_state(saved.config).next))
        return
    try:
        was, moved, writes = plan_migration(graph, saved, current, renames)
    except CannotMigrate as error:
        raise UserError(f"thread {thread!r}: {error}; nothing written", EXIT_CONTRACT) from None
    for write in writes:  # the copy's new checkpoint (one put), then the question it waits on
        write(graph.checkpointer)
    emit("migrated", contract=current, next=moved, saved=saved.metadata["contract"], was=was)


def plan_migration(graph, saved, current, renames=None):
    """The move of a saved thread (a CheckpointTuple) to this graph, made in a copy of it:
    (was, next, the writes to replay on the real saver). CannotMigrate says why it would not do.

    The new checkpoint is written as the node that wrote the saved one (its name here): LangGraph's
    update_state, given no as_node, credits the write to the last writer that still exists
    (Pregel._infer_as_node, pregel/main.py), and that node's edges fire too, so a finished thread
    would be sent back to its effect. The copy is an InMemorySaver holding the thread's head; the
    real saver gets its one put only once the copy's next is the saved one, so a refusal leaves
    SQLite and Postgres alike untouched."""
    from langgraph.types import Command

    renames = renames or {}
    if "contract" not in saved.metadata:
        raise CannotMigrate("it has no contract: the program that saved it records none")
    values = saved.checkpoint["channel_values"]
    if strays := sorted(c for c in values if c not in graph.channels and not c.startswith(BRANCH)):
        raise CannotMigrate(f"it holds {strays}, which this graph has no place for")
    was = [c[len(BRANCH) :] for c in values if c.startswith(BRANCH)]
    goto = [renames.get(name, name) for name in was]
    if (writer := last_writer(saved.checkpoint)) is None:
        raise CannotMigrate("no node has run on it yet")
    writer = renames.get(writer, writer)
    if missing := [name for name in [writer, *goto] if name not in graph.nodes]:
        raise CannotMigrate(f"this graph has no node {missing}")
    copy = copy_saver(graph.checkpointer, saved)
    mover = graph.copy({"checkpointer": copy})
    config = {
        **checkpoints.thread_config(saved.config["configurable"]["thread_id"]),
        "metadata": {"contract": current},
    }
    copy.recording = True
    mover.update_state(config, Command(goto=goto), as_node=writer)
    moved = mover.get_state(config)
    asked = [value for _, channel, value in saved.pending_writes or [] if channel == INTERRUPT]
    if asked and len(was) == 1 == len(moved.tasks):  # it waited in interrupt(): it still does
        copy.put_writes(moved.config, [(INTERRUPT, asked[0])], moved.tasks[0].id)
        moved = mover.get_state(config)
    if sorted(moved.next) != sorted(goto):
        raise CannotMigrate(
            f"written as {writer}, its next would be {list(moved.next)}, not {goto}"
        )
    return was, list(moved.next), copy.replay


class CannotMigrate(Exception):
    """Why a saved thread cannot be moved to this graph."""


def last_writer(checkpoint):
    """The node that wrote a saved checkpoint, by its saved name: the one that read the newest
    channel version (versions_seen), as Pregel._infer_as_node picks it, but over every name the
    checkpoint knows, not only those of the graph reading it."""
    seen = [
        (version, node)
        for node, versions in checkpoint["versions_seen"].items()
        if node != "__input__" and not node.startswith("__snapshot")
        for version in versions.values()
    ]
    return max(seen)[1] if seen else None


def copy_saver(real, saved):
    """A copy of a thread's head in memory, for plan_migration to write into: an InMemorySaver
    holding the saved checkpoint and its pending writes, with the real saver's version format.
    Once `recording` is set, the checkpoint it is given and the writes on that checkpoint are
    kept in `replay`, to replay on the real saver; the update's record of itself on the saved
    checkpoint (history only) is not replayed, so the saved checkpoint stays as it was."""
    from langgraph.checkpoint.memory import InMemorySaver

    class Copy(InMemorySaver):
        recording, replay, new_id = False, [], None

        def get_next_version(self, current, channel):
            return real.get_next_version(current, channel)

        def put(self, config, checkpoint, metadata, new_versions):
            if self.recording:
                self.new_id = checkpoint["id"]
                self.replay.append(lambda to: to.put(config, checkpoint, metadata, new_versions))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config, writes, task_id, task_path=""):
            if self.recording and config["configurable"]["checkpoint_id"] == self.new_id:
                self.replay.append(lambda to: to.put_writes(config, writes, task_id, task_path))
            return super().put_writes(config, writes, task_id, task_path)

    copy = Copy(serde=real.serde)
    copy.replay = []
    where = saved.config["configurable"]
    parent = (saved.parent_config or {"configurable": {}})["configurable"].get("checkpoint_id")
    head = {"configurable": {**where, "checkpoint_id": parent}}
    head["configurable"].setdefault("checkpoint_ns", "")
    copy.put(head, saved.checkpoint, saved.metadata, saved.checkpoint["channel_versions"])
    tasks = {}
    for task_id, channel, value in saved.pending_writes or []:
        tasks.setdefault(task_id, []).append((channel, value))
    for task_id, writes in tasks.items():
        copy.put_writes(saved.config, writes, task_id)
    return copy


def build_parser():
    parser = workflow.build_parser(prog="labs")
    parser.set_defaults(crash_at=None, term_at=None, durability="sync", no_contract=False)
    parser.set_defaults(retry_after_ack=None)  # lab 17: start only
    parser.set_defaults(unkeyed=lambda values: values.get("mode") == "naive")  # for the hints
    parser.set_defaults(effects={**effects.declared(vars(workflow)), **effects.declared(globals())})
    actions = parser.actions
    for name, action in [("start", start), ("resume", resume), ("state", state)]:
        actions.choices[name].set_defaults(run=action)
    for name in ("start", "resume"):
        sub = actions.choices[name]
        crash = sub.add_mutually_exclusive_group()
        crash.add_argument(
            "--crash",
            dest="crash_at",
            action="store_const",
            const="after-ack",
            help="same as --crash-at after-ack",
        )
        crash.add_argument("--crash-at", choices=CRASH_POINTS, help="where the run dies")
        sub.add_argument("--term-at", choices=TERM_POINTS, help="where the run gets SIGTERM")
        sub.add_argument("--durability", choices=DURABILITIES, default="sync")
    actions.choices["resume"].add_argument(
        "--no-contract", action="store_true", help="skip the contract check (lab 12)"
    )
    sub = actions.add_parser("migrate", help="move a thread to this code's contract (lab 12)")
    sub.set_defaults(run=migrate)
    sub.add_argument("--thread", default=commandline.Defaulted("demo"), help="checkpoint thread id")
    start_parser = actions.choices["start"]
    start_parser.add_argument("--mode", choices=(*MODES, *PAYMENT_MODES), default="ledger")
    start_parser.add_argument(
        "--approval",
        nargs="?",
        const="in-node",
        choices=APPROVAL_SHAPES,
        help="wait for a human after the ticket: in-node (the default) or own-node",
    )
    add_message_parser(parser)
    add_payment_parser(parser)
    start_parser.add_argument(
        "--retry-after-ack",
        choices=RETRY_FAILURES,
        help="lab 17: a RetryPolicy on the effect's node, and a line after the answer that "
        "fails once (timeout: httpx's ReadTimeout; parse: a JSONDecodeError)",
    )
    sub = actions.add_parser("approve", help="answer a run that waits for approval (lab 07)")
    sub.set_defaults(run=approve, graph_command=True)
    sub.set_defaults(resume="approve")  # what goes on after a stop: the answer, again
    sub.add_argument(
        "--thread",
        default=commandline.Defaulted("demo"),
        help="checkpoint thread id (default: demo)",
    )
    sub.add_argument("--reject", dest="approve", action="store_false", help="answer no")
    add_saga_parser(actions)
    add_outbox_parser(actions)
    add_hooks_parser(actions)
    return parser


def main(argv=None, environ=None):
    environ = os.environ if environ is None else environ
    version = environ.get("LAB_GRAPH_VERSION", "1")
    if version not in EFFECT_NODE:
        print(f"labs: LAB_GRAPH_VERSION={version!r} must be 1 or 2", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    parser.set_defaults(graph_version=version, listen_host=environ.get("LISTEN_HOST", "127.0.0.1"))
    parser.set_defaults(webhook_secret=environ.get("WEBHOOK_SECRET") or LAB_SECRET)  # hooks
    points = (*POINTS, *SAGA_ACKS, *OUTBOX_POINTS, *HOOK_POINTS)
    checkpoints.own_tables(
        LAB_TABLES
    )  # labs/inbox.py's and labs/relay.py's, beside the checkpoints
    return workflow.main(argv, environ, parser=parser, points=points)
