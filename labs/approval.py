"""Lab 07: the approval that runs twice. --approval [in-node|own-node|before] asks a human and
waits with interrupt(); `approve [--reject]` answers.

in-node (the trap): the effect's node waits, so the answer re-runs it from its first line and its
request goes again (unless keyed). own-node: the effect's node has returned before the wait, so
only the wait repeats. The ask itself is an effect (a ticket keyed OPERATION:approval) through
the ledger in every --mode.

before: the approval comes first and is bound to what was reviewed: `approve` records, in the
approvals table beside the checkpoints, the sha256 of the exact request the ticket will send
(the ledger's request_hash), who approved and until when. The ticket is APPROVED_TICKET, whose
authorize (effects.Effect) reloads that approval just before each send and refuses, exit 77,
when the request differs, or the approval expired or was revoked; the ledger's row keeps the
approval it was sent under (authorized). `edit` changes a saved run's title, `revoke` withdraws
an approval.
"""

import argparse
import dataclasses
import shlex
import sys
import time

import effects
import workflow
from exitcodes import EXIT_THREAD, EXIT_USAGE, UserError, command, emit
from failpoints import fail
from labs.contract import KEY_DERIVATIONS, KEY_VERSION
from labs.modes import create_ticket_by_mode, emit_effect_outcome

APPROVAL_SHAPES = ("in-node", "own-node", "before")  # where --approval waits for a human
EXIT_NOT_AUTHORIZED = 77  # the approval does not cover the request about to leave (EX_NOPERM)
APPROVAL_TTL_S = 3600.0  # how long an approval authorizes, unless approve --valid-for says
APPROVAL_POINTS = ("after-approval", "before-refusal", "after-intent", "after-receipt")  # kills
COLUMNS = {"approvals": {"id", "key", "thread", "digest", "approver", "until", "revoked_at"}}
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
    if approving and not waiting and asks_again(snapshot):  # edited while it waited
        raise UserError(
            f"thread {args.thread!r} has not asked since its request changed; "
            f"{command(f'resume --thread {shlex.quote(args.thread)}')} asks again",
            EXIT_THREAD,
        )
    if approving and not waiting and not refused_before_send(snapshot):
        raise UserError(f"thread {args.thread!r} is not waiting for approval", EXIT_THREAD)
    if waiting and not approving:
        raise UserError(
            f"thread {args.thread!r} waits for approval; answer with "
            f"{command(f'approve --thread {shlex.quote(args.thread)}')} (or --reject)",
            EXIT_THREAD,
        )


# ------------------------------------------------------------- before: bound to what was reviewed


def ticket_request(state):
    """The exact request the ticket sends (workflow.create_ticket's): what an approval binds."""
    return {"title": state["title"]}


def short(digest):
    return f"sha256:{digest[:12]}"


def ask_first(state, runtime):
    """--approval before: ask about the ticket's exact request, and wait. The ask names the
    operation, not the title, so a run whose title changed asks once still (its receipt)."""
    from langgraph.types import interrupt

    request = ticket_request(state)
    key = f"{state['operation_id']}:approval"
    ask = {"title": f"Approval wanted: {state['operation_id']}"}
    done = APPROVAL.perform(runtime.context.ledger, key, ask, runtime.context.client)
    emit_effect_outcome("approval_requested", done, key, request_id=done.answer["ticket_id"])
    approved = interrupt({"request": request, "digest": short(effects.request_hash(request)[1])})
    emit("approval", approved=approved)
    return {"approved": bool(approved)}


def after_approval(state):
    """Where --approval before goes on: to the ticket once approved, else to the end."""
    return "send" if state.get("approved") else "end"


