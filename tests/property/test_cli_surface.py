"""What learners type, in random orders: the whole labs/cli.py surface against a real receiver.

A hypothesis state machine (the generative idea of Jepsen: random operations, then check what
the outside world holds) types the lab's commands for three threads, in the default mode (the
ledger) or lab 02's safe mode (the key alone): `start` killed at any failpoint, `resume`, `state`,
`reconcile`, own-node approval and `approve [--reject]`, a deploy of
graph version 2 and `migrate`, the saga (`saga start` killed at any of its points, more seats
than the receiver has, `saga resume`, `saga state`), lab 19's outbox (`outbox start` killed before
or after its write, `outbox resume`, and `labs/relay.py --once` killed before its POST or between
the receiver's answer and its mark), lab 18's `hooks` (the inbox's endpoint, killed after its commit
or not, against a receiver that delivers every webhook twice and the pending ones newest first),
the wrong resume for a thread (`resume` on a saga, `saga resume` on a ticket), a receiver restart,
Ctrl-C in the middle of a run, and every
command a hint on stderr names, typed as printed. At the end of each sequence it finishes every
thread the way a learner would: the thread's resume, then whatever the CLI says to type.

What must hold (the receiver's own answers decide, GET /tickets and GET /refunds):
- every ticket carries the key of an operation that was started (the operation's id, its ask for
  approval's OPERATION:approval, or a saga's OPERATION:charge), and each finished thread names the
  one ticket its key made;
- at most one message about each ticket (lab 15's keyless provider: after exit 6 the learner
  looks at GET /messages and settles it with reconcile, as lab 15 shows), and at most one
  about each webhook event (lab 18: its text names the event);
- a ticket's status, as `hooks` shows it, never goes back to an older version;
- one ticket per outbox message, delivered once the relay has run, and a message sent again only
  by a relay killed between the receiver's answer and its mark (each such kill: one `replayed`);
- at most one refund per charge, and only for a saga whose reservation was refused for capacity
  or whose shipment had no carrier (its `refused` line says which); at most one release per
  reservation, and only for a saga whose shipment had no carrier;
- an effect whose result the checkpoint holds is never sent again (the lab's promise: a resume
  repeats only the node whose result was not saved); an operation run only through the ledger
  (a saga's steps and an ask for approval always are) reaches the receiver once: the receiver's
  log shows no replay of its key (a receipt or a lookup answered every later attempt), and
  `reconcile` sends nothing; `migrate` moves only a ticket's
  thread, says where it goes on, and `state` then agrees;
- no traceback anywhere, every exit code is one of docs/exit-codes.md's table, Ctrl-C is exit
  130 and one line.

Real processes where a signal is the point: a crash failpoint SIGKILLs a real labs/cli.py process,
and Ctrl-C is a SIGINT to one held at a failpoint (FIELD-NOTES: an exception raised in the saver
is not a faithful crash). That process is lab.main in a fork of this one, as effectdrill forks:
LangGraph is imported already, so it starts in milliseconds, not a second. The other commands
run in this process (lab.main), as tests/conftest.py's `workflow` fixture does.

A failure prints the sequence of steps and every command it typed, with what each printed.
The examples are derandomized (the same ones every run). To explore: LAB_PROPERTY_SEED=N (or
=random: a new seed, printed on failure), LAB_PROPERTY_EXAMPLES=N (default 12) and
LAB_PROPERTY_SHRINK=1 (shrink a failure to its shortest sequence: minutes).
"""

import collections
import contextlib
import functools
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import urllib.request

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import exitcodes
from labs import approval as approval_lesson
from labs import cli as lab
from labs import contract as contract_lesson
from labs import hooks as hooks_lesson
from labs import modes as modes_lesson
from labs import outbox as outbox_lesson
from labs import relay, trace_keys
from labs import saga as saga_lesson
from tools.local import (
    ROOT,
    SIGNALS_ITSELF,
    ReceiverProcess,
    events,
    free_port,
    lab_env,
    run_workflow_here,
    shell_exit_code,
)

pytestmark = pytest.mark.long  # about half a minute: started first (conftest.py)

