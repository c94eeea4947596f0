"""Labs 01-06: where the key comes from (--mode) and the lost acknowledgement (--crash-at lost-ack).

    --mode naive      no key: every attempt is a new ticket
    --mode safe       the key from the run's input, without the ledger
    --mode node-uuid  a fresh key minted inside the node: looks keyed, still duplicates on resume
    --mode ledger     the core's create_ticket (workflow.py), through the effect ledger (default)
    --crash-at POINT  the run dies there (SIGKILL): after-prepare, before-request, after-send,
                      after-ack, after-checkpoint (workflow.py's points); lost-ack is no kill:
                      the request carries a Failpoint-Token and a receiver run with
                      FAILPOINTS=before-answer=drop-answer commits it and drops its answer (lab 06)

create_ticket_by_mode is the node the lab's graph (labs/lab_graph.py) runs as create_ticket.
"""

import uuid
from typing import NotRequired

import exitcodes
import workflow
from exitcodes import emit
from failpoints import fail
from labs.conditions import say

MODES = ("naive", "safe", "node-uuid", "ledger")  # ledger: the core's; the others, lessons
CRASH_POINTS = (
    "after-prepare",
    "before-request",
    "after-send",
    "lost-ack",
    "after-ack",
    "step-boundary",
    "after-checkpoint",
)
FAILPOINT_TOKEN = "Failpoint-Token"  # labs/receiver.py's before-answer point fires once per token
KEYLESS_MODES = ("lookup-resend",)  # lab 15's payment mode (labs/keyless.py): the ticket as ledger


class LabTicketState(workflow.State):
    """workflow.State and what the lessons' switches add to a ticket run."""

    mode: NotRequired[str]
    approval: NotRequired[str]
    approved: NotRequired[bool]
    authorized: NotRequired[str | None]  # --approval before: the approval it was sent under
    notify: NotRequired[bool]  # --notify: labs/keyless.py
    message_id: NotRequired[int | None]
    pay: NotRequired[bool]  # --pay: labs/keyless.py
    payment_id: NotRequired[int | None]
    key_version: NotRequired[str]  # the key derivation migrate kept: labs/contract.py


def create_ticket_by_mode(state: LabTicketState, runtime):
    """The core's create_ticket (--mode ledger), or a lesson's: the request sent with the key
    --mode picks (none, the run's, a fresh one) and nothing recorded before it leaves."""
    if state["mode"] in ("ledger", *KEYLESS_MODES):  # the ticket as the core makes it
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


def emit_effect_outcome(event, done, key, **values):
    """An effect's line, as workflow.create_ticket says it: the receiver's answer (created) when
    the request was sent; else how it was answered without a request (how: receipt, the
    ledger's; adopted, what the receiver holds under the key), and the key."""
    if done.how == "sent":
        emit(event, created=done.answer["created"], **values)
    else:
        emit(event, how=done.how, key=key, **values)


class LostAckClient(workflow.TicketClient):
    """--crash-at lost-ack: the request names a token, and a receiver whose before-answer
    failpoint is set to drop-answer commits it and hangs up, once per token. An answer to that
    request says the lesson's condition is missing (missing: the line that says so)."""

    def __init__(self, client, token, missing):
        super().__init__(
            client.url, client.timeout_s, client.attempts, {FAILPOINT_TOKEN: token}, client.name
        )
        self.label, self.first = client.label, True  # named as its provider is ("the receiver")
        self.missing = missing

    def create(self, title, key=None):
        first, self.first = self.first, False
        result = super().create(title, key)
        if first:  # an answer came to the request that was to lose it: no fault happened
            say(self.missing)
        return result