def send_approved(state, runtime):
    """--approval before's ticket: through the ledger, checked against its approval just before
    it leaves (APPROVED_TICKET.authorize). The line and the state name the approval, as the
    ledger's row keeps it."""
    from langgraph.config import get_config

    fail("before-request")
    ledger, thread = runtime.context.ledger, get_config()["configurable"]["thread_id"]
    request = ticket_request(state)
    done = APPROVED_TICKET.perform(ledger, state["key"], request, runtime.context.client, thread)
    authorized = ledger.get(state["key"]).authorized
    said = {"authorized": authorized, "ticket_id": done.answer["ticket_id"]}
    if done.how == "sent":
        emit("effect_ack", created=done.answer["created"], **said)
    else:  # the ledger's receipt, or what the receiver holds under the key
        emit(f"effect_{done.how}", key=state["key"], **said)
    fail("after-ack")
    return said


def authorize_ticket(ledger, key, request):
    """APPROVED_TICKET's authorize: the key's newest approval, reloaded now, must be for this
    very request (its sha256), unexpired and not revoked; else nothing is sent (exit 77)."""
    digest, now = effects.request_hash(request)[1], time.time()
    found = newest_approval(ledger, key)
    if found is None:
        why = "no approval is recorded for it"
    elif found["revoked_at"] is not None:
        why = f"approval {found['id']} was revoked"
    elif now >= found["until"]:
        why = f"approval {found['id']} expired at {when(found['until'])}"
    elif found["digest"] != digest:
        why = (
            f"approval {found['id']} is for request {short(found['digest'])} and the request "
            f"now is {short(digest)}"
        )
    else:
        return f"approval {found['id']} ({short(digest)}, by {found['approver']})"
    fail("before-refusal")  # the intent recorded, nothing sent, the refusal not yet recorded
    thread = shlex.quote(ledger.row(key)["thread"])
    review = command(f"state --thread {thread}")
    again = command(f"approve --thread {thread}")  # by the login: --by names another reviewer
    raise UserError(
        f"ticket {key!r} not sent: {why}; review it: {review}; re-approve: {again}",
        EXIT_NOT_AUTHORIZED,
    )


APPROVED_TICKET = dataclasses.replace(
    workflow.ticket, name="approved_ticket", authorize=authorize_ticket
)


def record_approval(ledger, key, thread, request, approver, valid_for_s):
    """A new approval of request (its sha256) for key, valid for valid_for_s: its id."""
    digest, now = effects.request_hash(request)[1], time.time()
    with ledger.transaction():
        make_table(ledger)
        row = ledger.sql(
            "INSERT INTO approvals (key, thread, digest, request, approver, at, until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (key, thread, digest, effects.request_hash(request)[0], approver, now,
             now + valid_for_s),
        ).fetchone()  # fmt: skip
    emit(
        "approval_recorded",
        approval=row["id"],
        by=approver,
        digest=short(digest),
        request=request,
        until=when(now + valid_for_s),
    )
    return row["id"]


def newest_approval(ledger, key):
    with ledger.transaction():
        make_table(ledger)
        row = ledger.sql(
            "SELECT * FROM approvals WHERE key = ? ORDER BY id DESC LIMIT 1", (key,)
        ).fetchone()
    return None if row is None else dict(row)


def make_table(ledger):
    """The approvals table, beside the checkpoints and the ledger (made on first use)."""
    postgres = isinstance(ledger, effects.PostgresLedger)
    ident = "BIGINT GENERATED ALWAYS AS IDENTITY" if postgres else "INTEGER"
    ledger.sql(
        f"""CREATE TABLE IF NOT EXISTS approvals (
    id {ident} PRIMARY KEY,
    key TEXT NOT NULL,  -- the effect's idempotency key: what it authorizes
    thread TEXT NOT NULL,
    digest TEXT NOT NULL,  -- sha256 of the canonical JSON of the request reviewed
    request TEXT NOT NULL,  -- that request
    approver TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    until DOUBLE PRECISION NOT NULL,  -- past it, it authorizes nothing
    revoked_at DOUBLE PRECISION
)"""
    )