THREADS = ("a", "b", "c")  # a start names its own operation (op-a, book-a) or the default one
SEATS = (2, 4, 11)  # the receiver has 10 seats in all: 11 is refused, and so is a third 4
STOPS = {  # how a run is stopped: --crash-at POINT (SIGKILL), --crash, or Ctrl-C at a point
    "ticket": (*modes_lesson.CRASH_POINTS, "--crash", "ctrl-c after-prepare", "ctrl-c after-ack"),
    # after-send: the window of whichever saga effect sends first (no line is printed before it)
    "saga": (*saga_lesson.SAGA_POINTS, *(f"ctrl-c {point}" for point in saga_lesson.SAGA_ACKS)),
    "outbox": outbox_lesson.OUTBOX_POINTS,  # lab 19's node: before and after its write
}
CTRL_C_AFTER = {  # where a Ctrl-C lands: the failpoint held, and the events printed just before
    "after-prepare": ("prepare",),  # it (a ledger's receipt or lookup says effect_receipt or
    "after-ack": ("effect_ack", "effect_receipt", "effect_adopted"),  # effect_adopted)
    "after-charge-ack": ("charged",),
    "after-reserve-ack": ("reserved",),
    "after-ship-ack": ("shipped",),
    "after-release-ack": ("released",),
    "after-refund-ack": ("refunded",),
}
EFFECTS = {  # the event that says a request was answered, and the field its result is saved in
    "effect_ack": "ticket_id",
    "charged": "ticket_id",
    "reserved": "reservation_id",
    "refunded": "refund_id",
    "shipped": "shipment_id",
    "released": "release_id",
    "message_sent": "message_id",
}
# A command that a hint on stderr names (printed whole, `python -m labs resume --thread X (Docker:
# ... resume --thread X)`: both forms match, the same words): `resume --thread X`, `saga resume
# --thread X`, `approve [--reject] --thread X`, `migrate --thread X` (maybe after
# LAB_GRAPH_VERSION=N), and, for the thread of the command that printed it, "approve (or
# --reject)".
HINT = re.compile(
    r"(?:LAB_GRAPH_VERSION=(?P<version>\d) )?"
    r"(?P<command>(?:saga |outbox )?(?:resume|migrate|approve)(?: --reject)?)"
    r"(?: --thread (?P<thread>[^\s;,)'\"]+)| (?=\(or --reject\)))"
)
REPLAYED = re.compile(
    r"^receiver: replayed key=(\S+) ", re.M
)  # labs/receiver.py's log line for a repeat
FINISH_ATTEMPTS = 6  # commands to finish one thread at the end: resume, a hint, resume, ...
HANG_GUARD_S = 300  # seconds for one forked command: only a hang (a point held for good) reaches it


def exit_codes_in_the_docs():
    """The codes docs/exit-codes.md's workflow.py table lists (not labs/workers.py's)."""
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    table = text.split("## Exit codes of workflow.py", 1)[1].split("\n#", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}


EXIT_CODES = exit_codes_in_the_docs()


@pytest.mark.fast
def test_the_readme_exit_table_lists_every_exit_code_of_workflow_py():
    modules = (exitcodes, lab, contract_lesson, approval_lesson, trace_keys)  # 65, 77, 8
    constants = {v for m in modules for k, v in vars(m).items() if k.startswith("EXIT_")}
    assert EXIT_CODES == {0, *constants}


def test_what_learners_type_keeps_every_ticket_and_refund_single(tmp_path):
    import_what_lab_imports_when_it_runs()  # before the first fork: each child has it then
    folders = (tmp_path / f"example-{n}" for n in range(10**6))
    factory, how = seeded(lambda: Learner(next(folders)))
    try:
        run_state_machine_as_test(factory, settings=SETTINGS)
    except BaseException as error:
        error.add_note(f"to reproduce: {how}")
        raise


# --- the learner ---------------------------------------------------------------------------


