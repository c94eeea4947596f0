"""The ledger's hints, followed as printed (issue 49): exit 6's resume and reconcile, every refused
reconcile word's command (settling.py), and lab 12's migrate under a new key version. Each line is
cut with printed(), an ID placeholder filled in with what the printed look showed, and run as a
learner types it: its exit code, what the ledger recorded, and never a second effect.

A person's word is taken only once the provider's settle time (5 s for the receiver, 10 s for the
payment, 60 s for an effect the program does not declare) has passed since the last send; no
setting shortens it, so the ledger's clock is moved on instead (`later`): the person comes back
after the time the line names, without the test waiting it out. Every command runs in this
process (typed_here), where that clock is the ledger's."""

import dataclasses
import io
import re
import shlex
import sqlite3
import subprocess
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hints_helpers import printed
from test_hints_as_printed import receiver_list, typed_here

import corrections
import failpoints
import ledger as ledger_module
import providers
import workflow
from labs import keyless
from tools.local import ReceiverProcess, events, run_workflow_here, wait_until

NOTE = "case-001:open-ticket:v1:notify"  # lab 15's message key, for the default operation
TICKET = "case-t:open-ticket:v1"
# the core CLI's command ends its clause: the line's end, or its "(look with ...)"
CORE_HINT = re.compile(r"python workflow\.py [^;()\n]*[^;()\n ]")


class MovedClock:
    """The time module, ahead by ahead_s: what the ledger sees when a person comes back later."""

    def __init__(self, ahead_s):
        self.ahead_s = ahead_s

    def time(self):
        return time.time() + self.ahead_s

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def later(monkeypatch):
    """later(seconds): the ledger's clock (ledger.py's time) moved on by seconds, for the rest of
    the test: a settle time passed, without sleeping through it."""
    return lambda seconds: monkeypatch.setattr(ledger_module, "time", MovedClock(seconds))


@pytest.fixture
def slow_receiver(lab, tmp_path):
    """(labs/receiver.py holding each charge before its commit, as lab 15's slow provider does,
    until failpoints.unpause(the hold's file); that file)."""
    hold = tmp_path / "payment-commit"
    env = {**lab, "FAILPOINTS": f"payment-commit=pause({hold})"}
    server = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    yield server, hold
    failpoints.unpause(hold)  # a held request thread ends before the receiver is stopped
    server.stop()


def as_typed(command, env):
    """A printed command run as a shell runs it, in this process: its leading NAME=VALUE words
    go into the environment (lab 12's LAB_KEY_VERSION=2), the rest is typed_here's."""
    words = shlex.split(command)
    settings = {}
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        settings[name] = value
    return typed_here(shlex.join(words), {**env, **settings})


def core_typed_here(command, env):
    """A `python workflow.py WORDS` hint run in this process (workflow.main): the core's CLI."""
    typed = shlex.split(command)
    assert typed[:2] == ["python", "workflow.py"], command
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = workflow.main(typed[2:], env)
        except SystemExit as exit:  # argparse: a usage mistake
            code = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(typed, code, out.getvalue(), err.getvalue())


def last_transition(lab, key):
    """(the key's state, how its last transition says it got there), from the ledger's file."""
    with sqlite3.connect(lab["CHECKPOINT_DB"]) as db:
        (state,) = db.execute("SELECT state FROM effects WHERE key = ?", (key,)).fetchone()
        (how,) = db.execute(
            "SELECT how FROM effect_transitions WHERE key = ? ORDER BY id DESC LIMIT 1", (key,)
        ).fetchone()
    return state, how


# --- exit 6: the lines Unsettled prints (effects.py) ---------------------------------------------


