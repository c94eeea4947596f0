"""Lab 15's keyless effect: a message about the ticket (labs/cli.py --notify) to a provider that
reads no key and offers no lookup (labs/receiver.py's POST /messages).

A real SIGKILL in the message's window (after the provider answered, before the receipt was
written): the resume must stop with exit 6 and one line naming reconcile, not send a second
message; a person's --not-sent then lets it send once. The --confirmed path (the resume sends
nothing) is lab 15's guide, which tests/guides runs in both backends. labs/receiver.py on a
loopback port; labs/cli.py as a process where it is killed, in-process else.
"""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from workflow_helpers import events, names

import exitcodes
from tools.local import shell_exit_code

KILLED = 137
OP = "case-note:open-ticket:v1"
KEY = f"{OP}:notify"  # lab.notify's key: the operation's, for the message


def messages(workflow):
    return events(workflow("messages"))[0]["messages"]


def messages_sent(lab):
    """The receiver's own count of POST /messages (its /metrics)."""
    with urllib.request.urlopen(lab["API_URL"] + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families["receiver_messages_sent"].samples[0].value


def killed_in_the_messages_window(workflow):
    """A thread whose message was sent and whose run died before its receipt was written."""
    first = workflow("start", "--operation", OP, "--mode", "ledger", "--notify", "--crash")
    assert shell_exit_code(first.returncode) == KILLED  # after the ticket: before the message
    second = workflow("resume", "--crash-at", "after-send")
    assert shell_exit_code(second.returncode) == KILLED
    assert names(second) == ["effect_receipt", "crash"]  # the ticket's receipt, then the kill
    assert [m["text"] for m in messages(workflow)] == ["ticket 1 opened"]
    assert events(workflow("state"))[0]["next"] == ["notify"]


def test_a_kill_in_the_messages_window_stops_the_resume_until_a_person_settles_it(
    receiver, workflow, lab
):
    killed_in_the_messages_window(workflow)
    stopped = workflow("resume")
    assert stopped.returncode == exitcodes.EXIT_UNSETTLED == 6
    assert stopped.stdout == ""  # no message_sent: nothing went out
    assert stopped.stderr.count("\n") == 1
    assert (
        f"if it happened, python -m labs reconcile --confirmed {KEY}=ID (Docker: docker compose "
        f"-p stateful-lab run --rm workflow reconcile --confirmed {KEY}=ID) (ID: the provider's); "
        f"if it did not, python -m labs reconcile --not-sent {KEY} (Docker:" in stopped.stderr
    )
    assert "look with python -m labs messages (Docker: docker compose" in stopped.stderr
    assert len(messages(workflow)) == messages_sent(lab) == 1  # no second message

    # A person's mistakes write nothing: each is one line, and the key stays unknown.
    for mistake, code in [
        (("--confirmed", KEY), exitcodes.EXIT_USAGE),  # no id: a receipt the node could not read
        (("--confirmed", f"{KEY}=1", "--not-sent", KEY), exitcodes.EXIT_THREAD),  # both
        (("--not-sent", KEY, "no-such-key"), exitcodes.EXIT_THREAD),  # one key of two is wrong
        (("--confirmed", f"{KEY}=one"), exitcodes.EXIT_USAGE),  # not a message id
    ]:
        refused = workflow("reconcile", *mistake)
        assert (refused.returncode, refused.stdout) == (code, ""), (mistake, refused)
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert ": nothing was settled: " in refused.stderr, refused.stderr
    assert workflow("resume").returncode == 6  # still unknown: nothing was settled
    early = workflow("reconcile", "--correct", f"{KEY}=1")  # open: --confirmed is the word
    assert early.returncode == exitcodes.EXIT_THREAD and "not confirmed (unknown)" in early.stderr
    assert f"reconcile --confirmed {KEY}=ID (Docker:" in early.stderr, early.stderr

    listed = events(workflow("reconcile"))
    assert listed[0] == {
        "effect": "message",
        "event": "reconciled",
        "key": KEY,
        "now": "needs a person",
        "was": "unknown",
    }
    assert listed[1]["count"] == 1
    assert workflow("resume").returncode == 6  # listing it settles nothing

    # the person found no message; --wait: once the receiver's settle time is over
    settled = workflow("reconcile", "--not-sent", KEY, "--wait")
    assert settled.returncode == 0 and events(settled)[-1]["count"] == 0
    late = workflow("reconcile", "--correct", f"{KEY}=1")  # released: no word settles it now
    assert late.returncode == exitcodes.EXIT_THREAD and "(released)" in late.stderr
    assert "--confirmed" not in late.stderr, late.stderr  # it would be refused: not open
    resumed = workflow("resume")
    assert resumed.returncode == 0
    assert names(resumed) == ["message_sent", "done"]  # sent again, once
    assert len(messages(workflow)) == messages_sent(lab) == 2
    assert names(workflow("resume")) == ["done"]  # finished: nothing more, whatever is typed
    assert messages_sent(lab) == 2


def test_a_persons_word_on_a_ticket_is_checked_against_the_receiver(receiver, workflow, lab):
    """reconcile --confirmed on a key the receiver can be asked about records the ticket it
    holds (never a placeholder the node cannot read), and --not-sent is refused while the
    receiver holds it: the resume then finishes with the real ticket, and nothing is sent."""
    killed = workflow("start", "--operation", "ct", "--crash-at", "after-send")
    assert shell_exit_code(killed.returncode) == KILLED  # ticket 1 exists, the ledger: requested
    refused = workflow("reconcile", "--not-sent", "ct")
    assert refused.returncode == exitcodes.EXIT_THREAD and "holds 1 under 'ct'" in refused.stderr
    assert "tickets --operation ct" in refused.stderr  # the command to look with
    wrong = workflow("reconcile", "--confirmed", "ct=7")  # a typo: checked, not believed
    assert (wrong.returncode, wrong.stdout) == (exitcodes.EXIT_THREAD, ""), wrong
    assert wrong.stderr.count("\n") == 1 and "holds 1 under 'ct', not 7" in wrong.stderr
    settled = workflow("reconcile", "--confirmed", "ct")
    assert settled.returncode == 0, settled.stderr
    assert events(settled)[0] == {"event": "settled", "key": "ct", "state": "confirmed"}
    resumed = workflow("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert events(resumed)[-1]["ticket_id"] == 1  # the receiver's ticket, from the receipt
    assert len(events(workflow("tickets"))[0]["tickets"]) == 1
    wrong = workflow("reconcile", "--correct", "ct=2")  # a correction is checked the same way
    assert wrong.returncode == exitcodes.EXIT_THREAD and "holds 1 under 'ct', not 2" in wrong.stderr
    again = workflow("reconcile", "--confirmed", "ct=1")  # not open; its id was looked up, so
    assert again.returncode == exitcodes.EXIT_THREAD and "not open (confirmed)" in again.stderr
    assert "--correct" not in again.stderr, again.stderr  # no --correct: it could only be refused


def test_the_ledger_does_not_protect_what_a_naive_run_already_sent(receiver, workflow):
    """Lab 15's "what to notice": the ledger knows only what it recorded. A naive run's ticket
    (no key) is not found by the key a later ledger run of the same operation claims."""
    naive = workflow("start", "--thread", "n", "--operation", "sw", "--mode", "naive")
    assert naive.returncode == 0, naive.stderr
    ledger = workflow("start", "--thread", "l", "--operation", "sw")
    assert ledger.returncode == 0, ledger.stderr
    assert "effect_ack" in names(ledger)  # sent: nothing in the ledger said otherwise
    assert len(events(workflow("tickets"))[0]["tickets"]) == 2