def step(method):
    """A rule or invariant; when it raises, teardown does not finish the threads (the failure
    to report is this one)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return run


class Learner(RuleBasedStateMachine):
    """One lab: a receiver, a checkpoint file, and the commands typed into it."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder
        self.env = lab_env(folder / "data", free_port())
        # lab 06's receiver: it drops the answer to a --crash-at lost-ack request, once per token
        # and lab 18's webhook faults: every event delivered twice, the pending ones newest first
        faults = "before-answer=drop-answer;redeliver=on;reorder=on"
        receiver_env = dict(self.env, FAILPOINTS=faults)
        self.receiver = ReceiverProcess(receiver_env, log_path=folder / "receiver.log").start()
        self.version = "1"  # LAB_GRAPH_VERSION: the deployed graph (only goes forward, 1 -> 2)
        self.threads = {}  # thread -> Thread, once a start has made it
        self.keys = set()  # the Idempotency-Keys of every operation started
        self.capacity_refused = set()  # saga operations whose reservation had no seats
        self.carrier_refused = set()  # saga operations whose shipment had no carrier
        self.keyed_only = set()  # operations some start ran in --mode safe (no ledger)
        self.all_made = []  # every Thread a start was typed for
        self.hints = {}  # (argv, version) -> False, True once typed
        self.relay_window_kills = 0  # relays killed after the receiver's answer (lab 19)
        self.ticket_versions = {}  # lab 18: ticket -> the version `hooks` last showed it at
        self.transcript = []  # what was typed and printed, for the failure message
        self.failed = False

    # --- what learners type ---

    @rule(
        thread=st.sampled_from(THREADS),
        stop=st.none() | st.sampled_from(STOPS["ticket"]),
        default=st.booleans(),
        approval=st.booleans(),
        safe=st.booleans(),
        notify=st.booleans(),
    )
    @step
    def start(self, thread, stop, default, approval, safe, notify):
        operation = "case-001:open-ticket:v1" if default else f"op-{thread}"
        argv = ["start", "--thread", thread, *([] if default else ["--operation", operation])]
        argv += ["--approval", "own-node"] if approval else []
        argv += ["--notify"] if notify else []  # lab 15's message: no key, no lookup
        argv += ["--mode", "safe"] if safe else []  # lab 02's key, no ledger: replays allowed
        if safe:
            self.keyed_only.add(operation)
        if approval:  # the ask: a ticket of its own, keyed OPERATION:approval (lab 07)
            self.keys.add(f"{operation}:approval")
        self.starting(Thread("ticket", operation, key=operation), thread, argv, stop)

    @rule(
        thread=st.sampled_from(THREADS),
        stop=st.none() | st.sampled_from(STOPS["saga"]),
        default=st.sampled_from([True, True, True, False]),  # mostly lab 13's --operation
        seats=st.sampled_from(SEATS),
        ship_to=st.sampled_from(["FR", "AQ"]),  # AQ: no carrier, both undos run
    )
    @step
    def saga_start(self, thread, stop, default, seats, ship_to):
        operation = "case-013:book:v1" if default else f"book-{thread}"
        argv = ["saga", "start", "--thread", thread]
        argv += [*([] if default else ["--operation", operation]), "--seats", str(seats)]
        argv += ["--ship-to", ship_to]
        self.starting(Thread("saga", operation, key=f"{operation}:charge"), thread, argv, stop)

    @rule(thread=st.sampled_from(THREADS), stop=st.none() | st.sampled_from(STOPS["ticket"]))
    @step
    def resume(self, thread, stop):  # on any thread: a saga's too (the wrong command)
        self.type(["resume", "--thread", thread], stop=stop)

    @rule(thread=st.sampled_from(THREADS), stop=st.none() | st.sampled_from(STOPS["saga"]))
    @step
    def saga_resume(self, thread, stop):  # on any thread: a ticket's too (the wrong command)
        self.type(["saga", "resume", "--thread", thread], stop=stop)

    @rule(thread=st.sampled_from(THREADS), saga=st.booleans())
    @step
    def state(self, thread, saga):
        self.type([*(["saga"] if saga else []), "state", "--thread", thread])

    @rule()
    @step
    def reconcile(self):
        """The ledger's open effects asked for by key: it settles them and sends nothing."""
        before = self.requests_to_the_receiver()
        outcome = self.type(["reconcile"])
        assert outcome.code == 0, self.report(f"reconcile exited {outcome.code}")
        assert self.requests_to_the_receiver() == before, self.report("reconcile sent a POST")

    @rule(thread=st.sampled_from(THREADS), reject=st.booleans())
    @step
    def approve(self, thread, reject):
        self.type(["approve", "--thread", thread, *(["--reject"] if reject else [])])

    @precondition(lambda self: self.version == "1")
    @rule()
    @step
    def deploy_version_2(self):
        self.version = "2"
        self.transcript.append("# deploy: LAB_GRAPH_VERSION=2 from here on")

    @rule(thread=st.sampled_from(THREADS))
    @step
    def migrate(self, thread):
        self.type(["migrate", "--thread", thread])

    @rule()
    @step
    def restart_receiver(self):
        self.receiver.stop()
        self.receiver.start()
        self.transcript.append("# the receiver restarted")

    @rule(
        thread=st.sampled_from(THREADS),
        stop=st.none() | st.sampled_from(STOPS["outbox"]),
        default=st.booleans(),
    )
    @step
    def outbox_start(self, thread, stop, default):
        """Lab 19: the ticket as a message in the outbox, its id the operation's."""
        operation = "case-019:open-ticket:v1" if default else f"out-{thread}"
        argv = [
            "outbox",
            "start",
            "--thread",
            thread,
            *([] if default else ["--operation", operation]),
        ]
        self.starting(Thread("outbox", operation, key=operation), thread, argv, stop)

    @rule(thread=st.sampled_from(THREADS), stop=st.none() | st.sampled_from(STOPS["outbox"]))
    @step
    def outbox_resume(self, thread, stop):  # on any thread: a ticket's or a saga's too
        self.type(["outbox", "resume", "--thread", thread], stop=stop)

    @rule(stop=st.none() | st.sampled_from(relay.POINTS))
    @step
    def relay_once(self, stop):
        """labs/relay.py --once, killed (a real SIGKILL) before its POST or after the answer."""
        self.relay(["--once", *(["--crash-at", stop] if stop else [])])

    @invariant()
    @step
    def an_outbox_message_is_sent_again_only_after_a_relay_died_in_its_window(self):
        outbox_keys = {made.key for made in self.all_made if made.kind == "outbox"}
        again = [k for k in REPLAYED.findall(self.receiver_log()) if k in outbox_keys]
        assert len(again) <= self.relay_window_kills, self.report(
            f"outbox messages sent again {again}, with {self.relay_window_kills} relays killed "
            "between the receiver's answer and the mark"
        )

    @precondition(lambda self: not all(self.hints.values()))
    @rule(data=st.data())
    @step
    def type_a_hint(self, data):
        """A command that a hint printed, typed as printed (in the shell it was printed in)."""
        argv, version = data.draw(
            st.sampled_from([h for h, typed in self.hints.items() if not typed])
        )
        self.hints[argv, version] = True
        self.type(list(argv), version)

    @rule(
        ticket=st.sampled_from((1, 2, 9)),  # 9: no such ticket (404), as a typo would be
        move=st.lists(st.sampled_from(hooks_lesson.HOOK_STATUSES), max_size=3),
        crash=st.booleans(),
    )
    @step
    def hooks(self, ticket, move, crash):
        """Lab 18's endpoint, the inbox (the default mode): the receiver delivers each event
        twice and the pending ones newest first; --crash-at after-inbox kills it after its
        commit, before its 2xx, so the receiver delivers that event again next time."""
        argv = ["hooks", "--ticket", str(ticket), *(["--move", ",".join(move)] if move else [])]
        outcome = self.type(argv, stop="after-inbox" if crash else None)
        for shown in (e for e in outcome.events if e["event"] == "ticket_status"):
            before = self.ticket_versions.get(ticket, 0)
            assert shown["version"] >= before, self.report(
                f"ticket {ticket}'s status went back: version {shown['version']} after {before}"
            )
            self.ticket_versions[ticket] = shown["version"]

    @invariant()
    @step
    def the_receiver_holds_nothing_unexplained(self):
        if self.receiver.running:
            self.check_the_receiver(finished={})

    def teardown(self):
        try:
            if not self.failed:  # a step failed: that failure is the one to report
                self.finish()
        finally:
            self.receiver.stop()
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- the end: every thread finished the way the CLI says, then the receiver's ledger ---

    def finish(self):
        """Type every hint not typed yet, then drive each thread to its end: its own resume,
        then whatever the CLI printed to type (approve, migrate, the other resume)."""
        while pending := [hint for hint, typed in self.hints.items() if not typed]:
            self.hints[pending[0]] = True
            self.type(list(pending[0][0]), pending[0][1])
        finished = {}
        for thread, made in self.threads.items():
            own = {"saga": ("saga", "resume"), "outbox": ("outbox", "resume")}.get(
                made.kind, ("resume",)
            ) + (
                "--thread",
                thread,
            )
            command = own, self.version
            for _ in range(FINISH_ATTEMPTS):
                outcome = self.type(list(command[0]), command[1])
                if outcome.done is not None or outcome.key_conflict or outcome.no_thread:
                    finished[thread] = outcome.done
                    break
                if outcome.code == exitcodes.EXIT_UNSETTLED:  # a person looks, then settles
                    self.settle(outcome)
                    command = own, self.version
                elif outcome.awaiting_approval:  # `approve` answers it (README, lab 07)
                    command = ("approve", "--thread", thread), outcome.version
                elif outcome.hints:
                    command = outcome.hints[0]
                elif command[0] != own:  # a hint was typed (a migrate, say): resume again
                    command = own, self.version
                else:
                    break
            assert thread in finished, self.report(
                f"thread {thread!r} ({made.kind}, {made.operation}) did not finish: its resume "
                "and the commands the CLI named did not end it"
            )
        self.relay(["--once"])  # what the outbox holds, delivered (lab 19); a second relay
        self.relay(["--once"])  # finds nothing to send: the invariant below counts on that
        self.an_outbox_message_is_sent_again_only_after_a_relay_died_in_its_window()
        self.check_the_receiver(finished)
        self.check_the_outbox(finished)

    def relay(self, argv):
        """`labs/relay.py ARGV`: a forked child where it kills itself, else relay.main in this
        process; no traceback, a documented exit code."""
        if "--crash-at" in argv:
            code, out, err, _ = forked_lab(argv, self.env, main=relay.main)
        else:
            code, out, err = in_process(argv, self.env, main=relay.main)
        self.transcript.append(f"$ labs/relay.py {' '.join(argv)}\n{out}{err}[exit {code}]")
        assert "Traceback (most recent call last)" not in err, self.report("a traceback")
        assert code in (0, exitcodes.EXIT_KILLED), self.report(f"labs/relay.py exited {code}")
        printed = [e["event"] for e in events(out)]
        if argv[-1:] == ["after-publish"] and "answered" in printed:
            self.relay_window_kills += 1

    def check_the_outbox(self, finished):
        """Each finished outbox thread's message: published, and its answer the receiver's one
        ticket under the message id."""
        by_key = {t["key"]: t for t in get(self.receiver.url + "/tickets")["tickets"]}
        with relay.open_outbox(self.env["CHECKPOINT_DB"]) as outbox:
            rows = {m.message_id: m for m in outbox.messages()}
        for thread, done in finished.items():
            if self.threads[thread].kind != "outbox" or done is None:
                continue
            key = done["message_id"]
            assert key in by_key and rows[key].state == "published", self.report(
                f"outbox thread {thread!r}: message {key!r} is {rows.get(key)}, the receiver "
                f"holds {by_key.get(key)}"
            )
            assert rows[key].answer["ticket_id"] == by_key[key]["ticket_id"], self.report(
                f"message {key!r} was answered {rows[key].answer}, the ticket is {by_key[key]}"
            )

    def settle(self, outcome):
        """What lab 15 asks of a person after exit 6: look at what the provider holds (GET
        /messages), then reconcile --confirmed KEY=ID if the message is there, --not-sent if not,
        with --wait as lab 15 types it (a word is taken once the provider's settle time, 5 s
        after the last send, is over)."""
        key = re.search(r"effect message '([^']+)'", outcome.err)[1]
        ticket = {t["key"]: t["ticket_id"] for t in get(self.receiver.url + "/tickets")["tickets"]}
        text = f"ticket {ticket.get(key.removesuffix(':notify'))} opened"
        sent = [m for m in get(self.receiver.url + "/messages")["messages"] if m["text"] == text]
        said = ["--confirmed", f"{key}={sent[0]['message_id']}"] if sent else ["--not-sent", key]
        settled = self.type(["reconcile", *said, "--wait"])
        assert settled.code == 0, self.report(f"reconcile of {key} exited {settled.code}")

    def check_the_receiver(self, finished):
        """The receiver's ledger against what was started; finished: thread -> its done event."""
        tickets = get(self.receiver.url + "/tickets")["tickets"]
        refunds = get(self.receiver.url + "/refunds")["refunds"]
        by_key = {t["key"]: t["ticket_id"] for t in tickets}
        strays = [t for t in tickets if t["key"] not in self.keys]
        assert not strays, self.report(f"tickets under no started operation's key: {strays}")
        for thread, done in finished.items():
            if done is None or self.threads[thread].kind == "outbox":  # refused for a reused key,
                continue  # or a message: the run ends before the relay delivers it
            key = self.threads[thread].key
            assert key in by_key and done.get("ticket_id") == by_key[key], self.report(
                f"thread {thread!r} finished with ticket {done.get('ticket_id')}, "
                f"the receiver's ticket for {key!r} is {by_key.get(key)}"
            )
        ledger_only = {made.key for made in self.all_made if made.kind == "ticket"}
        ledger_only -= self.keyed_only
        # a saga's three effects (safe mode: the refund too) and every ask for approval go
        # through the ledger whatever the ticket's mode
        sagas = {made.operation for made in self.all_made if made.kind == "saga"}
        ledger_only |= {f"{op}:{step}" for op in sagas for step in ("charge", "reserve", "ship")}
        ledger_only |= {r["key"] for r in refunds if r["key"]}  # the undos: never naive here
        ledger_only |= {key for key in self.keys if key.endswith(":approval")}
        replayed = set(REPLAYED.findall(self.receiver_log())) & ledger_only
        assert not replayed, self.report(
            f"operations run only through the ledger whose key reached the receiver again "
            f"(its log says replayed): {sorted(replayed)}"
        )
        sent = collections.Counter(
            m["text"] for m in get(self.receiver.url + "/messages")["messages"]
        )
        assert all(n == 1 for n in sent.values()), self.report(f"a message sent twice: {sent}")
        per_ticket = collections.Counter(r["ticket_id"] for r in refunds)
        twice = {ticket: n for ticket, n in per_ticket.items() if n > 1}
        assert not twice, self.report(f"charges refunded more than once: {twice}")
        refused = self.capacity_refused | self.carrier_refused
        charges = {by_key.get(f"{op}:charge"): op for op in refused}
        unrefused = [r for r in refunds if r["ticket_id"] not in charges]
        assert not unrefused, self.report(
            "refunds of a charge whose reservation or shipment was never refused "
            f"(refused so: {sorted(refused)}): {unrefused}"
        )
        self.check_the_releases()

    def check_the_releases(self):
        """Lab 13's other undo: at most one release per reservation, and only of a reservation
        whose saga's shipment was refused (no carrier); the receiver's seats never more than
        its 10."""
        listed = get(self.receiver.url + "/releases")
        reservations = get(self.receiver.url + "/reservations")["reservations"]
        by_key = {r["key"]: r["reservation_id"] for r in reservations}
        per_reservation = collections.Counter(r["reservation_id"] for r in listed["releases"])
        twice = {made: n for made, n in per_reservation.items() if n > 1}
        assert not twice, self.report(f"reservations released more than once: {twice}")
        held = {by_key.get(f"{op}:reserve") for op in self.carrier_refused}
        stray = [r for r in listed["releases"] if r["reservation_id"] not in held]
        assert not stray, self.report(f"releases of a reservation never refused a carrier: {stray}")
        assert listed["seats_left"] <= 10, self.report(f"seats freed twice: {listed}")

    # --- one command, and what every command must show ---

    def receiver_log(self):
        return (self.folder / "receiver.log").read_text(errors="replace")

    def requests_to_the_receiver(self):
        """POSTs the receiver answered (created, replayed or refused), from its log."""
        return len(
            re.findall(
                r"^receiver: (?:created|replayed|conflict|rejected) ", self.receiver_log(), re.M
            )
        )

    def starting(self, made, thread, argv, stop):
        """A start: the thread it makes, unless the thread exists (exit 4: then unchanged)."""
        self.keys.add(made.key)
        self.all_made.append(made)
        before = self.threads.get(thread)  # a thread with no checkpoint yet: start makes it anew
        self.threads[thread] = made
        if self.type(argv, stop=stop).code == exitcodes.EXIT_THREAD:
            self.threads[thread] = before
            if before is None:
                del self.threads[thread]

    def type(self, argv, version=None, stop=None):
        """Run `labs/cli.py ARGV` as a learner types it, check what it printed, note its hints.
        stop: a crash (a failpoint, or --crash), or "ctrl-c POINT" (see STOPS)."""
        version = version or self.version
        env = dict(self.env, LAB_GRAPH_VERSION=version)
        ctrl_c_after = stop.removeprefix("ctrl-c ") if stop and stop.startswith("ctrl-c") else None
        if stop and not ctrl_c_after:
            argv = [*argv, *(["--crash"] if stop == "--crash" else ["--crash-at", stop])]
        if ctrl_c_after or any(arg in SIGNALS_ITSELF for arg in argv):
            code, out, err, interrupted = lab_process(argv, env, ctrl_c_after)
        else:
            code, out, err = in_process(argv, env)
            interrupted = False
        typed = " ".join(map(shlex.quote, argv))
        # How a person holds the point to press Ctrl-C there (lab_process holds it with a pause):
        held = f"FAILPOINTS={ctrl_c_after}=sleep(60) " if ctrl_c_after else ""
        interrupt = " (Ctrl-C after its last line)" if ctrl_c_after else ""
        line = f"$ LAB_GRAPH_VERSION={version} {held}labs/cli.py {typed}{interrupt}"
        self.transcript.append(f"{line}\n{out}{err}[exit {code}]")
        thread = argv[argv.index("--thread") + 1] if "--thread" in argv else None
        outcome = Outcome(code, events(out), err, thread, version, interrupted)
        self.check(outcome)
        for hint in outcome.hints:
            self.hints.setdefault(hint, False)
        return outcome

    def check(self, outcome):
        """What every command must show: no traceback, a documented exit code, no effect sent
        again whose result the thread's checkpoint already holds."""
        assert "Traceback (most recent call last)" not in outcome.err, self.report("a traceback")
        if outcome.interrupted:  # the standards: Ctrl-C exits 130 with one line
            assert outcome.code == exitcodes.EXIT_INTERRUPTED, self.report("Ctrl-C: not exit 130")
            assert outcome.err.count("\n") == 1, self.report("Ctrl-C: not one line on stderr")
        assert outcome.code in EXIT_CODES, self.report(
            f"exit {outcome.code} is not in the documented exit codes {sorted(EXIT_CODES)}"
        )
        made = self.threads.get(outcome.thread)
        saved = made.saved if made else set()
        for event in outcome.events:
            field = EFFECTS.get(event["event"])
            assert field is None or field not in saved, self.report(
                f"thread {outcome.thread!r} sent its {event['event']} request again: its "
                f"checkpoint already held {field} (shown by an earlier done, state or approval)"
            )
            if event["event"] == "refused" and "no capacity" in event.get("error", ""):
                op = (made.operation if made else None) or "?"
                self.capacity_refused.add(op)
            if event["event"] == "refused" and "no carrier" in event.get("error", ""):
                self.carrier_refused.add((made.operation if made else None) or "?")
            if made is not None:
                made.saved |= saved_fields(event)
        migrated = [e for e in outcome.events if e["event"] == "migrated"]
        if migrated and outcome.code == 0:
            assert made is None or made.kind == "ticket", self.report(
                f"migrate moved thread {outcome.thread!r}, a saga, into the ticket graph "
                "(a thread another graph saved is not migrate's to move)"
            )
            shown = self.type(["state", "--thread", outcome.thread], outcome.version)
            states = [e for e in shown.events if e["event"] == "state"]
            assert states and states[0]["next"] == migrated[0]["next"], self.report(
                f"migrate said thread {outcome.thread!r} goes on at {migrated[0]['next']}, "
                f"state says {states[0]['next'] if states else None}"
            )

    def report(self, what):
        """The failure message: what broke, and every command this example typed."""
        self.failed = True
        typed = "\n".join(self.transcript)
        return f"{what}\n--- what was typed (the receiver at {self.receiver.url}) ---\n{typed}"