def test_a_keyed_payment_with_no_answer_twice_names_the_resume_that_adopts_it(
    lab, slow_receiver, later
):
    """Lab 15's lookup-resend payment (declared keyed), timed out twice while the provider holds
    both charges: exit 6, and the line names the look and, once the provider's 10 s have passed,
    the resume. Followed as printed after the provider committed: exit 0, the first charge
    adopted, and no charge more than the two the lesson's mode made before the line."""
    _, hold = slow_receiver
    start = ["start", "--thread", "twice", "--operation", "case-twice:pay:v1", "--pay"]
    fast = {**lab, "API_TIMEOUT_S": "0.5"}  # the lesson's: the client gives up first
    stopped = run_workflow_here([*start, "--mode", "lookup-resend"], fast)
    assert stopped.returncode == 6 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert "honours the key and has not given its result yet" in stopped.stderr, stopped.stderr
    look, resume = printed(stopped.stderr)
    assert look == "python -m labs payments --reference case-twice:pay:v1:pay"
    assert resume == "python -m labs resume --thread twice"
    settle_s = float(re.search(r"once (\S+) s have passed since the last send", stopped.stderr)[1])
    assert settle_s == keyless.PAYMENT_SETTLE_S
    failpoints.unpause(hold)  # the provider commits what it accepted, within its settle time
    client = workflow.TicketClient(lab["API_URL"])
    wait_until(lambda: client.call("/payments")["pending"] == 0, 10, "the charges committed")
    later(settle_s)
    looked = typed_here(look, lab)
    assert looked.returncode == 0, looked.stderr
    charges = events(looked.stdout)[0]["payments"]  # the lesson's second charge: made already
    assert len(charges) == 2, charges
    done = typed_here(resume, lab)
    assert done.returncode == 0, done.stderr
    adopted = events(done.stdout)[0]
    assert adopted == {
        "event": "effect_adopted",
        "key": "case-twice:pay:v1:pay",
        "payment_id": charges[0]["payment_id"],
    }, done.stdout
    assert receiver_list(lab, "payments") == charges  # following the line charged nothing


def test_exit_6_not_sent_for_a_message_that_never_left_lets_the_resume_send_it_once(
    lab, receiver, later
):
    """Killed after the message's intent, before it left: the resume stops with exit 6. The
    look shows no message, so the person says --not-sent, as printed: refused until the 5 s the
    line names have passed, then taken (released); the next resume sends it once."""
    assert (
        run_workflow_here(["start", "--thread", "n", "--notify", "--crash"], lab).returncode == -9
    )
    window = ["resume", "--thread", "n", "--crash-at", "after-intent"]
    assert run_workflow_here(window, lab).returncode == -9
    stopped = run_workflow_here(["resume", "--thread", "n"], lab)
    assert stopped.returncode == 6, stopped.stderr
    look, _, not_sent = printed(stopped.stderr)
    assert (look, not_sent) == (
        "python -m labs messages",
        f"python -m labs reconcile --not-sent {NOTE}",
    )
    assert events(typed_here(look, lab).stdout)[0]["messages"] == []  # it never went out
    early = typed_here(not_sent, lab)
    assert early.returncode == 4 and "try again in " in early.stderr, early.stderr
    settle_s = float(re.search(r"\(taken (\S+) s after the last send\)", stopped.stderr)[1])
    later(settle_s)
    settled = typed_here(not_sent, lab)
    assert settled.returncode == 0, settled.stderr
    assert events(settled.stdout)[0] == {"event": "settled", "key": NOTE, "state": "released"}
    assert last_transition(lab, NOTE) == (
        "released",
        "settled: not sent (a person: reconcile --not-sent)",
    )
    resumed = run_workflow_here(["resume", "--thread", "n"], lab)
    assert resumed.returncode == 0, resumed.stderr
    assert [e["event"] for e in events(resumed.stdout)] == ["message_sent", "done"]
    assert len(receiver_list(lab, "messages")) == 1


# --- a person's word refused (settling.py): the command it names, followed ---------------------


def message_at(point):
    """A message run killed at point (after-send: the receiver has it; after-intent: it never
    left); its resume stops with exit 6 and the person looks as printed: (the key, the message
    id the look showed, or None)."""

    def crashed(lab):
        start = ["start", "--thread", "t", "--notify", "--crash"]  # after the ticket's receipt
        assert run_workflow_here(start, lab).returncode == -9
        window = ["resume", "--thread", "t", "--crash-at", point]
        assert run_workflow_here(window, lab).returncode == -9
        stopped = run_workflow_here(["resume", "--thread", "t"], lab)
        assert stopped.returncode == 6, stopped.stderr
        shown = events(typed_here(printed(stopped.stderr)[0], lab).stdout)[0]["messages"]
        return NOTE, (shown[0]["message_id"] if shown else None)

    return crashed