def when(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def approve_bound(args, snapshot, ledger):
    """`approve` of a --approval before run: record the approval of the request it will send
    (the one shown while it waits, else, after a refusal, its request now) before it goes on.
    The graph's input: the answer to a wait, else None (a plain resume)."""
    from langgraph.types import Command

    waiting = bool(snapshot.interrupts)
    if not args.approve:
        return Command(resume=False)
    values = snapshot.values
    request = snapshot.interrupts[0].value["request"] if waiting else ticket_request(values)
    key = ticket_key(values, args.key_version)  # the key the send checks it under
    record_approval(ledger, key, args.thread, request, args.by, args.valid_for)
    fail("after-approval")  # the approval recorded, the run not resumed yet
    return Command(resume=True) if waiting else None


def ticket_key(values, deployed):
    """The key a saved run's ticket is sent and checked under: derived as its node derives it
    (labs/contract.py's derive_keys), by its pinned key_version or the deployed one."""
    return KEY_DERIVATIONS[values.get(KEY_VERSION) or deployed](values)


def refused_before_send(snapshot):
    """Whether a --approval before run stopped at its ticket: approve may approve it again."""
    values = snapshot.values or {}
    return values.get("approval") == "before" and values.get("approved") and bool(snapshot.next)


def edit_title(args, graph, contract):
    """`edit`: the title a saved run will send, changed (a person editing the draft, or a
    deploy that builds the request anew, does the same to an approval given before)."""
    from checkpoints import thread_config

    snapshot = graph.get_state(thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    if not snapshot.next:
        raise UserError(f"thread {args.thread!r} is done; nothing will send its title", EXIT_THREAD)
    config = {**thread_config(args.thread), "metadata": {"contract": contract}}  # kept as it was
    graph.update_state(config, {"title": args.title})  # a wait's question is dropped with it
    emit("edited", thread=args.thread, title=args.title)
    if snapshot.interrupts:  # the question shown was about the request before the edit
        resume = command(f"resume --thread {shlex.quote(args.thread)}")
        print(f"labs: the request changed while it waited: {resume} asks again", file=sys.stderr)


def asks_again(snapshot):
    """Whether a --approval before run was edited while it waited: its question is gone, and
    its approval node, run again, asks about the request as it is now."""
    values = snapshot.values or {}
    return values.get("approval") == "before" and list(snapshot.next) == ["approval"]


def seconds(text):
    """approve --valid-for: seconds, finite and not negative (0: expired at once)."""
    if not 0 <= float(text) < float("inf"):  # nan compares false too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, 0 or more")
    return float(text)


def reviewer(text):
    """approve --by: who approves. An approval records a person, so a blank name is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an approval records who gave it: --by NAME")
    return text


def revoke(args, ledger, values):
    """`revoke`: the thread's newest approval withdrawn; its ticket is not sent under it, unless
    it was sent already: then the line says so ("sent": true and a note), too late."""
    bound = values.get("approval") == "before"
    found = newest_approval(ledger, ticket_key(values, args.key_version)) if bound else None
    if found is None:
        raise UserError(f"thread {args.thread!r} has no approval to revoke", EXIT_THREAD)
    if found["revoked_at"] is not None:  # typed twice: say which, and that nothing changed
        raise UserError(
            f"thread {args.thread!r}: approval {found['id']} was revoked already; nothing changed",
            EXIT_THREAD,
        )
    with ledger.transaction():
        ledger.sql("UPDATE approvals SET revoked_at = ? WHERE id = ?", (time.time(), found["id"]))
    state = getattr(ledger.get(found["key"]), "state", None)  # None: no intent recorded yet
    sent = state == "confirmed"
    note = "too late: its ticket was sent" if sent else "its ticket may have been sent already"
    late = {"note": note} if sent or state in effects.OPEN else {}  # open: a kill mid-send's
    emit("revoked", approval=found["id"], sent=sent, **late)


def require_ledger_mode(args):
    if args.approval == "before" and args.mode != "ledger":
        raise UserError(
            f"--approval before checks the approval in the ledger: drop --mode {args.mode}",
            EXIT_USAGE,
        )
