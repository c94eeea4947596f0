"""A two-node LangGraph workflow that opens a ticket in another service, once, as long as the
receiver honours the idempotency key (one that forgets a key too soon makes a second ticket).

    START -> prepare -> create_ticket -> END

The crash window: create_ticket asks the receiver (api.py) for a ticket. The receiver commits
the ticket and then answers; LangGraph saves the node's result only after the node has returned.
A process that dies in between (a kill, an out-of-memory, a deploy) leaves a ticket that the
checkpoint knows nothing about, and the resumed run starts create_ticket again from its first
line, so the request goes out again. What stops that second request from becoming a second
ticket is its key: prepare derives the key from the run's input, so every attempt sends the same
Idempotency-Key and the receiver answers a repeat with the ticket it already made. When no answer
comes back at all, the node cannot tell whether the ticket was made: it looks the key up and
adopts what it finds, or sends again with the key.

The `fail("...")` lines are named failpoints (failpoints.py): they do nothing unless turned on,
and they mark where the window is. FAILPOINTS="after-ack=kill" opens it for real.

The checkpointer (SqliteSaver, durability "sync") writes the state after each node before the
next one starts, so a resumed run repeats only the node whose result was not saved. SIGTERM (a
deploy, `docker compose stop`) asks LangGraph to drain: the node in flight finishes, its result is
saved, and the run stops at the next step boundary with the event `drained` and exit 75
(EX_TEMPFAIL); `resume` carries on. A SIGKILL cannot be handled: then the key is what keeps the
resumed run from making a second ticket.

A deploy can change the graph under a saved thread: each checkpoint records the run's contract,
`resume` under another refuses (exit 65), and `migrate` moves a thread to this one, explicitly.

Output is one JSON object per line, keys sorted. Exit codes: see EXIT_* below.

Configuration (environment, read in main()):
    API_URL          http://127.0.0.1:8000
    CHECKPOINT_DB    data/workflow/checkpoints.sqlite, or a postgresql:// URL (PostgresSaver; needs
                     the langgraph-checkpoint-postgres and psycopg packages)
    API_TIMEOUT_S    5 (seconds to wait for one answer from the receiver)
    API_ATTEMPTS     4 (tries of a request that was refused or answered 503)
    FAILPOINTS       "" (all off); e.g. "after-ack=kill" (see failpoints.py and POINTS)
    LEDGER_LEASE_S   300 (seconds a SQLite ledger's lease keeps a second performer of a key out
                     while its holder lives; a dead holder's lock ends at once: effects.py)
    LAB_TRACE        "" (off); otlp, or a file: spans of each run, effect and request, with the
                     idempotency key, and traceparent sent to the receiver (tracing.py)
    LEDGER_RECEIPT_KEY      "" (none: a receipt's integrity hash is a plain sha256, which
                            catches damage, not a forger); a secret: an HMAC-SHA256 under it,
                            which someone who can write the ledger and lacks the key cannot
                            forge (effects.key_receipts)
    LEDGER_RECEIPT_UNKEYED  refuse; accept: with a key set, also read receipts written before it
"""

if __name__ == "__main__":  # a Ctrl-C while the imports below run: one line, not a traceback
    import os
    import signal

    def interrupted_while_importing(*_):
        os.write(2, b"workflow.py: interrupted\n")
        os._exit(130)  # EXIT_INTERRUPTED: nothing has run yet

    signal.signal(signal.SIGINT, interrupted_while_importing)

import argparse
import contextlib
import dataclasses
import hashlib
import http.client
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NotRequired, TypedDict

import effects
import tracing
from failpoints import FailpointSpecError, fail

POINTS = (
    "after-prepare",
    "before-request",
    "after-send",
    "after-ack",
    "after-checkpoint",
)  # fail()
VERSION = "1"  # the code's; bump it for a change that saved threads must not meet silently
BRANCH = "branch:to:"  # the channel that sends a run to a node (LangGraph's graph/state.py)
INTERRUPT = "__interrupt__"  # the write of a node waiting in interrupt() (_internal/_constants.py)


class State(TypedDict):
    operation_id: str
    title: str
    key: NotRequired[str]
    ticket_id: NotRequired[int]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a run needs from outside, handed to every node as runtime.context."""

    client: "TicketClient"
    ledger: "effects.Ledger"  # in the checkpoints' own database (effects.open_ledger)


@dataclasses.dataclass(frozen=True)
class Program:
    """What a program wrapping this CLI changes of run and migrate (its own graph, say); the
    defaults are this file's own graph and client. Each hook takes the parsed args."""

    graph: object = lambda saver, args, head: build_graph(saver)  # head: the saved tuple or None
    version: object = lambda args: None  # the contract's version: None for VERSION
    renames: object = lambda args: None  # what migrate maps a saved next through
    owner: object = lambda head: None  # the line for a thread another command runs
    exists_hint: object = lambda head: "resume it or pick a new --thread"
    saver_class: object = lambda args, settings: None  # a SqliteSaver subclass, or None
    client: object = lambda args, settings: settings.client()
    check: object = lambda args, snapshot: None  # raise UserError to refuse the run


def prepare(state: State):
    emit("prepare", operation=state["operation_id"])
    fail("after-prepare")
    # The key names the business operation, not the attempt: it comes from the run's input,
    # so every retry and every resume of this run derives the same key.
    return {"key": state["operation_id"]}