def ticket_at(point):
    """A ticket run killed at point (after-send: the receiver made it; after-intent: nothing
    left): (the key, the ticket id the receiver holds, or None)."""

    def crashed(lab):
        start = ["start", "--thread", "t", "--operation", TICKET, "--crash-at", point]
        assert run_workflow_here(start, lab).returncode == -9
        held = [t["ticket_id"] for t in receiver_list(lab, "tickets")]
        return TICKET, (held[0] if held else None)

    return crashed


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A word reconcile refuses, after the setup (and a word taken first), and what follows."""

    setup: object  # lab -> (key, the id the provider holds or None)
    refused: str  # the words typed, {key} and {id} filled in ({typo}: a wrong id)
    code: int  # its exit code
    follow: str  # the printed command followed, as printed (ID: the id the look showed)
    recorded: tuple  # (state, how) the ledger's last transition says
    first: str = ""  # a word taken before it ({typo})
    program: str = "python -m labs"
    settle_s: float = workflow.RECEIVER_SETTLE_S  # the provider's: the person comes back after


LEFT = "no evidence it was not sent: a person must look"  # exit 6's
TYPED = "settled: confirmed (a person: reconcile --confirmed)"
CORRECTED = "corrected: {typo} -> {id} ({login}: a person: reconcile --correct)"
REFUSALS = {
    "--correct without an id": Refusal(  # settling.correction_checked
        message_at("after-send"), "--correct {key}", 2, "reconcile --correct {key}=ID",
        ("confirmed", CORRECTED), first="--confirmed {key}={typo}",
    ),
    "--correct on an open key": Refusal(  # settling.require_correctable
        message_at("after-send"), "--correct {key}={id}", 4, "reconcile --confirmed {key}=ID",
        ("confirmed", TYPED),
    ),
    "--not-sent while the receiver holds it": Refusal(  # settling.word_checked
        ticket_at("after-send"), "--not-sent {key}", 4, "reconcile --confirmed {key}",
        ("confirmed", "settled: confirmed (a person: reconcile --confirmed, looked up)"),
    ),
    "--confirmed where the receiver holds nothing": Refusal(  # settling.word_checked
        ticket_at("after-intent"), "--confirmed {key}=1", 4, "reconcile --not-sent {key}",
        ("released", "settled: not sent (a person: reconcile --not-sent)"),
    ),
    "--confirmed of an effect the program does not declare": Refusal(  # settling.word_checked
        message_at("after-intent"), "--confirmed {key}=1", 4, "reconcile --not-sent {key}",
        ("released", "settled: not sent (a person: reconcile --not-sent)"),
        program="python workflow.py", settle_s=providers.SETTLE_S,
    ),
    "--confirmed without an id": Refusal(  # settling.word_checked
        message_at("after-send"), "--confirmed {key}", 2, "reconcile --confirmed {key}=ID",
        ("confirmed", TYPED),
    ),
    "--confirmed on a key a person confirmed": Refusal(  # settling.require_open
        message_at("after-send"), "--confirmed {key}={id}", 4, "reconcile --correct {key}=ID",
        ("confirmed", CORRECTED), first="--confirmed {key}={typo}",
    ),
    "--not-sent on a key that is not open": Refusal(  # settling.require_open
        message_at("after-send"), "--not-sent {key}x", 4, "reconcile", ("unknown", LEFT),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refused_word_names_the_command_that_is_right_and_it_is_taken(lab, receiver, later, case):
    """A person's word reconcile will not take: one line, nothing settled, naming the command
    that is right. Followed as printed (ID: the id the look showed): exit 0 and the ledger
    records what it says (a correction as a correction); the resume that follows finishes
    with the provider's one effect (or still stops, the key still open), never a second."""
    key, made = case.setup(lab)
    later(case.settle_s)  # the person comes back once the settle time has passed
    typed = core_typed_here if case.program == "python workflow.py" else typed_here
    typo = None if made is None else made + 6
    fill = {"key": key, "id": made, "typo": typo}
    if case.first:
        taken = typed(f"{case.program} reconcile {case.first.format(**fill)}", lab)
        assert taken.returncode == 0, taken.stderr  # a person's typo: nothing can check it
    refused = typed(f"{case.program} reconcile {case.refused.format(**fill)}", lab)
    assert (refused.returncode, refused.stdout) == (case.code, ""), refused
    assert refused.stderr.count("\n") == 1, refused.stderr
    said = re.match(r"[\w.]+: nothing was (settled|corrected): ", refused.stderr)
    assert said, refused.stderr  # said first, so no command it names ends in a period
    if case.program == "python workflow.py":
        named = CORE_HINT.findall(refused.stderr)
    else:
        named = printed(refused.stderr)
    follow = f"{case.program} {case.follow.format(key=key)}"
    assert follow in named and f"{follow}." not in refused.stderr, (follow, refused.stderr)
    followed = typed(follow.replace("=ID", f"={made}"), lab)
    assert followed.returncode == 0, followed.stderr
    if case.follow == "reconcile":  # the listing names the key that is open
        listed = {"effect": "message", "event": "reconciled", "key": key, "now": "needs a person"}
        assert {**listed, "was": "unknown"} in events(followed.stdout), followed.stdout
    state, how = case.recorded
    login = corrections.login() if "{login}" in how else ""
    assert last_transition(lab, key) == (state, how.format(**fill, login=login))
    if "corrected" in how:  # a row of its own: the person's first answer kept beside it
        with sqlite3.connect(lab["CHECKPOINT_DB"]) as db:
            rows = db.execute(
                "SELECT was_id, external_id FROM effect_corrections WHERE key = ?", (key,)
            )
            assert rows.fetchall() == [(str(typo), str(made))]
    resumed = run_workflow_here(["resume", "--thread", "t"], lab)
    table = "messages" if key == NOTE else "tickets"
    if state == "unknown":  # a listing settles nothing: the resume still stops, sending nothing
        assert resumed.returncode == 6, resumed.stderr
    else:
        assert resumed.returncode == 0, resumed.stderr
        done = events(resumed.stdout)[-1]
        assert done[f"{table[:-1]}_id"] == (made or 1)  # or the one it sent, resumed.stdout
    assert len(receiver_list(lab, table)) == 1