# helpers


class Thread:
    """A thread a start made: a ticket's or a saga's, its operation, the key of its ticket, and
    the fields its checkpoint is known to hold."""

    def __init__(self, kind, operation, key):
        self.kind, self.operation, self.key = kind, operation, key
        self.saved = set()


class Outcome:
    """One command's exit code, events and stderr, and what they say."""

    def __init__(self, code, printed, err, thread, version, interrupted=False):
        self.code, self.events, self.err = code, printed, err
        self.thread, self.version, self.interrupted = thread, version, interrupted

    @property
    def done(self):
        """The `done` event, or None."""
        return next((e for e in self.events if e["event"] == "done"), None)

    @property
    def awaiting_approval(self):
        return any(e["event"] == "awaiting_approval" for e in self.events)

    @property
    def no_thread(self):
        """No checkpoint under this thread (a start stopped before its first one)."""
        return self.code == exitcodes.EXIT_THREAD and "no thread" in self.err

    @property
    def key_conflict(self):
        """Refused for a key reused with another body: 409 by the receiver (an http_error event,
        or a line that names the 409), or by the ledger, which holds the key for another request
        and sent nothing. The thread cannot go on, rightly."""
        return self.code == exitcodes.EXIT_HTTP_ERROR and (
            any(e["event"] == "http_error" and e["status"] == 409 for e in self.events)
            or "409" in self.err
            or "the ledger holds the key" in self.err
            or "was claimed for another" in self.err
        )

    @property
    def hints(self):
        """The commands stderr names, as (argv, LAB_GRAPH_VERSION) to type them with."""
        found = []
        for match in HINT.finditer(self.err):
            words = (*match["command"].split(), "--thread", match["thread"] or self.thread)
            found.append((words, match["version"] or self.version))
        return found


