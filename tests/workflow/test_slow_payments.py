"""Lab 15's slow provider: a keyless payment whose commit comes after the client gave up.

A real labs/receiver.py holds every POST /payments before its commit (failpoint
payment-commit=pause(PATH)) until the test lets it go, so "the lookup ran before the commit" is a
fact of the test, not of the machine's speed. The workflow runs in this process (lab.main, as the
guides' local runs do) with API_TIMEOUT_S=0.3. --mode lookup-resend (the ledger before its settle
rule) charges twice; the ledger charges once, stops with exit 6, keeps stopping while nothing is
committed and the provider's settle time has not passed, and adopts the charge once it is committed.
"""

import json
import re
import urllib.request

import pytest

import failpoints
from labs import keyless as keyless_lesson
from tools.local import ReceiverProcess, run_workflow_here


@pytest.fixture
def held(lab, tmp_path):
    """(labs/receiver.py holding each charge before its commit, the hold's file)."""
    hold = tmp_path / "payment-commit"
    env = dict(lab, FAILPOINTS=f"payment-commit=pause({hold})")
    server = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    yield server, hold
    failpoints.unpause(hold)  # a held request thread ends before the receiver is stopped
    server.stop()


def listing(server, query=""):
    with urllib.request.urlopen(f"{server.env['API_URL']}/payments{query}", timeout=10) as answer:
        return json.load(answer)


def charged(server, reference):
    """How many charges are committed under reference, once none is pending."""
    settled = listing(server, "?settled=1")
    assert settled["pending"] == 0, settled
    return sum(p["reference"] == reference for p in settled["payments"])


def test_lookup_resend_charges_twice_and_the_ledger_once(held, lab):
    server, hold = held
    fast = dict(lab, API_TIMEOUT_S="0.3")

    def cli(*args):
        return run_workflow_here(args, fast)

    # The ledger before its settle rule: the lookup found nothing, so it sent again.
    twice = cli("start", "--thread", "twice", "--operation", "case-twice", "--pay")
    assert twice.returncode == 6, twice  # this one is the ledger: the control run
    resend = ["--mode", "lookup-resend"]
    old = cli("start", "--thread", "old", "--operation", "case-old", "--pay", *resend)
    assert old.returncode == 6, old  # the second timeout: unknown too, the run stops
    assert "no answer from the receiver" in old.stderr, old.stderr
    assert listing(server)["pending"] == 3  # twice's one charge, old's two

    # The ledger stops with one line that names the command to look with and reconcile.
    stop = twice.stderr.splitlines()
    assert len(stop) == 1, twice.stderr
    assert re.fullmatch(
        r"labs: effect payment 'case-twice:pay' may have happened \(sent, and no answer was "
        r"recorded\) and the lookup found nothing (\d+\.\d) s after the last send, and the "
        r"provider may take 10 s to commit: look with python -m labs payments --reference "
        r"case-twice:pay \(Docker: docker compose -p stateful-lab run --rm workflow payments "
        r"--reference case-twice:pay\), then python -m labs reconcile \(Docker: docker compose "
        r"-p stateful-lab run --rm workflow reconcile\) \(it asks the provider again\)",
        stop[0],
    ), stop[0]

    # Nothing committed yet, sooner than settle_s after the send: every ask says "not yet".
    again = cli("resume", "--thread", "twice")
    assert again.returncode == 6, again
    assert listing(server)["pending"] == 3, "the resume charged again before settle_s"
    soon = cli("reconcile")
    assert soon.returncode == 0, soon
    now = {e["key"]: e["now"] for e in map(json.loads, soon.stdout.splitlines()) if "key" in e}
    assert now == {"case-twice:pay": "too soon to tell", "case-old:pay": "too soon to tell"}
    assert listing(server)["pending"] == 3  # the ledger sent nothing a second time

    failpoints.unpause(hold)  # the provider commits what it accepted
    assert charged(server, "case-old:pay") == 2
    assert charged(server, "case-twice:pay") == 1

    adopted = cli("reconcile")
    now = {e["key"]: e["now"] for e in map(json.loads, adopted.stdout.splitlines()) if "key" in e}
    assert now == {"case-twice:pay": "confirmed", "case-old:pay": "confirmed"}, adopted
    was = {e["key"]: e["was"] for e in map(json.loads, adopted.stdout.splitlines()) if "key" in e}
    assert was["case-twice:pay"] == "unknown"  # as the early resume and reconcile left it
    done = cli("resume", "--thread", "twice")
    assert done.returncode == 0, done
    payment_id = listing(server, "?reference=case-twice:pay")["payments"][0]["payment_id"]
    assert json.loads(done.stdout.splitlines()[-1])["payment_id"] == payment_id
    assert charged(server, "case-twice:pay") == 1


def test_lookup_resend_without_a_payment_is_one_line_and_exit_2(lab):
    alone = run_workflow_here(["start", "--thread", "t", "--mode", "lookup-resend"], lab)
    assert (alone.returncode, alone.stdout) == (2, "")
    assert alone.stderr == "labs: --mode lookup-resend changes only the payment: add --pay\n"


def test_the_payment_declares_a_keyless_provider_with_a_lookup_and_a_settle_time():
    """What the settle rule reads; lookup-resend is built from it, not from a switch."""
    assert keyless_lesson.PAYMENT.keyed is False and keyless_lesson.PAYMENT.lookup is not None
    assert keyless_lesson.PAYMENT.settled_after_s == keyless_lesson.PAYMENT_SETTLE_S == 10


def test_a_payment_answered_in_time_says_which_condition_of_lab_15_is_missing(receiver, lab):
    """Lab 15 typed without its slow-payments file (the receiver commits at once) or without
    API_TIMEOUT_S=0.5: the payment is answered, the run ends well, and one line on stderr says
    which condition is missing and the whole command that adds it, natively and through Docker."""
    from tools.backends import parse_command
    from tools.native import line as native_line

    ran = run_workflow_here(["start", "--thread", "p", "--operation", "op:pay", "--pay"], lab)
    assert ran.returncode == 0 and ran.stdout.splitlines()[-1].startswith('{"event": "done"')
    (said,) = ran.stderr.splitlines()  # the default API_TIMEOUT_S, 5, and no late commit
    assert said.startswith("labs: lab 15's slow provider did not happen: the payment was "), said
    restart = "kill %1; wait; FAILPOINTS='payment-commit=sleep(3)' python -m labs.receiver "
    assert (
        restart + "2>>data/receiver.log & echo $! >data/receiver.pid (Docker: docker compose "
        in said
    )
    docker = re.search(r"\(Docker: (docker compose [^)]*up -d --build api)\)", said)[1]
    assert restart in native_line(parse_command(docker), {}, True, False)  # docs/native.md's form
    assert "; and API_TIMEOUT_S is 5, longer than the late commit's 3 s" in said, said
    assert said.endswith(
        "then a new operation: API_TIMEOUT_S=0.5 python -m labs start --thread p-again "
        "--operation op:pay-again --pay (Docker: docker compose -p stateful-lab run --rm -e "
        "API_TIMEOUT_S=0.5 workflow start --thread p-again --operation op:pay-again --pay)"
    ), said
    fast = dict(lab, API_TIMEOUT_S="0.5")  # the timeout given: only the receiver's file missing
    again = run_workflow_here(["start", "--thread", "q", "--operation", "oq", "--pay"], fast)
    assert again.returncode == 0 and "API_TIMEOUT_S is" not in again.stderr, again.stderr
    assert again.stderr.count("\n") == 1 and "labs/slow-payments.compose.yaml" in again.stderr
