"""A lesson whose condition is missing says so, in one line on stderr, and the run goes on: lab 06's
lost answer that came (the receiver started without labs/lost-ack.compose.yaml), lab 15's
payment answered in time (the receiver started without labs/slow-payments.compose.yaml, or a
client that waits longer than its late commit: no API_TIMEOUT_S=0.5), lab 18's webhooks each
delivered once (the receiver started without labs/webhooks.compose.yaml). The line names the
whole command that adds the condition, then the one that runs the lesson again with it (a new
payment; the ticket moved again), natively and through Docker (exitcodes.Typed's form): typed as
printed, they make it happen (tests/workflow/test_hints_as_printed.py)."""

import shlex
import sys

from labs.threads import COMPOSE, LABS, typed_as

# What each override file sets for the api service (tests/guides checks them against the files):
# natively, the receiver started again with it in front (docs/native.md's table).
LOST_ACK = ("labs/lost-ack.compose.yaml", {"FAILPOINTS": "before-answer=drop-answer"})
SLOW_PAYMENTS = ("labs/slow-payments.compose.yaml", {"FAILPOINTS": "payment-commit=sleep(3)"})
WEBHOOK_FAULTS = ("labs/webhooks.compose.yaml", {"FAILPOINTS": "redeliver=on;reorder=on"})
SLOW_COMMIT_S = 3.0  # payment-commit=sleep(3): a charge is answered 3 s after it was accepted
LESSON_TIMEOUT_S = "0.5"  # lab 15's runs: API_TIMEOUT_S=0.5, well under the late commit
RECEIVER_LOG = "2>>data/receiver.log & echo $! >data/receiver.pid"  # docs/native.md's `up`


def receiver_with(override):
    """The whole command that starts the receiver again with an override file (file, its
    environment): natively, then its Docker form (the guide's `up` line)."""
    file, environ = override
    native = "".join(f"{k}={shlex.quote(v)} " for k, v in environ.items())
    native = f"kill %1; wait; {native}python -m labs.receiver {RECEIVER_LOG}"
    return f"{native} (Docker: {COMPOSE} -f compose.yaml -f {file} up -d --build api)"


def lost_answer_missing(thread, operation, mode):
    """The line for lab 06's `--crash-at lost-ack` request that got its answer: the receiver
    drops one answer per thread, only with the lesson's failpoint on. It names what turns it on,
    then the same run on a new thread (this one's answer already came)."""
    words = f"start --thread {shlex.quote(thread + '-again')}"
    if operation:  # case-lost:open-ticket:v1 -> case-lost-again:open-ticket:v1
        head, colon, rest = operation.partition(":")
        words += f" --operation {shlex.quote(f'{head}-again{colon}{rest}')}"
    words += f" --mode {mode}" if mode else ""  # a resume's: start's default, ledger
    again = LABS(f"{words} --crash-at lost-ack")
    return (
        "--crash-at lost-ack: the receiver answered anyway, so lab 06's lost answer did not "
        f"happen: it was not started with {LOST_ACK[0]}, or it already dropped an answer for "
        f"thread {thread!r}; turn it on: {receiver_with(LOST_ACK)}; then a new thread: {again}"
    )


def slow_payment_missing(answered_s, timeout_s, thread, values):
    """The line for a lab 15 payment that was answered (answered_s after it was sent, by a client
    that waits timeout_s), or None when nothing was missing: the receiver committed at once (no
    late commit), or the client waited out the late commit (API_TIMEOUT_S too long). It names
    what adds each, and the start of a new operation with the lesson's timeout."""
    missing = []
    if answered_s < SLOW_COMMIT_S:
        missing.append(
            f"the receiver commits at once (it was not started with {SLOW_PAYMENTS[0]}): "
            f"{receiver_with(SLOW_PAYMENTS)}"
        )
    if timeout_s >= SLOW_COMMIT_S:
        missing.append(
            f"API_TIMEOUT_S is {timeout_s:g}, longer than the late commit's {SLOW_COMMIT_S:g} s "
            f"(the lesson's runs set {LESSON_TIMEOUT_S})"
        )
    if not missing:
        return None
    operation = f"{values['operation_id']}-again"
    words = f"start --thread {shlex.quote(thread + '-again')} --operation {shlex.quote(operation)}"
    words += " --pay" + (f" --mode {values['mode']}" if values.get("mode") != "ledger" else "")
    again = typed_as("labs", "workflow", {"API_TIMEOUT_S": LESSON_TIMEOUT_S})(words)
    return (
        f"lab 15's slow provider did not happen: the payment was answered in {answered_s:.1f} s, "
        f"so nothing timed out and the ledger had nothing to decide; {'; and '.join(missing)}; "
        f"then a new operation: {again}"
    )


def webhook_faults_missing(taken, again):
    """The line for a lab 18 hooks that took deliveries (the event ids answered 2xx, in order),
    each once: the receiver's webhook faults are off (redeliver=on sends each event twice). None
    when nothing came, or an event came twice. again: the whole command that moves the ticket
    once more, to be typed after the restart (the events taken are not delivered again)."""
    if not taken or len(set(taken)) < len(taken):
        return None
    came = f"{len(taken)} {'delivery' if len(taken) == 1 else 'deliveries'}"
    return (
        f"each webhook came once ({came}): the receiver's webhook faults are off (it was not "
        f"started with {WEBHOOK_FAULTS[0]}), so lab 18's duplicate did not happen; turn them "
        f"on: {receiver_with(WEBHOOK_FAULTS)}; then move the ticket again: {again}"
    )


def say(line, prog="labs"):
    """A missing condition's line on stderr; the run goes on."""
    if line:
        print(f"{prog}: {line}", file=sys.stderr)