def test_correct_without_an_id_on_a_looked_up_ticket_names_no_command_that_is_refused(
    lab, receiver
):
    """A ticket a person confirmed through the receiver's lookup holds the receiver's own id:
    there is nothing to correct. `--correct KEY` without an id is refused, naming that id and
    no correction (any would be refused). The receipt stays; one ticket."""
    key, made = ticket_at("after-send")(lab)
    assert typed_here(f"python -m labs reconcile --confirmed {key}", lab).returncode == 0
    refused = typed_here(f"python -m labs reconcile --correct {key}", lab)
    assert refused.returncode == 4 and refused.stdout == "", refused
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("labs: nothing was corrected: "), refused.stderr
    assert f"names {made}, which its provider's lookup found" in refused.stderr, refused.stderr
    assert "reconcile --correct" not in refused.stderr  # settling.py require_correctable
    looked_up = "settled: confirmed (a person: reconcile --confirmed, looked up)"
    assert last_transition(lab, key) == ("confirmed", looked_up)
    assert len(receiver_list(lab, "tickets")) == 1


# --- lab 12: a key version changed between the crash and the resume ----------------------------


def test_a_resume_under_a_new_key_version_names_the_migrate_that_keeps_its_keys(lab, receiver):
    """Killed after the ticket under key version 1, resumed under LAB_KEY_VERSION=2: exit 65,
    and the line names `LAB_KEY_VERSION=2 python -m labs migrate --thread T`. Followed as
    printed (the setting in the environment): exit 0, key version 1 kept; the resume under
    version 2 then reads the receipt: one ticket."""
    start = [
        "start",
        "--thread",
        "rekeyed",
        "--operation",
        "case-rekeyed:open-ticket:v1",
        "--crash",
    ]
    assert run_workflow_here(start, lab).returncode == -9
    v2 = {**lab, "LAB_KEY_VERSION": "2"}
    refused = run_workflow_here(["resume", "--thread", "rekeyed"], v2)
    assert refused.returncode == 65 and refused.stderr.count("\n") == 1, refused.stderr
    (migrate,) = printed(refused.stderr)
    assert migrate == "LAB_KEY_VERSION=2 python -m labs migrate --thread rekeyed"
    migrated = as_typed(migrate, lab)  # the learner's shell: no LAB_KEY_VERSION but the line's
    assert migrated.returncode == 0, migrated.stderr
    (said,) = events(migrated.stdout)
    assert (said["event"], said["key_version"]) == ("migrated", "1"), said
    resumed = run_workflow_here(["resume", "--thread", "rekeyed"], v2)
    assert resumed.returncode == 0, resumed.stderr
    assert events(resumed.stdout)[0]["event"] == "effect_receipt", resumed.stdout
    assert len(receiver_list(lab, "tickets")) == 1