def create_ticket(state: State, runtime):
    ledger, client = runtime.context.ledger, runtime.context.client
    fail("before-request")
    # TICKET.perform records the intent in the ledger before the request leaves, and the answer
    # (a receipt) once it comes back. A resumed run that finds the receipt returns it and sends
    # nothing; one that finds only the intent asks the receiver by key (see effects.py).
    done = TICKET.perform(ledger, state["key"], {"title": state["title"]}, client)
    ticket_id = done.answer["ticket_id"]
    if done.how == "sent":
        emit("effect_ack", created=done.answer["created"], ticket_id=ticket_id)
    else:  # nothing was sent: the ledger's receipt, or what the receiver holds under the key
        emit(f"effect_{done.how}", key=state["key"], ticket_id=ticket_id)
    # The receipt is in the ledger and this node has not returned, so its result is not in the
    # checkpoint yet: a process that dies here re-runs the node, which finds the receipt.
    fail("after-ack")
    return {"ticket_id": ticket_id}


# The effect, declared once: what it sends, how the receiver is asked what a key made, and
# which answers say "no" (a business 4xx: the receiver refused it and made nothing). The receiver
# honours Idempotency-Key (receiver.py: a repeat is answered with the first ticket), so a request
# whose answer was lost may go again under its key: keyed.
TICKET = effects.Effect(
    "ticket",
    send=lambda client, request, key: client.create(request["title"], key),
    lookup=lambda client, key: adopt(client.tickets(key)),
    external_id=lambda answer: answer["ticket_id"],
    not_sent=lambda error: did_nothing(error),  # refused connection, a wrong address's 404
    refused=lambda error: refusal(error),
    keyed=True,
    answer_of=lambda ticket_id: {"ticket_id": int(ticket_id), "created": False},
    look_with="python workflow.py tickets --operation {key} (GET /tickets?key={key} on API_URL)",
)


STEPS = (prepare, create_ticket)  # the graph: START -> each node in turn -> END


def build_graph(checkpointer):
    """The compiled graph: prepare derives the key, create_ticket sends it with the request."""
    from langgraph.graph import END, START, StateGraph  # slow import: only graph commands pay

    builder = StateGraph(State, context_schema=Context)
    builder.add_sequence(STEPS)  # each node named after its function, an edge to the next
    builder.add_edge(START, STEPS[0].__name__)
    builder.add_edge(STEPS[-1].__name__, END)
    return builder.compile(checkpointer=checkpointer)


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
    saved = graph.checkpointer.get_tuple(thread_config(thread))
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
    saved = graph.checkpointer.get_tuple(thread_config(thread))
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
        **thread_config(saved.config["configurable"]["thread_id"]),
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


def run_graph(graph, graph_input, thread, client, ledger, durability="sync", contract=None):
    """Start a run (graph_input) or resume one (None); its final values, or None if it drained.
    contract: recorded in each checkpoint the run saves (LangGraph copies config["metadata"]).

    SIGTERM asks LangGraph to drain (RunControl.request_drain, LangGraph 1.2.0 and later: it came
    with langgraph#7274): the node in flight finishes, its result is saved, and the run stops at
    the next step boundary.
    """
    from langgraph.errors import GraphDrained
    from langgraph.runtime import RunControl

    config = {**thread_config(thread), "metadata": {"contract": contract}}
    control = RunControl()
    # Only the main thread receives signals (and may set a handler): an in-process caller on
    # another thread runs without one.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, lambda *_: control.request_drain("SIGTERM"))
    try:
        with tracing.run(thread) as span:
            try:
                final = graph.invoke(
                    graph_input,
                    config,
                    durability=durability,
                    control=control,
                    context=Context(client, ledger),
                )
            except GraphDrained as drained:  # a clean stop, not a failure: say so, and where
                tracing.drained(span, drained.reason)
                emit("drained", reason=drained.reason, next=list(graph.get_state(config).next))
                return None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    fail("after-checkpoint")
    return final


# --- the CLI: one function per action ------------------------------------------------------


def start(args, settings):
    return run(args, settings, {"operation_id": args.operation, "title": args.title})


def resume(args, settings):
    return run(args, settings, None)


