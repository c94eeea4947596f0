"""Lab 15: providers that take no key. --notify sends a message (POST /messages: no key, no
lookup), --pay a payment (POST /payments: no key, a lookup by reference, committed late); both go
through the ledger, declared once each (MESSAGE, PAYMENT). `messages` and `payments` list what the
receiver holds. --mode lookup-resend is the payment without the settle rule: a second charge.
"""

import dataclasses
import time
import urllib.parse

import effects
import providers
import workflow
from exitcodes import emit, looking
from labs.conditions import say, slow_payment_missing
from labs.modes import KEYLESS_MODES

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
    look_with=looking("messages"),  # python -m labs messages (Docker: ...)
)


def notify_about_ticket(state, runtime):
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
    builder.add_node("notify", notify_about_ticket)
    builder.add_edge(after, "notify")
    return "notify"


def list_messages(args, settings):
    emit("messages", messages=settings.client().call("/messages")["messages"])


def add_message_parser(parser):
    """--notify on start, `messages`, and the lab's effects for reconcile."""
    parser.set_defaults(effects={**parser.get_default("effects"), MESSAGE.name: MESSAGE})
    parser.actions.choices["start"].add_argument(
        "--notify", action="store_true", help="send a message about the ticket after it (lab 15)"
    )
    sub = parser.actions.add_parser("messages", help="list the receiver's messages (lab 15)")
    sub.set_defaults(run=list_messages)


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
# without that rule: nothing found, sent again, a second charge.

PAYMENT_AMOUNT = 1200  # cents, the same for every lab payment
PAYMENT_SETTLE_S = 10.0  # what the provider promises: a charge it accepted is committed by then

PAYMENT = effects.Effect(
    "payment",
    send=lambda client, request, key: client.call("/payments", request),  # no key: none is read
    lookup=lambda client, key: payment_by_reference(client, key),
    external_id=lambda answer: answer["payment_id"],
    not_sent=providers.did_nothing,
    refused=providers.refusal,
    keyed=False,  # a resend is a second charge
    settle_s=PAYMENT_SETTLE_S,
    answer_of=lambda payment_id: {"payment_id": int(payment_id)},  # reconcile --confirmed KEY=ID
    look_with=looking("payments --reference {key}"),
)


def pay_for_operation(state, runtime):
    """Charge once for the operation, through the ledger; the reference is the ledger's key."""
    key = f"{state['key']}:pay"
    request = {"reference": key, "amount": PAYMENT_AMOUNT}
    effect = PAYMENT
    if state["mode"] in KEYLESS_MODES:  # the lesson's: any empty lookup counts as proof
        effect = dataclasses.replace(PAYMENT, keyed=True)  # which this provider is not
    sent_at = time.monotonic()
    done = effect.perform(runtime.context.ledger, key, request, runtime.context.client)
    if done.how == "sent":
        emit("payment_sent", key=key, payment_id=done.answer["payment_id"])
        answered_s, timeout_s = time.monotonic() - sent_at, runtime.context.client.timeout_s
        from langgraph.config import get_config  # in a node: LangGraph is loaded already

        thread = get_config()["configurable"]["thread_id"]  # the run's, for a new one's name
        say(slow_payment_missing(answered_s, timeout_s, thread, state))  # the lesson's, if not
    else:  # adopted (found by the lookup) or the receipt (the provider is not called)
        emit(f"effect_{done.how}", key=key, payment_id=done.answer["payment_id"])
    return {"payment_id": done.answer["payment_id"]}


def payment_by_reference(client, reference):
    """The lookup: the first charge committed under reference, or None (none yet)."""
    query = urllib.parse.urlencode({"reference": reference})
    found = client.call(f"/payments?{query}")["payments"]
    return {"payment_id": found[0]["payment_id"]} if found else None


def add_pay(builder, after):
    builder.add_node("pay", pay_for_operation)
    builder.add_edge(after, "pay")
    return "pay"


def list_payments(args, settings):
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
    sub.set_defaults(run=list_payments)