def saved_fields(event):
    """The fields a thread's checkpoint is shown to hold: a done run's values, a state's, an
    approval that waits (its ticket is saved: the approval is a node of its own)."""
    if event["event"] == "done":
        return set(event) - {"event"}
    if event["event"] == "state":
        return set(event["values"])
    if event["event"] == "awaiting_approval":
        return {"ticket_id"}
    return set()


def lab_process(argv, env, ctrl_c_after=None):
    """`labs/cli.py ARGV` as a real process: lab.main in a forked child of this one (LangGraph is
    imported already: a fork costs milliseconds, a new interpreter a second or more). A crash
    failpoint SIGKILLs that child; with ctrl_c_after (a failpoint, held there by a pause nothing
    releases: the SIGINT lands while it waits), the child gets SIGINT once it has printed the
    event just before that point, or runs to its end if it never gets there. (exit code as a
    shell shows it, stdout, stderr, whether SIGINT went)"""
    if not ctrl_c_after:
        return forked_lab(argv, env)
    with tempfile.TemporaryDirectory() as folder:
        held = os.path.join(folder, "held")
        return forked_lab(argv, dict(env, FAILPOINTS=f"{ctrl_c_after}=pause({held})"), ctrl_c_after)


def forked_lab(argv, env, ctrl_c_after=None, main=lab.main):
    """lab_process's fork, run and wait (main: lab.main, or relay.main)."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as effectdrill forks
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            signal.signal(
                signal.SIGINT, signal.default_int_handler
            )  # Python's own, as labs/cli.py's
            os.dup2(out_write, 1)
            os.dup2(err_write, 2)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            code = main(list(argv), env)
        except SystemExit as exit:  # argparse
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:  # what an uncaught exception prints: the test flags it
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(out_write)
    os.close(err_write)
    hung = []  # a hang guard: a child held at its point for good (its line never came)
    guard = threading.Timer(HANG_GUARD_S, lambda: hung.append(os.kill(pid, signal.SIGKILL)))
    guard.start()
    try:
        with open(out_read) as out, open(err_read) as err:
            held = CTRL_C_AFTER[ctrl_c_after] if ctrl_c_after else ()  # every STOPS point
            lines, sent = [], False
            for line in out:
                lines.append(line)
                if not sent and line.startswith("{") and json.loads(line)["event"] in held:
                    os.kill(pid, signal.SIGINT)
                    sent = True
            printed, complaints = "".join(lines), err.read()
        _, status = os.waitpid(pid, 0)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        guard.cancel()
    assert not hung, (
        f"labs/cli.py {argv} ran past the {HANG_GUARD_S} s hang guard: {printed}{complaints}"
    )
    code = shell_exit_code(os.waitstatus_to_exitcode(status))
    return code, printed, complaints, sent


def in_process(argv, env, main=None):
    """`labs/cli.py ARGV` as lab.main in this process (tests/conftest.py's `workflow` fixture), or
    main(ARGV, env) (relay.main); an exception that escapes it is what Python prints for one: a
    traceback, exit 1."""
    try:
        done = run_workflow_here(argv, env) if main is None else run_here(main, argv, env)
    except Exception:  # the check after it flags the traceback
        return 1, "", traceback.format_exc()
    return shell_exit_code(done.returncode), done.stdout, done.stderr


def run_here(main, argv, env):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv), env)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def import_what_lab_imports_when_it_runs():
    import langgraph.checkpoint.sqlite  # noqa: F401
    import langgraph.errors  # noqa: F401
    import langgraph.graph  # noqa: F401
    import langgraph.runtime  # noqa: F401
    import langgraph.types  # noqa: F401


def get(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def seeded(factory):
    """LAB_PROPERTY_SEED: unset, the examples are derandomized (the same ones every run); a
    number draws them from that seed, `random` from a new one. (factory, how to reproduce)."""
    seed = os.environ.get("LAB_PROPERTY_SEED", "")
    if not seed:
        return factory, "run this test again (its examples are the same every run)"
    seed = random.randrange(2**32) if seed == "random" else int(seed)
    return hypothesis.seed(seed)(factory), f"LAB_PROPERTY_SEED={seed} and this test"


SETTINGS = settings(
    max_examples=int(os.environ.get("LAB_PROPERTY_EXAMPLES", "12")),
    stateful_step_count=20,
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,
    # Shrinking a failure to its shortest sequence takes minutes here: LAB_PROPERTY_SHRINK=1.
    # Without it the failure shows the sequence as found, and every command it typed.
    phases=[p for p in Phase if p != Phase.shrink or os.environ.get("LAB_PROPERTY_SHRINK")],
    derandomize=not os.environ.get("LAB_PROPERTY_SEED"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