def run(args, settings, graph_input):
    """Start (graph_input) or resume (None) args.thread, with args.program's graph."""
    program, starting = args.program, isinstance(graph_input, dict)  # not a resume's Command
    client = program.client(args, settings)
    with (
        open_checkpointer(settings.checkpoint_db, program.saver_class(args, settings)) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        head = saver.get_tuple(thread_config(args.thread))
        graph = program.graph(saver, args, head)
        current = contract(graph, program.version(args))
        if head and (line := program.owner(head)):  # another command's thread
            raise UserError(line, EXIT_THREAD)
        if head and not starting and not args.no_contract:  # only under its saved contract
            require_contract(graph, args.thread, current, program.renames(args))
        program.check(args, graph.get_state(thread_config(args.thread)))
        require_thread(graph, args.thread, starting, program.exists_hint(head))
        final = run_graph(graph, graph_input, args.thread, client, ledger, args.durability, current)
    if final is None:
        return EXIT_DRAINED
    if INTERRUPT in final:  # the run waits for a human (a graph with interrupt())
        emit("awaiting_approval", **final[INTERRUPT][0].value)
        return 0
    emit("done", **final)
    return 0


def state(args, settings):
    with open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_graph(saver).get_state(thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def migrate(args, settings):
    program = args.program
    with open_checkpointer(settings.checkpoint_db) as saver:
        head = saver.get_tuple(thread_config(args.thread))
        graph = program.graph(saver, args, head)
        current = contract(graph, program.version(args))
        migrate_thread(graph, args.thread, current, program.renames(args), program.owner)


def reconcile(args, settings):
    """The ledger's open effects: each asked by key where its provider has a lookup, or settled
    as a person says (--confirmed KEY or KEY=ID, --not-sent KEY); then how many are still
    unknown, and any extra effect a provider made under a key (a duplicate to undo). Every
    argument is checked, and every key's lock taken, before anything is written."""
    client = settings.client()
    with (
        open_checkpointer(settings.checkpoint_db),
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
        contextlib.ExitStack() as held,
    ):
        said = settlements(args)
        for key in said:
            require_open(ledger, key)
        for key in said:  # InFlight while a live process performs it: nothing written yet
            held.enter_context(ledger.performing(key))
        settled = [settle_as_said(ledger, key, *said[key], args, client) for key in said]
        for key, state, how, answer, external_id in settled:
            ledger.settle(key, how, answer, external_id)
            emit("settled", key=key, state=state)
        if not said:
            for record, now in effects.reconcile(ledger, args.effects, client):
                emit("reconciled", effect=record.effect, key=record.key, now=now, was=record.state)
        unknown, oldest_s = ledger.stuck()
        emit("effects_unknown", count=unknown, oldest_s=round(oldest_s))
        if extras := ledger.extras():  # made and in no receipt: a duplicate to undo
            for key, external_id, how in extras:
                emit("effect_extra", key=key, external_id=external_id, how=how)
            emit("effects_extra", count=len(extras))


def settlements(args):
    """{key: (what the person said, the id they gave or None)}; a key named twice: UserError."""
    said = {}
    for word, given in (("confirmed", args.confirmed), ("not-sent", args.not_sent)):
        for text in given:
            key, _, external_id = text.rpartition("=") if "=" in text else (text, "", "")
            if key in said:
                raise UserError(
                    f"{key!r} is named twice (--{said[key][0]} and --{word}); say once what "
                    "happened to it. Nothing was settled",
                    EXIT_THREAD,
                )
            if word == "not-sent" and external_id:
                raise UserError(
                    f"--not-sent takes a key, not KEY=ID ({text!r}). Nothing was settled",
                    EXIT_USAGE,
                )
            said[key] = (word, external_id or None)
    return said


def settle_as_said(ledger, key, word, external_id, args, client):
    """(key, state, how, answer, external_id) to write for one key, checked against what the
    provider holds where it can be asked; UserError (nothing written) where it disagrees."""
    record = ledger.get(key)  # under its lock now
    require_open(ledger, key)
    effect = args.effects.get(record.effect)
    look = "" if effect is None else f" (look with {effect.look_with.format(key=key)})"
    found = None if effect is None or effect.lookup is None else effect.lookup(client, key)
    nothing = ". Nothing was settled"
    if word == "not-sent":
        if found is not None:
            held = effect.external_id(found)
            raise UserError(
                f"the provider holds {held} under {key!r}: it was sent; reconcile --confirmed "
                f"{key} records it{look}{nothing}",
                EXIT_THREAD,
            )
        if effect is not None and effect.lookup is not None and effect.may_resend(record) is None:
            raise UserError(  # nothing found yet is no proof: the provider may commit it late
                f"the provider holds nothing under {key!r} yet, and it may take "
                f"{effect.settled_after_s:g} s to commit (last sent {record.since_sent_s:.0f} s "
                f"ago): reconcile then{look}{nothing}",
                EXIT_THREAD,
            )
        return key, "released", "a person: reconcile --not-sent", None, None
    how = "a person: reconcile --confirmed"
    if found is not None:
        if external_id is not None and external_id != str(effect.external_id(found)):
            raise UserError(
                f"the provider holds {effect.external_id(found)} under {key!r}, not "
                f"{external_id}{look}{nothing}",
                EXIT_THREAD,
            )
        return key, "confirmed", f"{how}, looked up", found, effect.external_id(found)
    if effect is not None and effect.lookup is not None:
        raise UserError(
            f"the provider holds nothing under {key!r}: not confirmed{look}; if it never went "
            f"out, --not-sent {key}{nothing}",
            EXIT_THREAD,
        )
    if effect is None or effect.answer_of is None:
        raise UserError(
            f"effect {record.effect!r} of {key!r} is not one this program can record a person's "
            f"answer for; --not-sent {key} if it never went out{nothing}",
            EXIT_THREAD,
        )
    if external_id is None:
        raise UserError(
            f"--confirmed {key} needs the id the provider gave it: --confirmed {key}=ID{look}"
            f"{nothing}",
            EXIT_USAGE,
        )
    try:
        answer = effect.answer_of(external_id)
    except (ValueError, TypeError):
        raise UserError(
            f"{external_id!r} is not an id of {effect.name}{look}{nothing}", EXIT_USAGE
        ) from None
    return key, "confirmed", how, answer, effect.external_id(answer)


def require_open(ledger, key):
    """Only an effect that may be out there is a person's to settle."""
    if not (record := ledger.get(key)) or record.state not in effects.OPEN:
        state = record.state if record else "no such key"
        raise UserError(
            f"effect {key!r} is not open ({state}); reconcile lists the open ones. Nothing was "
            "settled",
            EXIT_THREAD,
        )


def tickets(args, settings):
    emit("tickets", tickets=settings.client().tickets(args.operation))


def post(args, settings):
    result = settings.client().create(args.title, args.operation)
    emit("post", created=result["created"], ticket_id=result["ticket_id"])


# --- helpers -------------------------------------------------------------------------------

API_TIMEOUT_S = 5.0  # seconds; the receiver answers in milliseconds, so 5 s means it is gone
API_ATTEMPTS = 4  # tries of a request whose connection was refused: 0.25, 0.5, 1 s apart,
RETRY_DELAY_S = 0.25  # enough for a receiver that is starting or restarting
MAX_RETRY_DELAY_S = 2.0  # the delays double up to this
BUSY_TRIES_PER_ATTEMPT = 2  # a 503 (busy) gets twice API_ATTEMPTS tries: 8, about 26 s. Each one
#   costs the receiver's busy timeout (api.py BUSY_TIMEOUT_S, 2 s) before its 503, plus the delay
#   (0.25 s doubling to 2 s): 8 x 2 + 9.75 s. That outlasts a lock another program holds on the
#   receiver's file (a backup, an sqlite3 shell: the review held one 10 s, past the old 9.75 s
#   budget) by more than the lock itself lasted: a load spike can stretch each try. Past it the
#   receiver is down in effect, nothing was committed, and the line names the resume.
EXIT_HTTP_ERROR = 1  # the receiver answered with an error (http_error shows it)
EXIT_USAGE = 2  # a usage or configuration mistake: one line on stderr
EXIT_NO_ANSWER = 3  # the receiver (or a Postgres CHECKPOINT_DB) could not be reached, or a
#                     Postgres CHECKPOINT_DB stopped answering mid-run (a restart)
EXIT_THREAD = 4  # resume or state of an unknown thread, or start of one that exists
EXIT_CONTRACT = 65  # resume of a thread saved under another contract: migrate it (EX_DATAERR)
EXIT_CHECKPOINT_WRITE = 74  # the SQLite CHECKPOINT_DB cannot be written: read-only, its disk
#                             full, or an open file no longer writable (EX_IOERR); resume once
#                             it can be
EXIT_UNSETTLED = 6  # an effect may have happened and no evidence says not: look, reconcile it
EXIT_LEDGER_DAMAGED = 7  # a ledger row fails its own check (a receipt changed, forged or gone,
#                          effects.Damaged): this code will not use it, and sends nothing for it
EXIT_DRAINED = 75  # stopped cleanly on SIGTERM, checkpoint saved: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_KILLED = 137  # a `kill` failpoint: SIGKILL is signal 9, and a shell reports 128 + 9


class UserError(Exception):
    """A mistake the user can fix: one line on stderr and this exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class Unreachable(UserError):
    """The connection was refused: nothing was sent, so the same request may be tried again."""


class NoAnswer(UserError):
    """The request was sent and no answer came back: it may or may not have taken effect."""


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


def emit(event, **values):
    """One JSON line, in one write: print() writes the text and its newline apart when output is
    unbuffered, and two processes on one pipe (the drill's child and its resume) could splice."""
    sys.stdout.write(json.dumps({"event": event, **values}, sort_keys=True) + "\n")
    sys.stdout.flush()


def announce(name, action):
    """Say which failpoint fires, before it kills or stops the process."""
    if action == "kill":
        emit("crash", at=name)
    elif action == "term":
        emit("sigterm", at=name)


def thread_config(thread):
    return {"configurable": {"thread_id": thread}}


def require_thread(graph, thread, starting, hint="resume it or pick a new --thread"):
    """start needs a new thread, resume an existing one; the thread's snapshot."""
    snapshot = graph.get_state(thread_config(thread))
    if starting and snapshot.values:
        raise UserError(f"thread {thread!r} already exists; {hint}", EXIT_THREAD)
    if not starting and not snapshot.values:
        raise UserError(f"no thread {thread!r} to resume; check --thread", EXIT_THREAD)
    return snapshot


class TicketClient:
    """The HTTP client for api.py. Plain urllib: commands that use only this load fast."""

    def __init__(self, api_url, timeout_s=API_TIMEOUT_S, attempts=API_ATTEMPTS, headers=None):
        self.api_url, self.timeout_s, self.attempts = api_url.rstrip("/"), timeout_s, attempts
        self.headers = dict(headers or {})  # sent with every request

    def create(self, title, key=None):
        return self.call("/tickets", {"title": title}, key)

    def tickets(self, key=None):
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return self.call("/tickets" + query)["tickets"]

    def call(self, path, payload=None, key=None):
        """One request, tried again after a refused connection (attempts tries) or a 503 that
        says when to retry (twice as many: the receiver is there, waiting for its database):
        neither committed. A 503 without Retry-After (a damaged database) is not retried."""
        delays, refused, busy = retry_delays(), 0, 0
        while True:
            try:
                return self.send(path, payload, key)
            except Unreachable as error:
                refused += 1
                # A name that does not resolve (Compose's DNS knows no stopped service) costs a
                # lookup per try: one more try covers a restart, not four lookups of a gone host.
                unnamed = isinstance(getattr(error.__cause__, "reason", None), socket.gaierror)
                if refused >= (min(self.attempts, UNRESOLVED_TRIES) if unnamed else self.attempts):
                    raise
            except urllib.error.HTTPError as error:  # 503: busy, the transaction rolled back
                busy += 1
                retry = error.code == 503 and error.headers.get("Retry-After") is not None
                if not retry or busy >= self.attempts * BUSY_TRIES_PER_ATTEMPT:
                    raise
            time.sleep(next(delays))

    def send(self, path, payload, key):
        request = urllib.request.Request(self.api_url + path, headers=self.headers)
        if payload is not None:
            request.data = json.dumps(payload).encode()
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Idempotency-Key", key)
        try:
            with (
                tracing.outgoing(request, key) as span,  # LAB_TRACE: traceparent sent with it
                urllib.request.urlopen(request, timeout=self.timeout_s) as response,
            ):
                span.set_attribute("http.response.status_code", response.status)
                return json.load(response)
        except urllib.error.HTTPError:
            raise  # the receiver answered: main() prints http_error
        except urllib.error.URLError as error:
            # urllib raises URLError for an OSError while it connects and while it sends the
            # request (AbstractHTTPHandler.do_open, urllib/request.py): only a connection that
            # was never made proves nothing left; a timeout or a reset while sending may not.
            if not isinstance(error.reason, NEVER_CONNECTED):
                raise NoAnswer(
                    f"no answer from the receiver at {self.api_url} ({error.reason}); "
                    "the request may or may not have taken effect",
                    EXIT_NO_ANSWER,
                ) from error
            raise Unreachable(
                f"cannot reach the receiver at {self.api_url} ({error.reason}); start it "
                "(docker compose up -d --build api, or natively: python api.py &), "
                "or set API_URL to where it listens",
                EXIT_NO_ANSWER,
            ) from error
        except (OSError, http.client.HTTPException) as error:  # sent, then no answer
            raise NoAnswer(
                f"no answer from the receiver at {self.api_url} ({error}); "
                "the request may or may not have taken effect",
                EXIT_NO_ANSWER,
            ) from error


NEVER_CONNECTED = (ConnectionRefusedError, socket.gaierror)  # no connection: nothing was sent
UNRESOLVED_TRIES = 2  # tries of a host name that does not resolve (each lookup can take 1 s)


def adopt(found):
    """The lookup's answer: the ticket the key made (the receiver keeps one per key), or None."""
    return {"ticket_id": found[0]["ticket_id"], "created": False} if found else None


def refusal(error):
    """A business 4xx answer's JSON body: the receiver refused the request and made nothing, and
    the key is spent. Else None: a 5xx or no answer (it may have committed), or an answer that
    says the request went to the wrong place or was not let in (did_nothing)."""
    if not isinstance(error, urllib.error.HTTPError) or not 400 <= error.code < 500:
        return None
    if error.code in DID_NOTHING:
        return None
    try:
        body = json.loads(error.read())
    except ValueError:
        return None  # not the receiver's JSON: another server; not a refusal we can read
    return {"status": error.code, **body} if isinstance(body, dict) else None


def did_nothing(error):
    """True for an error that proves the request made nothing and the key is still free: the
    connection was refused (Unreachable), or an answer that it reached no route or was not let
    in (DID_NOTHING: a wrong API_URL, a missing credential, a limit: fix it, then resume)."""
    http_error = isinstance(error, urllib.error.HTTPError) and error.code in DID_NOTHING
    return isinstance(error, Unreachable) or http_error


DID_NOTHING = {401, 403, 404, 405, 408, 429}


def retry_delays():
    """The waits between tries: RETRY_DELAY_S, doubling, at most MAX_RETRY_DELAY_S."""
    delay = RETRY_DELAY_S
    while True:
        yield delay
        delay = min(delay * 2, MAX_RETRY_DELAY_S)


@contextlib.contextmanager
def open_checkpointer(checkpoint_db, saver_class=None):
    """LangGraph's saver for CHECKPOINT_DB, closed on exit: PostgresSaver for a postgresql://
    URL, else SqliteSaver (or saver_class, a SqliteSaver subclass) on that file."""
    if is_postgres(checkpoint_db):
        with open_postgres(checkpoint_db) as saver:
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(checkpoint_db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
    require_checkpoint_file(path)
    with (saver_class or SqliteSaver).from_conn_string(str(path)) as saver:
        yield saver


CHECKPOINT_TABLES = {"checkpoints", "writes"}  # what SqliteSaver.setup creates (checkpoint/sqlite)
OUR_TABLES = CHECKPOINT_TABLES | set(effects.TABLES)  # and the ledger, beside them
# inbox.py's TABLES and relay.py's outbox, when they sit beside them (named, not imported: this
# file runs without them)
OUR_TABLES |= {"inbox", "inbox_subjects", "outbox"}


def require_checkpoint_file(path):
    """Refuse, before SqliteSaver writes a byte (its setup switches the file to WAL and adds its
    tables), a file that holds tables of another program: the receiver's, or anyone's, and a
    table with one of our names whose columns are not ours (`effects` is a common name). The
    file is read on a read-only connection (mode=ro): the check itself writes nothing."""
    if not path.is_file() or path.stat().st_size == 0:
        return  # a new file: SqliteSaver makes it
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        # At least the columns each of our tables was made with: ours may gain more (a
        # migration adds them on open), another program's table of that name lacks some.
        unlike = sorted(
            table
            for table, columns in OUR_COLUMNS.items()
            if table in tables
            and not columns <= {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        )
    finally:
        conn.close()
    foreign = sorted(t for t in tables - OUR_TABLES if not t.startswith("sqlite_")) + unlike
    if foreign:
        raise UserError(
            f"CHECKPOINT_DB {str(path)!r} holds tables that are not LangGraph's checkpoints "
            f"({', '.join(foreign)}): another program's database; nothing was written to it. "
            "Point CHECKPOINT_DB at a file of its own",
            EXIT_USAGE,
        )


OUR_COLUMNS = {  # columns each of OUR_TABLES has had from the start (a subset, not the set)
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint", "metadata"},
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"},
    # (SqliteSaver.setup's CREATE TABLEs, langgraph/checkpoint/sqlite/__init__.py)
    "effects": {"key", "effect", "request", "request_hash", "state"},
    "effect_transitions": {"key", "from_state", "to_state"},
    "effect_receipts": {"key", "external_id", "answer", "request_hash"},
    "inbox": {"event_id", "subject", "version", "status", "applied"},
    "inbox_subjects": {"subject", "status", "version", "event_id"},
    "outbox": {"message_id", "destination", "payload", "state", "deliveries"},
}


def is_postgres(checkpoint_db):
    return checkpoint_db.startswith(("postgresql://", "postgres://"))


@contextlib.contextmanager
def open_postgres(url):
    """LangGraph's PostgresSaver on one connection, its tables created or migrated."""
    import psycopg  # Postgres users only: commands on SQLite never load it
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    # psycopg logs a lost connection once more as its pipeline closes ("error ignored
    # terminating ..."): main() says it in one line of its own (lost_postgres)
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)

    try:  # the settings PostgresSaver.from_conn_string uses
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as error:  # unreachable (OperationalError), or not a valid URL
        reason = str(error).strip().splitlines()[0]
        code = EXIT_NO_ANSWER if isinstance(error, psycopg.OperationalError) else EXIT_USAGE
        hint = "; CHECKPOINT_DB is set in your environment: unset it for the SQLite default"
        raise UserError(f"cannot open CHECKPOINT_DB ({reason}){hint}", code) from error
    with conn:
        saver = PostgresSaver(conn)
        # setup() creates or migrates the tables; the user must call it (PostgresSaver.setup's
        # docstring). Workers starting together would race on them: one at a time, under an
        # advisory lock. Not a blocking wait for it: setup's CREATE INDEX CONCURRENTLY waits for
        # every open transaction, a waiter's included.
        lock = "SELECT pg_try_advisory_lock(hashtext('langgraph setup')) AS locked"
        while not conn.execute(lock).fetchone()["locked"]:
            time.sleep(0.05)
        saver.setup()
        conn.execute("SELECT pg_advisory_unlock(hashtext('langgraph setup'))")
        yield saver


@dataclasses.dataclass(frozen=True)
class Settings:
    """The environment's settings, checked."""

    api_url: str = "http://127.0.0.1:8000"
    checkpoint_db: str = "data/workflow/checkpoints.sqlite"
    timeout_s: float = API_TIMEOUT_S
    attempts: int = API_ATTEMPTS
    failpoints: str = ""
    trace: str = ""  # LAB_TRACE
    lease_s: float = effects.LEASE_S  # LEDGER_LEASE_S: how long a SQLite lease keeps others out
    receipt_key: str = dataclasses.field(default="", repr=False)  # LEDGER_RECEIPT_KEY: a secret
    receipt_unkeyed: str = "refuse"  # LEDGER_RECEIPT_UNKEYED

    @classmethod
    def from_environ(cls, environ):
        """The settings; a bad value is a UserError naming the variable."""
        api_url = environ.get("API_URL", cls.api_url)
        try:
            url = urllib.parse.urlsplit(api_url)
            url.port  # noqa: B018 (ValueError for a port that is not a number in 0-65535)
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.hostname:
            raise UserError(
                f"API_URL {api_url!r} is not a receiver's address; "
                "use a scheme, a host and a port, like http://127.0.0.1:8000",
                EXIT_USAGE,
            )
        return cls(
            api_url=api_url,
            checkpoint_db=environ.get("CHECKPOINT_DB", cls.checkpoint_db),
            timeout_s=number(environ, "API_TIMEOUT_S", API_TIMEOUT_S, float),
            attempts=number(environ, "API_ATTEMPTS", API_ATTEMPTS, int),
            failpoints=environ.get("FAILPOINTS", ""),
            trace=environ.get("LAB_TRACE", ""),
            lease_s=number(environ, "LEDGER_LEASE_S", effects.LEASE_S, float),
            receipt_key=environ.get("LEDGER_RECEIPT_KEY", ""),
            receipt_unkeyed=environ.get("LEDGER_RECEIPT_UNKEYED", cls.receipt_unkeyed),
        )

    def client(self, headers=None):
        return TicketClient(self.api_url, self.timeout_s, self.attempts, headers)


def number(environ, name, default, kind):
    text = environ.get(name)
    try:
        value = default if text is None else kind(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise UserError(f"{name}={text!r} must be a positive {kind.__name__}", EXIT_USAGE)
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        self.exit(
            EXIT_USAGE, f"{self.prog}: {message}{where_it_goes(self, message)} (see --help)\n"
        )


def where_it_goes(parser, message):
    """For "unrecognized arguments": the commands that do take the switch given (a switch of
    `hooks` typed on `start`), or that a split JSON value wants quotes; else ""."""
    words = message.removeprefix("unrecognized arguments: ").split()
    if not message.startswith("unrecognized arguments: "):
        return ""
    if any(w.startswith(("{", "[")) or w.endswith(("}", "]")) for w in words):
        return '; the shell split a JSON value at its spaces: quote it, like \'{"title": "t"}\''
    said = []
    for switch in (w.split("=")[0] for w in words if w.startswith("--")):
        names = [name for name, sub in commands(parser) if switch in sub._option_string_actions]
        shown = names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else [])
        if shown:
            listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
            said.append(f"{switch} is an option of {listed}")
    return f"; {'; '.join(said)}" if said else ""


def commands(parser, prefix=""):
    """(name, parser) of every subcommand under parser, nested ones as "outbox start" (read
    from argparse's own records of them: _subparsers, _option_string_actions)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in getattr(action, "choices", {}).items():
            yield f"{prefix}{name}", sub
            yield from commands(sub, f"{prefix}{name} ")


def build_parser(prog="workflow.py"):
    """The CLI's parser; parser.actions holds its subcommands, for a caller to extend."""
    parser = Parser(prog=prog, description=__doc__.split("\n")[0])
    parser.set_defaults(prog=prog, graph_command=False, resume="resume", unkeyed=lambda _: False)
    parser.set_defaults(effects=effects.declared(globals()))  # what reconcile can look up
    parser.set_defaults(program=Program(), durability="sync", no_contract=False)
    parser.actions = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    thread = dict(default=Defaulted("demo"), help="checkpoint thread id (default: demo)")
    operation = dict(default="case-001:open-ticket:v1", help="operation id, used as the key")
    title = dict(default="Check supplier configuration", help="ticket title")
    for name, action in [("start", start), ("resume", resume)]:
        sub = parser.actions.add_parser(name, help=f"{name} a run")
        sub.set_defaults(run=action, graph_command=True)
        sub.add_argument("--thread", **thread)
        if name == "start":
            sub.add_argument("--operation", **operation)
            sub.add_argument("--title", **title)
    sub = parser.actions.add_parser("migrate", help="move a thread to this code's contract")
    sub.set_defaults(run=migrate)
    sub.add_argument("--thread", **thread)
    sub = parser.actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=state)
    sub.add_argument("--thread", **thread)
    sub = parser.actions.add_parser("reconcile", help="settle the ledger's open effects")
    sub.set_defaults(run=reconcile)
    sub.add_argument("--confirmed", nargs="+", default=[], metavar="KEY", help="it happened")
    sub.add_argument("--not-sent", nargs="+", default=[], metavar="KEY", help="it did not")
    sub = parser.actions.add_parser("tickets", help="list the receiver's tickets")
    sub.set_defaults(run=tickets)
    sub.add_argument("--operation", default=None, help="only the ticket with this key")
    sub = parser.actions.add_parser("post", help="send one keyed ticket request, without the graph")
    sub.set_defaults(run=post)
    sub.add_argument("--operation", **operation)
    sub.add_argument("--title", **title)
    return parser


def main(argv=None, environ=None, parser=None, points=POINTS):
    """The CLI; returns the exit code. environ: the settings (default: os.environ); parser and
    points: those of a program that wraps this CLI with switches of its own."""
    import failpoints

    args = (parser or build_parser()).parse_args(argv)
    args.thread_defaulted = isinstance(getattr(args, "thread", None), Defaulted)
    if args.thread_defaulted:
        args.thread = str(args.thread)  # a plain str for the savers' drivers
    settings = Settings()
    try:
        settings = Settings.from_environ(os.environ if environ is None else environ)
        try:
            failpoints.configure(settings.failpoints, known=points, announce=announce)
        except FailpointSpecError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        try:
            tracing.start(settings.trace, "workflow")
        except tracing.TracingError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        key_receipts(settings)
        require_text(args)
        exit_code = args.run(args, settings)
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            body = json.loads(body)
        except ValueError:
            body = body.decode("utf-8", "replace")
        emit("http_error", status=error.code, body=body)
        if not isinstance(body, dict):  # api.py answers every error in JSON: another server
            hint = resume_hint(args, settings, "once API_URL names the receiver")
            print(
                f"{args.prog}: the server at {settings.api_url} answered {error.code} without "
                f"the receiver's JSON: API_URL (its port) names another program{hint}",
                file=sys.stderr,
            )
            return EXIT_HTTP_ERROR
        if error.code in DID_NOTHING:  # the receiver's JSON, and nothing made: the key is free
            why = f"the receiver at API_URL {settings.api_url} answered {error.code}"
            hint = resume_hint(args, settings, "once API_URL names the receiver and lets you in")
            print(
                f"{args.prog}: {why}: nothing was made, and the key is still free; check "
                f"API_URL (its host, port and path) and its credentials{hint}",
                file=sys.stderr,
            )
        if error.code == 503:  # busy past every try: rolled back each time, so nothing committed
            tries = settings.attempts * BUSY_TRIES_PER_ATTEMPT
            why = f"the receiver stayed busy (503) for {tries} tries; nothing was committed"
            hint = resume_hint(args, settings, "once the receiver can write")
            print(f"{args.prog}: {why}{hint}", file=sys.stderr)
        return EXIT_HTTP_ERROR
    except effects.LedgerError as error:
        print(f"{args.prog}: {error}", file=sys.stderr)
        return ledger_exit(error)
    except UserError as error:
        unreachable = isinstance(error, Unreachable)
        hint = resume_hint(args, settings, "once the receiver answers") if unreachable else ""
        print(f"{args.prog}: {error}{default_thread(args, error)}{hint}", file=sys.stderr)
        return error.exit_code
    except sqlite3.DatabaseError as error:  # not a database, read-only, a locked file, ...
        where = f"{args.prog}: CHECKPOINT_DB {settings.checkpoint_db!r}: {error}"
        if unwritable(error):
            hint = ""
            if args.graph_command and (found := saved(args, settings)) is not None:
                hint = "; its request may have taken effect before the save failed"
                hint += (
                    f"; once CHECKPOINT_DB can be written, {goes_on(args, found)}" if found else ""
                )
            print(f"{where}{hint}", file=sys.stderr)
            return EXIT_CHECKPOINT_WRITE
        print(where, file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as error:  # a Python without requirements.txt's packages
        print(
            f"{args.prog}: {sys.executable} has no {error.name}; use the Python that has the "
            "requirements installed (natively .venv/bin/python) or Docker",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted{interrupted_hint(args, settings)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if not lost_postgres(error):
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = interrupted_hint(args, settings, "once CHECKPOINT_DB answers")
        print(
            f"{args.prog}: CHECKPOINT_DB stopped answering ({reason}); what it committed "
            f"stays (the checkpoints, the ledger's rows){hint}",
            file=sys.stderr,
        )
        return EXIT_NO_ANSWER
    return exit_code or 0


UNWRITABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL}  # SQLite's primary result codes
# and the extended ones of an open file that can no longer be written: made immutable (chattr +i
# gives SQLITE_IOERR_WRITE at the commit, seen with SQLite 3.40), or a disk that fails its writes
UNWRITABLE_IO = {
    sqlite3.SQLITE_IOERR_WRITE,
    sqlite3.SQLITE_IOERR_FSYNC,
    sqlite3.SQLITE_IOERR_DIR_FSYNC,
    sqlite3.SQLITE_IOERR_TRUNCATE,
}


def unwritable(error):
    """True for a SQLite error that says the file cannot be written (not: cannot be read)."""
    code = getattr(error, "sqlite_errorcode", 0)
    return (code & 0xFF) in UNWRITABLE or code in UNWRITABLE_IO


def lost_postgres(error):
    """True for psycopg's OperationalError (a connection lost, a server restarting), without
    importing psycopg: commands on SQLite never load it."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(error, psycopg.OperationalError)


def ledger_exit(error):
    """The exit code of an effects.LedgerError."""
    if isinstance(error, effects.Unsettled):
        return EXIT_UNSETTLED
    if isinstance(error, effects.InFlight):  # another live process: as a thread it runs
        return EXIT_THREAD
    if isinstance(error, effects.Damaged):
        return EXIT_LEDGER_DAMAGED
    if isinstance(error, effects.NotText):
        return EXIT_USAGE
    return EXIT_HTTP_ERROR


def key_receipts(settings):
    """LEDGER_RECEIPT_KEY and LEDGER_RECEIPT_UNKEYED for this process's ledger (effects.py)."""
    try:
        effects.key_receipts(settings.receipt_key, settings.receipt_unkeyed)
    except ValueError as error:
        raise UserError(str(error), EXIT_USAGE) from None


def require_text(args):
    """Refuse an argument that is not UTF-8 text (`--title $'bad\\xff'`): Python holds its bytes
    as lone surrogates, which no JSON, hash or database here can take. Before anything runs."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode()
            except UnicodeEncodeError:
                shown = text.encode("utf-8", "surrogateescape")
                raise UserError(
                    f"--{name.replace('_', '-')} {shown!r} is not UTF-8 text; nothing was run",
                    EXIT_USAGE,
                ) from None


def resume_hint(args, settings, when):
    """A run that stopped before its effect was saved (no receiver, a receiver busy past every
    try, a checkpoint that could not be written) has saved its thread already (prepare ran):
    typed again, start would say the thread exists. Name the command that goes on from it."""
    if not args.graph_command or not saved(args, settings):
        return ""  # not a run, no checkpoint, or none that can be read
    return f"; the run is saved: {when}, {args.resume} --thread {args.thread}"


class Defaulted(str):
    """A --thread the user did not type: its default, which an error line then says it is."""


def default_thread(args, error):
    """ " (no --thread given: 'demo' is its default)", for a line that finds no such thread: a
    name the user never typed. (One that exists, they made with that default.)"""
    if args.thread_defaulted and str(error).startswith(f"no thread {args.thread!r}"):
        return f" (no --thread given: {args.thread!r} is its default)"
    return ""


def saved(args, settings):
    """The thread's saved values ({} when it has no checkpoint); None when that cannot be told."""
    try:
        with open_checkpointer(settings.checkpoint_db) as saver:
            found = saver.get_tuple(thread_config(args.thread))
    except Exception:  # noqa: BLE001 (a second failure must not hide the first)
        return None
    return found.checkpoint["channel_values"] if found else {}


def interrupted_hint(args, settings, unknown_when=None):
    """What is true after Ctrl-C: a graph command may have sent its request; was it saved?
    unknown_when: what to say when that cannot be told (a lost CHECKPOINT_DB)."""
    if not args.graph_command:
        return ""
    hint = "; a request in flight may have taken effect"
    found = saved(args, settings)
    if found is None:
        if unknown_when:
            return f"{hint}; {unknown_when}, {args.resume} --thread {args.thread}"
        return hint
    if found:
        return f"{hint}; {goes_on(args, found)}"
    return f"{hint}; thread {args.thread!r} has no checkpoint yet: start it again"


def goes_on(args, values):
    """The command that goes on from a checkpoint whose request may have taken effect, or, for
    a run that sends it without a key (args.unkeyed), why none does so safely."""
    if args.unkeyed(values):  # a resume sends it again, and nothing tells it from a new one
        return f"it sends no key, so {args.resume} would send it again: look at the receiver first"
    return f"resume it with: {args.resume} --thread {args.thread}"


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # main() has its own line for Ctrl-C
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before main() took over (while it parsed the arguments)
        print("workflow.py: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
