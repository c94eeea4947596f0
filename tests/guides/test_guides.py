"""Every lab guide, run command by command through every backend, must print what it promises.

The local backend runs everywhere. The docker backend needs an engine: without one it is
skipped with a loud reason, and with LAB_REQUIRE_DOCKER=1 (CI) it fails instead. Each Docker
test runs its guide in a Compose project of its own (LAB_DOCKER_PROJECT-NN, default
stateful-lab-test-NN), so the tests run side by side and never touch a learner's stateful-lab.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from shutil import which

import pytest
from conftest import require_postgres
from hints_helpers import printed_for_docker, restarts_for_docker
from pictures_helpers import assert_each_picture_marks_what_was_told

from labs import conditions
from tools import demo
from tools.backends import (
    LOST_ACK,
    DockerBackend,
    LocalBackend,
    parse_command,
)
from tools.local import ROOT, events, run_command
from tools.runner import COMPOSE_PREFIX, lines_match, parse_guide, run_guide, run_step

GUIDES = sorted((ROOT / "labs").glob("[0-9][0-9]-*.md"))
SCALE = {g for g in GUIDES if "up -d postgres" in g.read_text(encoding="utf-8")}  # lab 10
# The guides whose run takes about 30 s or more (--durations): marked long, started first.
LONG = {"04", "10", "11"}  # natively
LONG_DOCKER = LONG | {"07", "08", "09", "12", "13", "14", "15"}  # a container a command
# Through Docker, labs 01 and 20 are told by the demo in the room test
# (tests/guides/test_demo_room.py, GUIDES): every command checked against its guide there, as
# here (the demo's exit 1 names each command that differs), and the project left empty.
TOLD_IN_THE_ROOM = {"01", "20"}


def each_guide(long=LONG, told_elsewhere=()):
    return [
        pytest.param(g, id=g.stem, marks=[pytest.mark.long] if g.name[:2] in long else [])
        for g in GUIDES
        if g.name[:2] not in told_elsewhere
    ]


PROJECT_PREFIX = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test")
UP = "docker compose -p stateful-lab up -d --build api"
UP_FILES = "docker compose -p stateful-lab -f compose.yaml"  # an `up` with an override file
# The reset: --remove-orphans also removes a stopped container that a `run` typed without --rm
# left, which Compose 2's `down -v` keeps, and with it the checkpoints ("Resource is still in use").
DOWN = "docker compose -p stateful-lab down -v --remove-orphans"
UP_LOST_ACK = f"docker compose -p stateful-lab -f compose.yaml -f {LOST_ACK} up -d --build api"
KEY_RETENTION = "labs/key-retention.compose.yaml"  # lab 14: keys honoured for 2 s
KEY_RETENTION_24H = "labs/key-retention-24h.compose.yaml"  # lab 14's fix: for 24 hours
WEBHOOKS = "labs/webhooks.compose.yaml"  # lab 18: each webhook twice, the pending newest first
SLOW_PAYMENTS = "labs/slow-payments.compose.yaml"  # lab 15: each charge committed 3 s late
OVERRIDES = {
    "06": {LOST_ACK},
    "14": {KEY_RETENTION, KEY_RETENTION_24H},
    "15": {SLOW_PAYMENTS},
    "18": {WEBHOOKS},
}  # the
#                                                              only guides with override files


def describe(outcomes):
    lines = []
    for outcome in outcomes:
        mark = "ok " if outcome.ok else "!! "
        lines.append(f"{mark}$ {outcome.step.command}")
        if not outcome.ok:
            lines += ["   " + p for p in outcome.problems]
            lines += ["   expected: " + e for e in outcome.step.expected]
            lines += ["   got:      " + g for g in outcome.stdout.splitlines()]
            lines += ["   stderr:   " + e for e in outcome.stderr.splitlines()[-5:]]
            lines.append(f"   exit {outcome.exit_code}")
    return "\n".join(lines)


def assert_guide_holds(guide, backend):
    outcomes = run_guide(guide, backend)
    assert outcomes, f"{guide.name} has no commands"
    assert all(o.ok for o in outcomes), f"{guide.name} differs:\n{describe(outcomes)}"


def assert_reset_left_no_volume(guide, backend):
    """The guide's last command, `down -v`, removed every volume of the project (with -f files,
    Compose 2.26 would keep the checkpoints: lab 06 resets without them)."""
    label = f"label=com.docker.compose.project={backend.project}"
    left = run_command(
        ["docker", "volume", "ls", "-q", "--filter", label], timeout=30
    ).stdout.split()
    assert left == [], f"{guide.name}: its reset left {left}"


@pytest.mark.fast
def test_the_guides_left_to_the_room_test_are_told_there_through_docker():
    """test_guide_docker leaves TOLD_IN_THE_ROOM to the room test: it tells them through Docker."""
    import test_demo_room

    room = test_demo_room.test_at_each_prompt_the_last_commands_output_is_on_screen

    assert TOLD_IN_THE_ROOM <= {name[:2] for name in test_demo_room.GUIDES}
    (backends,) = [m.args for m in room.pytestmark if m.name == "parametrize"]
    assert "docker" in [getattr(b, "values", (b,))[0] for b in backends[1]]


def test_there_are_guides_and_each_starts_and_ends_with_the_reset():
    """Each guide's first command is the reset, so a lab left over (a skipped reset) cannot
    change its ticket numbers, and its last is the reset, so it leaves nothing behind."""
    assert [g.name[:2] for g in GUIDES] == [f"{n:02d}" for n in range(1, len(GUIDES) + 1)]
    for guide in GUIDES:
        commands = [s.command for s in parse_guide(guide.read_text(encoding="utf-8"))]
        compose = [c for c in commands if parse_command(c).verb != "sleep"]  # lab 14 waits
        assert compose[0] == compose[-1] == DOWN, guide.name
        # An override file only where a lab turns a setting on (lab 06 its fault, lab 14 its key
        # retention), and only on an `up` line: the api container keeps the setting until the
        # next `up`, and no other command touches it (the workflow does not depend on the api,
        # so no `run` recreates it: test_a_run_without_the_override_leaves_the_receiver_alone).
        # The resets name none: with -f, `down -v` in Compose 2.26 leaves the checkpoints.
        assert compose[1].endswith(" up -d --build api"), guide.name
        for command in compose[1:-1]:
            cmd = parse_command(command)
            if cmd.verb != "up":
                assert cmd.files == [], f"{guide.name}: {command}"
            assert set(cmd.overrides) <= set(OVERRIDES.get(guide.name[:2], ())), guide.name


def test_compose_yaml_turns_no_fault_on_and_the_override_does():
    yaml = pytest.importorskip("yaml")
    api = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["api"]
    assert "FAILPOINTS" not in api["environment"]
    override = yaml.safe_load((ROOT / LOST_ACK).read_text())
    env = {"FAILPOINTS": "before-answer=drop-answer"}
    assert override == {"services": {"api": {"environment": env}}}
    webhooks = {"environment": {"FAILPOINTS": "redeliver=on;reorder=on"}}  # lab 18's
    assert yaml.safe_load((ROOT / WEBHOOKS).read_text()) == {"services": {"api": webhooks}}
    slow = {"environment": {"FAILPOINTS": "payment-commit=sleep(3)"}}  # lab 15's
    assert yaml.safe_load((ROOT / SLOW_PAYMENTS).read_text()) == {"services": {"api": slow}}
    # what a lesson's missing-condition line tells a learner to start the receiver with
    assert conditions.SLOW_PAYMENTS == (SLOW_PAYMENTS, slow["environment"])
    assert conditions.WEBHOOK_FAULTS == (WEBHOOKS, webhooks["environment"])
    assert conditions.LOST_ACK == (LOST_ACK, env)
    for name, seconds in ((KEY_RETENTION, "2"), (KEY_RETENTION_24H, "86400")):  # lab 14's
        api = {"environment": {"RECEIVER_KEY_RETENTION_S": seconds}}
        assert yaml.safe_load((ROOT / name).read_text()) == {"services": {"api": api}}


@pytest.mark.parametrize("guide", each_guide())
def test_guide_local(guide, tmp_path, capsys):
    """Natively: workflow commands with a signal switch run as forked processes, the rest in-process
    (the same workflow.main, without LangGraph's import per command); the README's native
    section and `make demo` run every command as a process. The commands of the guides in
    DEMO_VERDICTS run through the demo's own step (tools.demo.Demo.run), whose verdict is
    checked here too."""
    if guide in SCALE:
        require_postgres()  # natively, its postgres service is a throwaway cluster
    backend = LocalBackend(tmp_path / "data", log_path=tmp_path / "receiver.log", in_process=True)
    try:
        steps = parse_guide(guide.read_text(encoding="utf-8"))
        told = None
        if guide.name[:2] in DEMO_VERDICTS:  # through the demo's step: its verdict checked too
            outcomes, told = assert_the_demo_tells_it(guide, steps[:-1], backend, capsys, tmp_path)
        else:
            outcomes = [run_step(step, backend) for step in steps[:-1]]
        assert all(o.ok for o in outcomes), f"{guide.name} differs:\n{describe(outcomes)}"
        missing = [o.stderr for o in outcomes if "did not happen" in o.stderr]  # labs/conditions
        assert not missing, f"{guide.name}: a condition said missing as typed: {missing}"
        assert_the_ledger_counts_the_tickets(guide, steps, backend)
        if guide.name.startswith("11-"):
            assert_the_drills_stderr_is_the_graphs_own_lines(outcomes)
        if guide.name.startswith("05-"):
            assert_lab_05_quotes_the_proofs_line(guide, outcomes)
        if guide.name.startswith("12-"):
            assert_lab_12_quotes_its_refusals(guide, outcomes)
        if guide.name.startswith("15-"):
            assert_lab_15_quotes_its_stop_and_nothing_was_replayed(guide, outcomes, backend)
        if guide.name.startswith("07-"):
            assert_lab_07_quotes_its_refusal(guide, outcomes)
        if guide.name.startswith("16-"):
            assert_the_projector_fits_the_drills_tables(outcomes)
        assert_the_log_lines_shown_are_the_receivers(outcomes)
        last = run_step(steps[-1], backend)  # the reset
        assert last.ok, f"{guide.name} differs:\n{describe([last])}"
        if guide.name[:2] in PICTURED:  # last: without Chromium, skipped (loudly) after the rest
            pictured = {guide.name[:2]: told}
            assert_each_picture_marks_what_was_told(pictured, tmp_path / "pictures", tmp_path)
    finally:
        backend.close()


# What `make demo` says of these guides before their reset: the verdict, counted on the receiver
# (tools.demo.TicketsByOperation), and the closing line on the modes. Checked on the guide's
# native run.
DEMO_VERDICTS = {
    "05": (
        [  # node-uuid's two tickets: two keys, neither the operation's (the lab's lesson)
            "case-uuid:open-ticket:v1: 2 tickets for one operation (duplicate), start killed at "
            "after-ack, resume sent it again (ticket 2), under 2 different keys, none the "
            "operation's (to the receiver, 2 operations)",
            "case-safe:open-ticket:v1: 1 ticket, start killed at after-ack, resume sent it again "
            "and got created: false (the key), start sent it again and got created: false (the "
            "key)",
        ],
        "What the labs showed: node-uuid: 1 of 1 operation duplicated; "
        "safe: 0 of 1 operation duplicated",
    ),
    "07": (
        [  # approve's in-node duplicate and keyed replay, each on its operation; each run's ask
            #   for approval (its own ticket, keyed OPERATION:approval) on the operation that asked
            "case-in-node:open-ticket:v1: 2 tickets for one operation (duplicate), "
            "asked for approval once, approve sent it again (ticket 3)",
            "case-in-node-safe:open-ticket:v1: 1 ticket, asked for approval once, "
            "approve sent it again and got created: false (the key)",
            "case-in-node-ledger:open-ticket:v1: 1 ticket, asked for approval once, approve took "
            "ticket 6 from the ledger's receipt",
            "case-own-node:open-ticket:v1: 1 ticket, asked for approval once",
            # the bound approval: killed after the yes, the title edited, the resume refused
            #   (its approval is for the old request), approved again and sent under that one
            "case-bound:open-ticket:v1: 1 ticket, asked for approval once, approve killed at "
            "before-request, resume refused (exit 77): approval 1 is for request "
            "sha256:0efdf5f011b0 and the request now is sha256:353f52b80bf7, nothing sent, "
            "approve sent it under approval 2 (sha256:353f52b80bf7, by ana)",
        ],
        "What the labs showed: naive: 1 of 2 operations duplicated; "
        "safe: 0 of 1 operation duplicated; ledger: 0 of 2 operations duplicated",
    ),
    "10": (
        [  # background workers' tickets by their key; the frozen naive worker's keyless
            #   duplicate by the drain's `done` and the woken worker's `held_run`
            "case-1:open-ticket:v1: 1 ticket",
            "case-2:open-ticket:v1: 1 ticket",
            "case-3:open-ticket:v1: 1 ticket",
            "case-4:open-ticket:v1: 1 ticket, worker run took ticket 4 from the ledger's receipt",
            "case-5:open-ticket:v1: 2 tickets for one operation (duplicate), ticket 5 by the "
            "worker started by hand (`worker run`), ticket 6 by the frozen worker, once woken",
            "case-6:open-ticket:v1: 1 ticket, the frozen worker, once woken, sent it again and "
            "got created: false (the key), ticket 7 by the worker started by hand (`worker run`)",
            "case-7:open-ticket:v1: 1 ticket, the frozen worker, once woken, sent nothing (the "
            "ledger held ticket 8's receipt), ticket 8 by the worker started by hand "
            "(`worker run`)",
        ],
        "What the labs showed: ledger: 0 of 5 operations duplicated; "
        "naive: 1 of 1 operation duplicated; safe: 0 of 1 operation duplicated",
    ),
    "09": (
        [  # the drain named: SIGTERM before the effect drains, after it the step finishes
            "case-deploy-prepare:open-ticket:v1: 1 ticket, start drained on SIGTERM at a step "
            "boundary",
            "case-deploy-ack:open-ticket:v1: 1 ticket, start finished its step after SIGTERM, "
            "resume redid nothing",
            "case-deploy-killed:open-ticket:v1: 2 tickets for one operation (duplicate), start "
            "killed at after-ack, resume sent it again (ticket 4)",
        ],
        "What the labs showed: naive: 1 of 3 operations duplicated",
    ),
    "11": (
        [  # each drill's tickets are its own crash runs', summed; its summary is its verdict
            "drill labs.graphs.ticket:graph (naive): 9 tickets on its own 8 threads, the drill "
            "says: 7 crash points, 1 duplicate (ticket), 0 missing, 0 failed resumes, clean run ok",
            "drill labs.graphs.ticket:graph (safe): 8 tickets on its own 8 threads, the drill "
            "says: 7 crash points, 0 duplicate, 0 missing, 0 failed resumes, clean run ok",
            "drill labs.graphs.ticket:graph (naive, durability exit): 3 tickets on its own 2 "
            "threads, the drill says: 1 crash point, 1 duplicate (ticket), 0 missing, 0 failed "
            "resumes, clean run ok",
            "drill labs.graphs.ticket:graph (node-uuid): 9 tickets on its own 8 threads, the drill "
            "says: 7 crash points, 1 duplicate (POST /tickets), 0 missing, 0 failed resumes, "
            "clean run ok",
            "drill labs.graphs.shop:graph: the drill says: 9 crash points, 1 duplicate (charge), "
            "0 missing, 0 failed resumes, clean run ok",
            "drill labs.graphs.approval:graph: did not run (exit 2): the graph stopped at "
            "interrupt() in request_refund: give the answer to resume with (--resume-with JSON "
            "or MODULE:FUNC, or resume_with=)",
            "drill labs.graphs.approval:graph #2: the drill says: 10 crash points, 3 duplicate "
            "(request), 0 missing, 0 failed resumes, the clean run repeated request "
            "(request_refund re-ran it after an interrupt)",
            "case-before-deploy: 1 ticket, start killed at after-ack",  # not the drills' 29
            "drill replay labs.graphs.ticket:graph_v2: the drill says: 1 unfinished thread, 1 LOST",
            "drill replay labs.graphs.ticket:graph: the drill says: 1 unfinished thread, every "
            "one resumes",
        ],
        "What the labs showed: 6 of 8 drills found an effect repeated or lost, 1 more did not "
        "run (exit 2); "
        "ledger: 0 of 1 operation duplicated",
    ),
    "16": (
        [  # the drills' tickets, not "no key" and not an operation each
            "drill labs.graphs.classify:naive: 18 tickets on its own 17 threads, 37 messages to "
            "its own 17 threads (its clean run's got 2, each crash run's 2 to 3), the drill says: "
            "16 crash points, 5 duplicate (email, seats, ticket), 0 missing, 0 failed resumes, "
            "the clean run repeated email (ask_and_email re-ran it after an interrupt)",
            "drill labs.graphs.classify:fixed: 19 tickets on its own 19 threads, 19 messages to "
            "its own 19 threads (its clean run's got 1, each crash run's 1), the drill says: "
            "18 crash points, 0 duplicate, 0 missing, 0 failed resumes, clean run ok",
        ],
        "What the labs showed: 1 of 2 drills found an effect repeated or lost",
    ),
    "20": (
        [  # the emails its runs sent, on the receiver: 2 approved, the clean run's 3 (lab 20)
            "drill labs.graphs.assistant:naive: 66 messages to its own 21 threads (its clean "
            "run's got 3, each crash run's 3 to 5), the drill says: 20 crash points, 3 duplicate "
            "(email-1, email-2), 0 missing, 0 failed resumes, the clean run repeated email-1 "
            "(approval/review_and_send re-ran it after an interrupt)",
            "drill labs.graphs.assistant:naive #2: did not run (exit 2): the clean run made no "
            "effect the observer counts (email-1 0, email-2 0): no crash could repeat one, so "
            "the drill would test nothing. The graph may act only on some answers or inputs: "
            "give a --resume-with or --input that makes it act, or --allow-no-effects if this "
            "run is meant to make none",
            "drill labs.graphs.assistant:fixed: 46 messages to its own 23 threads (its clean "
            "run's got 2, each crash run's 2), the drill says: 22 crash points, 0 duplicate, "
            "0 missing, 0 failed resumes, clean run ok",
        ],
        "What the labs showed: 1 of 2 drills found an effect repeated or lost, 1 more did not "
        "run (exit 2)",
    ),
    "12": (
        [  # the renamed node: done, and no ticket ever made; the guarded one made its ticket
            "case-renamed:open-ticket:v1: 0 tickets, start drained on SIGTERM at a step boundary, "
            "LOST: the run said done and no ticket was ever made (0 tickets)",
            "case-guarded:open-ticket:v1: 1 ticket, start drained on SIGTERM at a step boundary, "
            "resume refused: the thread was saved under another graph (exit 65)",
            "case-rekeyed:open-ticket:v1: 1 ticket, start killed at after-ack, resume refused: "
            "the thread was saved under another key derivation (exit 65), resume took ticket 2 "
            "from the ledger's receipt",
        ],
        "What the labs showed: ledger: 0 of 3 operations duplicated, 1 lost",
    ),
    "13": (
        [  # each saga's undos in the order they ran, and the refunds and releases as listed
            "case-booked:book:v1: 1 ticket",
            "case-naive:book:v1: 1 ticket, saga start killed at after-release-ack, saga resume "
            "killed at after-refund-ack, undone in reverse order: releases 1 and 2, then refunds "
            "1 and 2, 2 releases of its one reservation (the release ran twice: it freed seats "
            "nobody held), 2 refunds of its one charge (the refund ran twice)",
            "case-safe:book:v1: 1 ticket, saga start killed at after-release-ack, saga resume "
            "took release 3 from the ledger's receipt, saga resume killed at after-refund-ack, "
            "saga resume took refund 3 from the ledger's receipt, undone in reverse order: "
            "release 3, then refund 3, each once",
            "case-window:book:v1: 1 ticket, saga start killed at after-reserve-ack, saga resume "
            "took reservation 4 from the ledger's receipt, saga resume killed at after-send, saga "
            "resume adopted shipment 2, found by its key",
            "drill labs.saga:graph (naive): 14 tickets on its own 14 threads, the drill says: 13 "
            "crash points, 2 duplicate (refund, release), 0 missing, 0 failed resumes, clean run "
            "ok",
        ],
        "What the labs showed: safe: 0 of 3 operations duplicated; naive: 1 of 1 operation "
        "duplicated; 1 of 1 drill found an effect repeated or lost\n"
        'What the commands above did (tools.tally): {"event": "tally", "started": 4, '
        '"resumed": 6, "drained": 0, "acknowledged": 15, "replayed": 0, "settled": 1}',  # + saga
    ),
    "15": (
        [  # adopted, from the receipt, settled by a person: each on its operation
            "case-adopt:open-ticket:v1: 1 ticket, start killed at after-send, resume adopted "
            "ticket 1, found by its key",
            "case-receipt:open-ticket:v1: 1 ticket, start killed at after-ack, resume took ticket "
            "2 from the ledger's receipt",
            "case-note:open-ticket:v1: 1 ticket, start killed at after-ack, resume took ticket 3 "
            "from the ledger's receipt, resume killed at after-send, resume stopped for a person "
            "(exit 6), settled by a person (confirmed), resume took message 1 from the ledger's "
            "receipt, 1 message sent about it",
            # the slow provider: "lookup found nothing, send again" charges twice, the ledger once
            "case-twice:pay:v1: 1 ticket, start stopped for a person (exit 6), reconcile found it "
            "at the provider (confirmed), 2 charges for its one payment (charged 2 times)",
            "case-once:pay:v1: 1 ticket, start stopped for a person (exit 6), reconcile found it "
            "at the provider (confirmed), resume took payment 3 from the ledger's receipt, "
            "1 charge for its one payment",
        ],
        "What the labs showed: ledger: 0 of 4 operations duplicated; lookup-resend: 1 of 1 "
        "operation duplicated",
    ),
    "18": (
        [  # the customer's messages (as `messages` lists them) and the status going back
            "case-hook-1:open-ticket:v1: 1 ticket, its status went back from resolved (v3) to "
            "opened (v1), 2 messages sent about it, the same one 2 times (a double notice)",
            "case-hook-2:open-ticket:v1: 1 ticket, 4 deliveries seen before, flagged duplicate: "
            "true, 3 deliveries refused (403), nothing applied, 1 message sent about it",
        ],  # counted by the endpoint's mode, not the tickets' (the ledger made both, once)
        "What the labs showed: webhooks, naive endpoint: 1 of 1 operation duplicated; "
        "webhooks, inbox: 0 of 1 operation duplicated",
    ),
    "19": (
        [  # the relay's deliveries, and what the receiver made of them
            "case-outbox:open-ticket:v1: 1 ticket, outbox start killed at after-outbox, the relay "
            "delivered it 2 times, the receiver made 1 and answered 1 from its key",
        ],
        "What the labs showed: ledger: 0 of 1 operation duplicated\n"
        'What the commands above did (tools.tally): {"event": "tally", "started": 1, '
        '"resumed": 1, "drained": 0, "acknowledged": 1, "replayed": 1, "settled": 0}',  # + relay
    ),
    "17": (
        [  # no crash: LangGraph's RetryPolicy ran the node again, in the same start
            "case-017-naive:open-ticket:v1: 2 tickets for one operation (duplicate), start's node "
            "failed after the answer (ReadTimeout) and LangGraph ran it again",
            "case-017-safe:open-ticket:v1: 1 ticket, start's node failed after the answer "
            "(ReadTimeout) and LangGraph ran it again, start sent it again and got created: "
            "false (the key)",
            "case-017-ledger:open-ticket:v1: 1 ticket, start's node failed after the answer "
            "(JSONDecodeError) and LangGraph ran it again, start took ticket 4 from the ledger's "
            "receipt",
        ],
        "What the labs showed: naive: 1 of 1 operation duplicated; safe: 0 of 1 operation "
        "duplicated; ledger: 0 of 1 operation duplicated",
    ),
    "14": (
        [  # expired keys show as null: each ticket still counts on the command's operation
            "case-kept:open-ticket:v1: 2 tickets for one operation (duplicate), start killed at "
            "after-ack, resume sent it again (ticket 2), the receiver made a new ticket for a key "
            "it no longer held (expired)",
            "case-kept-day:open-ticket:v1: 1 ticket, start killed at after-ack, resume sent it "
            "again and got created: false (the key)",
        ],
        "What the labs showed: safe: 1 of 2 operations duplicated",  # the key had expired
    ),
}


PICTURED = {"13", "15", "16", "18"}  # their pictures checked on this run (lab 01's: test_readme.py)


def assert_the_demo_tells_it(guide, steps, backend, capsys, folder):
    """`make demo` on the guide, but for its reset: each command run by the demo's own step
    (Demo.run: the command shown as typed, its native line, its output), then the verdict the
    demo says before the reset and its closing lines. Returns the outcomes. One run of the guide
    serves both (labs 07, 10 and 14 each ran a second time in test_demo.py); for the labs in
    PICTURED, the picture `make demo` draws of it too (tests/pictures_helpers.py; they had a demo
    run of their own in test_demo_pictures.py). The reset, left out, draws nothing."""
    number = guide.name[:2]
    verdicts, showed = DEMO_VERDICTS[number]
    pictures = folder / "pictures" if number in PICTURED else None  # as make demo's PICTURES
    teller, ledger = (
        demo.Demo(backend, demo.Style(False), pictures=pictures),
        demo.TicketsByOperation(),
    )
    teller.guide = guide.name  # as Demo.tell sets it: a drill's --html names its lab
    if pictures is not None:
        pictures.mkdir(parents=True)
    capsys.readouterr()
    for step in steps:
        teller.run(step, ledger)
    teller.verdict(ledger)
    assert teller.closing([guide]) == demo.EXIT_OK
    out = capsys.readouterr().out
    if pictures is not None:
        demo.draw(teller, guide, pictures)  # checked last by test_guide_local (needs Chromium)
    said = out.split("Verdict, counted on the receiver\n")[1].split("\n\n")[0]
    assert [line.strip() for line in said.splitlines()] == verdicts, out
    assert showed in out, out
    for step in steps:
        if parse_command(step.command).verb == "sleep":  # lab 14: shown as typed, no native line
            assert f"\n$ {step.command}\n" in out and f"natively: {step.command}" not in out
    return teller.outcomes, out


def assert_the_projector_fits_the_drills_tables(outcomes):
    """Lab 16's drill tables (125 columns as the drill prints them) fit a 120-column terminal in
    the demo's projector mode, with every word (a long cell wrapped within its column)."""
    for outcome in (o for o in outcomes if " drill " in o.step.command):
        lines = outcome.stdout.splitlines()
        fitted = demo.fit_tables(lines, 119)
        tables = [
            line for line in fitted if not line.startswith("summary: ")
        ]  # a line, not a table
        assert max(map(len, lines)) > 119 >= max(map(len, tables)), "\n".join(fitted)
        assert sorted(" ".join(fitted).split()) == sorted(" ".join(lines).split())  # every word


def assert_the_log_lines_shown_are_the_receivers(outcomes):
    """The lines a guide shows under `logs api` are the receiver's own (`receiver: ...`), as its
    log file holds them: the runner compares `logs` without the name Compose puts before each
    line (`api-1  |` in v2, `api_1  |` in v1), natively against the native receiver's log."""
    for outcome in (o for o in outcomes if o.step.command.endswith(" logs api")):
        expected = [COMPOSE_PREFIX.sub("", line) for line in outcome.step.expected]
        assert all(line == "..." or line.startswith("receiver: ") for line in expected), expected
        assert lines_match(expected, outcome.stdout.splitlines()), outcome.stdout


def test_the_guides_that_teach_from_the_log_show_it():
    shown = {
        guide.name[:2]
        for guide in GUIDES
        if any(s.command.endswith(" logs api") for s in parse_guide(guide.read_text("utf-8")))
    }
    assert shown >= {"01", "02", "06"}


def assert_the_ledger_counts_the_tickets(guide, steps, backend):
    """Before the reset: /metrics counts as many tickets created as the receiver holds (every
    ticket the guide made, whichever command made it). A guide that restarts the receiver
    restarts its counters too: then the count is of the tickets made since."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(backend.env["API_URL"] + "/metrics", timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    (created,) = families["receiver_tickets_created"].samples
    held = len(backend.tickets())
    ups = [s for s in steps if re.search(r" (up -d --build api|restart api)$", s.command)]
    if len(ups) == 1:
        assert created.value == held, guide.name
    else:
        assert created.value <= held, guide.name


def assert_lab_07_quotes_its_refusal(guide, outcomes):
    """Lab 07 quotes, in its prose, the one line its exit-77 refusal prints on stderr."""
    prose = " ".join(guide.read_text(encoding="utf-8").split())
    (quoted,) = re.findall(r"nothing sent: `(ticket [^`]+)`", prose)
    (refused,) = [o for o in outcomes if o.exit_code == 77]
    assert refused.stderr == f"labs: {quoted}\n", (refused.stderr, quoted)


def assert_lab_05_quotes_the_proofs_line(guide, outcomes):
    """Lab 05 quotes the line trace-keys prints on stderr when a thread's node sent two keys
    (the node-uuid run's spans: exit 8), and only the failing proof prints one."""
    text = " ".join(guide.read_text(encoding="utf-8").split())
    proofs = [o for o in outcomes if o.step.command.endswith(" trace-keys")]
    assert [o.exit_code for o in proofs] == [0, 8], proofs
    assert proofs[0].stderr == ""
    (line,) = proofs[1].stderr.splitlines()
    assert f"Stderr has one line: `{line}`." in text, line


def assert_lab_12_quotes_its_refusals(guide, outcomes):
    """Lab 12 quotes the line each exit-65 resume prints: another graph, another key derivation
    (whose hint keeps the keys)."""
    text = " ".join(guide.read_text(encoding="utf-8").split())
    refused = [o for o in outcomes if o.exit_code == 65]
    assert len(refused) == 2, refused
    for outcome in refused:
        (line,) = outcome.stderr.splitlines()
        assert f"Stderr has one line: `{line}`" in text, line


def assert_lab_15_quotes_its_stop_and_nothing_was_replayed(guide, outcomes, backend):
    """Lab 15 quotes the one line each of its exit-6 stops prints on stderr (the message's, and
    the payment's, whose lookup came at least the client's timeout after the send and sooner
    than the provider's settle time), says the receiver answered no repeat (the receipts and the
    lookup sent nothing twice), and that lookup-resend's second request timed out too (unknown,
    exit 6: the keyed message, which names the receiver's address, is not quoted)."""
    quoted = [
        line
        for line in guide.read_text(encoding="utf-8").splitlines()
        if line.startswith("labs: effect ")
    ]
    resent = [o for o in outcomes if "--mode lookup-resend" in o.step.command]
    stops = [o.stderr for o in outcomes if o.exit_code == 6 and o not in resent]
    assert len(quoted) == 2 and stops, guide.name
    after = re.compile(r"found nothing (\d+\.\d) s after")
    for stop in stops:
        shapes = [re.escape(line).replace(r"0\.5", r"(\d+\.\d)") for line in quoted]
        matched = [m for shape in shapes if (m := re.fullmatch(shape + "\n", stop))]
        assert len(matched) == 1, (stop, quoted)
        if found := after.search(stop):
            assert 0.5 <= float(found.group(1)) < 10, stop  # API_TIMEOUT_S=0.5, settle_s=10
    assert [o.exit_code for o in resent] == [6], resent  # its second request: unknown too
    assert "no answer from the receiver" in resent[0].stderr, resent[0].stderr
    with urllib.request.urlopen(backend.env["API_URL"] + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    assert "receiver_idempotent_replays_total 0" in text.splitlines(), text


def assert_the_drills_stderr_is_the_graphs_own_lines(outcomes):
    """Lab 11 says what its drills print besides the table: the ticket graph's own JSON lines
    (prepare, effect_ack), once for the clean run and again for each crash run, on stderr; the
    shop and the approval graph print nothing."""
    drills = [
        o for o in outcomes if " run --rm drill " in o.step.command and not o.step.exit_code == 2
    ]
    assert drills
    for outcome in drills:
        lines = outcome.stderr.splitlines()
        if " drill replay " in outcome.step.command:  # a resume: the resumed node's lines only
            resumed = set() if "graph_v2" in outcome.step.command else {"effect_ack"}  # nothing
            assert {json.loads(line)["event"] for line in lines} == resumed, lines  # runs in v2
            continue
        if "labs.graphs.ticket:graph" not in outcome.step.command:
            assert lines == [], outcome.step.command
            continue
        events = {json.loads(line)["event"] for line in lines}
        assert events == {"prepare", "effect_ack"}, lines
        points = int(
            outcome.stdout.split(": ", 1)[1].split()[0]
        )  # "durability sync: 7 crash points"
        assert len(lines) > points, lines  # the clean run's, then the crash runs'


@pytest.mark.docker
@pytest.mark.parametrize("guide", each_guide(LONG_DOCKER, TOLD_IN_THE_ROOM))
def test_guide_docker(guide, tmp_path, monkeypatch):
    backend = DockerBackend(f"{PROJECT_PREFIX}-{guide.name[:2]}")
    try:
        assert backend.down().exit_code == 0  # leftovers of an interrupted run
        if guide.name[:2] == "16":
            assert_the_demos_drill_reports_reach_the_host(guide, backend, tmp_path, monkeypatch)
            follow_lab_16s_traceback(guide, backend, monkeypatch)
        elif guide.name[:2] in HINTS_FOLLOWED:
            assert_the_hints_run_as_printed_through_docker(guide, backend)
        else:
            if guide.name[:2] == "11":  # the drill as `make demo` runs it: as the user, in the
                #   image's group (LAB_DRILL_USER), so its replays can read the checkpoints
                for name, value in demo.docker_reports(tmp_path).items():
                    monkeypatch.setenv(name, value)
            assert_guide_holds(guide, backend)
        assert_reset_left_no_volume(guide, backend)
    finally:
        backend.close()


PAYMENTS_SCRIPT = (  # in the api container: the charges under a reference, and how many pend
    "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
    "'http://127.0.0.1:8000/payments?reference=' + sys.argv[1], timeout=5).read().decode())"
)


def assert_the_hints_run_as_printed_through_docker(guide, backend):
    """A guide through Docker, then its hints followed as printed (issue 49), in the guide's
    own Compose project before its reset: HINTS_FOLLOWED's check for it. Prints the seconds
    the hints took (pytest -rP shows them)."""
    steps = parse_guide(guide.read_text(encoding="utf-8"))
    outcomes = [run_step(step, backend) for step in steps[:-1]]
    assert all(o.ok for o in outcomes), f"{guide.name} differs:\n{describe(outcomes)}"
    began = time.monotonic()
    HINTS_FOLLOWED[guide.name[:2]](outcomes, backend)
    print(f"{guide.name}: its hints followed through Docker in {time.monotonic() - began:.1f} s")
    reset = run_step(steps[-1], backend)
    assert reset.ok, describe([reset])


def follow_lab_06s_hints(outcomes, backend):
    """Lab 06 typed without its lost-ack file: the receiver up again without it, a naive
    `--crash-at lost-ack` start gets its answer and the line says so, naming the `up` with the
    file and the same start on a new thread. Typed as printed, one after the other, that
    answer is lost: exit 3, and its ticket made (the lab's condition)."""
    assert backend.run(UP).exit_code == 0  # the api again, without the file: Compose recreates it
    start = ["start", "--thread", "again", "--operation", "case-again", "--mode", "naive"]
    answered = backend.workflow([*start, "--crash-at", "lost-ack"])
    assert answered.exit_code == 0, answered.stderr
    (line,) = [x for x in answered.stderr.splitlines() if "answered anyway" in x]
    (restart,) = restarts_for_docker(line)
    assert restart == UP_LOST_ACK, restart
    (again,) = printed_for_docker(line)
    assert again == (
        f"{RUN} start --thread again-again --operation case-again-again --mode naive "
        "--crash-at lost-ack"
    ), again
    before = counted(backend, "tickets")["tickets"]
    assert backend.run(restart).exit_code == 0  # as printed: only the project is our own
    lost = backend.run(again)
    assert lost.exit_code == 3 and "answered anyway" not in lost.stderr, lost.stderr
    assert counted(backend, "tickets")["tickets"] == before + 1  # made, its answer lost


def follow_lab_15s_hints(outcomes, backend):
    """Lab 15's exit-6 stops name their commands in Docker form; the guide types three of them
    as printed (the message's look-with, `messages`; the payment's, and its `reconcile`), and
    its later lines count one message and one charge. Then lab 15 typed without its
    conditions: the receiver up without the slow-payments file, a charge with the default
    API_TIMEOUT_S. The line names the `up` with the file and a new operation with the lesson's
    timeout; typed as printed, one after the other, the new payment is uncertain (exit 6), its
    charge sent once. Then a refused word on a ticket: its look and its word, as printed; the
    word given twice names the listing of the open ones, typed as printed too. Then a keyed
    payment's exit 6 and a message that never left (below)."""
    typed = [o.step.command for o in outcomes]
    followed = [
        hint
        for at, stop in enumerate(outcomes)
        if stop.exit_code == 6 and " look with " in stop.stderr
        for hint in printed_for_docker(stop.stderr)
        if hint in typed[at + 1 :]
    ]
    run = "docker compose -p stateful-lab run --rm workflow"
    assert followed == [
        f"{run} messages",
        f"{run} payments --reference case-once:pay:v1:pay",
        f"{run} reconcile",
    ], followed
    assert backend.run(UP).exit_code == 0  # the api again, without the file: Compose recreates it
    answered = backend.workflow(["start", "--thread", "fast", "--operation", "case-fast", "--pay"])
    assert answered.exit_code == 0, answered.stderr
    (line,) = [x for x in answered.stderr.splitlines() if " did not happen" in x]
    (restart,) = restarts_for_docker(line)
    assert restart == f"{UP_FILES} -f {SLOW_PAYMENTS} up -d --build api", restart
    (again,) = printed_for_docker(line)
    assert again == (
        "docker compose -p stateful-lab run --rm -e API_TIMEOUT_S=0.5 workflow start --thread "
        "fast-again --operation case-fast-again --pay"
    )
    assert backend.run(restart).exit_code == 0  # as printed: only the project is our own
    uncertain = backend.run(again)
    assert uncertain.exit_code == 6, uncertain.stderr  # the slow provider: no answer in 0.5 s
    assert "effect payment 'case-fast-again:pay' may have happened" in uncertain.stderr
    held = backend.compose_run(
        ["exec", "-T", "api", "python", "-c", PAYMENTS_SCRIPT, "case-fast-again:pay"]
    )
    assert held.exit_code == 0, held.stderr
    listed = json.loads(held.stdout)  # committed 3 s after it was accepted: pending till then
    assert len(listed["payments"]) + listed["pending"] == 1, listed  # sent once
    # A person's wrong word: --not-sent on a ticket the receiver holds (its run killed after
    # the send). The refusal names the look and the word that records it; typed as printed,
    # the look lists the ticket, the word settles it, and the resume ends with it: one ticket.
    start = ["start", "--thread", "ct", "--operation", "ct", "--crash-at", "after-send"]
    assert backend.workflow(start).exit_code == 137
    refused = backend.workflow(["reconcile", "--not-sent", "ct"])
    assert refused.exit_code == 4, refused.stderr
    confirm, look = printed_for_docker(refused.stderr)
    assert (confirm, look) == (f"{RUN} reconcile --confirmed ct", f"{RUN} tickets --operation ct")
    listed = backend.run(look)
    (ticket,) = events(listed.stdout)[0]["tickets"]
    assert backend.run(confirm).exit_code == 0
    resumed = backend.workflow(["resume", "--thread", "ct"])
    assert events(resumed.stdout)[-1]["ticket_id"] == ticket["ticket_id"], resumed.stdout
    assert [t["key"] for t in backend.tickets()].count("ct") == 1
    again = backend.workflow(["reconcile", "--confirmed", "ct"])  # the word given twice
    assert again.exit_code == 4 and "is not open (confirmed)" in again.stderr, again.stderr
    (listing,) = printed_for_docker(again.stderr)
    assert listing == f"{RUN} reconcile", again.stderr
    listed = backend.run(listing)  # the open ones: none now
    assert listed.exit_code == 0, listed.stderr
    # The lookup-resend payment, declared keyed: timed out twice while the slow provider holds
    # both charges, exit 6: its line followed as a person would, waiting what it says.
    twice = backend.run(
        "docker compose -p stateful-lab run --rm -e API_TIMEOUT_S=0.5 workflow start --thread "
        "keyed --operation case-keyed:pay:v1 --pay --mode lookup-resend"
    )
    twice_ended = time.monotonic()  # its last send was before this
    assert twice.exit_code == 6, twice.stderr
    follow_the_keyed_payments_resume(backend, twice.stderr, twice_ended)
    follow_a_message_that_never_left(backend)
    follow_a_persons_refused_words(backend)


def follow_a_message_that_never_left(backend):
    """A notify run killed after its message's intent, before the send: the resume stops with
    exit 6, naming the look and the word. The look shows no message; the word, typed as
    printed with the --wait its refusal offers, is taken once the settle time has passed; the
    resume then sends the message once."""
    start = ["start", "--thread", "n", "--operation", "case-n:open-ticket:v1", "--notify"]
    assert backend.workflow([*start, "--crash"]).exit_code == 137  # after the ticket's receipt
    window = ["resume", "--thread", "n", "--crash-at", "after-intent"]
    assert backend.workflow(window).exit_code == 137
    stopped = backend.workflow(["resume", "--thread", "n"])
    assert stopped.exit_code == 6, stopped.stderr
    look, _, not_sent = printed_for_docker(stopped.stderr)
    key = "case-n:open-ticket:v1:notify"
    assert (look, not_sent) == (f"{RUN} messages", f"{RUN} reconcile --not-sent {key}")
    looked = backend.run(look)  # what the provider holds: the lesson's, none of this run's
    assert looked.exit_code == 0, looked.stderr
    before = len(events(looked.stdout)[0]["messages"])
    early = backend.run(not_sent)
    if early.exit_code == 4:  # its settle time not over yet: the refusal says --wait
        assert "or add --wait" in early.stderr, early.stderr
        early = backend.run(f"{not_sent} --wait")
    assert early.exit_code == 0, early.stderr
    assert events(early.stdout)[0] == {"event": "settled", "key": key, "state": "released"}
    resumed = backend.workflow(["resume", "--thread", "n"])
    assert resumed.exit_code == 0, resumed.stderr
    assert [e["event"] for e in events(resumed.stdout)] == ["message_sent", "done"]
    assert counted(backend, "messages")["messages"] == before + 1


def follow_a_persons_refused_words(backend):
    """A message sent and its answer lost (killed after the send): the resume stops with exit
    6. A person's words on it that reconcile refuses, each one line naming the command that
    is right (settling.py): --confirmed without the id, --correct of an open key, --confirmed
    again after a typo was taken, --correct without the id. Followed as printed (ID: the id
    the look showed), the typo is corrected and the resume ends with that message: none sent
    again. Then --confirmed of a ticket the receiver does not hold."""
    key = "case-w:open-ticket:v1:notify"
    start = ["start", "--thread", "w", "--operation", "case-w:open-ticket:v1", "--notify"]
    assert backend.workflow([*start, "--crash"]).exit_code == 137  # after the ticket's receipt
    window = ["resume", "--thread", "w", "--crash-at", "after-send"]
    assert backend.workflow(window).exit_code == 137  # the message sent, its answer lost
    stopped = backend.workflow(["resume", "--thread", "w"])
    assert stopped.exit_code == 6, stopped.stderr
    looked = backend.run(printed_for_docker(stopped.stderr)[0])
    made = max(m["message_id"] for m in events(looked.stdout)[0]["messages"])  # the newest
    typo = made + 6

    def refused(words, code, names):
        said = backend.run(f"{RUN} reconcile {words}")
        assert (said.exit_code, said.stdout) == (code, ""), said
        assert said.stderr.count("\n") == 1, said.stderr
        assert re.match(r"labs: nothing was (settled|corrected): ", said.stderr), said.stderr
        assert f"{RUN} reconcile {names}" in printed_for_docker(said.stderr), said.stderr
        return f"{RUN} reconcile {names}"

    confirm = refused(f"--confirmed {key}", 2, f"--confirmed {key}=ID")
    assert refused(f"--correct {key}={made}", 4, f"--confirmed {key}=ID") == confirm
    taken = backend.run(confirm.replace("=ID", f"={typo}"))  # a person's typo: nothing checks it
    if taken.exit_code == 4 and "or add --wait" in taken.stderr:  # the settle time not over
        taken = backend.run(f"{confirm.replace('=ID', f'={typo}')} --wait")
    assert taken.exit_code == 0, taken.stderr
    correct = refused(f"--confirmed {key}={made}", 4, f"--correct {key}=ID")
    assert refused(f"--correct {key}", 2, f"--correct {key}=ID") == correct
    corrected = backend.run(correct.replace("=ID", f"={made}"))
    assert corrected.exit_code == 0, corrected.stderr
    before = counted(backend, "messages")
    resumed = backend.workflow(["resume", "--thread", "w"])
    assert resumed.exit_code == 0, resumed.stderr
    assert events(resumed.stdout)[-1]["message_id"] == made, resumed.stdout
    assert counted(backend, "messages") == before  # none sent again
    # A ticket killed after its intent, before it left: --confirmed with an id is refused,
    # the receiver's lookup holds nothing; the line names --not-sent, taken as printed (with
    # --wait, offered while the settle time runs); the resume then sends the ticket once.
    key = "case-v:open-ticket:v1"
    start = ["start", "--thread", "v", "--operation", key, "--crash-at", "after-intent"]
    assert backend.workflow(start).exit_code == 137
    not_sent = refused(f"--confirmed {key}=1", 4, f"--not-sent {key}")
    taken = backend.run(not_sent)
    if taken.exit_code == 4 and "or add --wait" in taken.stderr:
        taken = backend.run(f"{not_sent} --wait")
    assert taken.exit_code == 0, taken.stderr
    assert events(taken.stdout)[0] == {"event": "settled", "key": key, "state": "released"}
    resumed = backend.workflow(["resume", "--thread", "v"])
    assert resumed.exit_code == 0, resumed.stderr
    assert [t["key"] for t in backend.tickets()].count(key) == 1


def follow_the_keyed_payments_resume(backend, said, ended):
    """A keyed payment with no answer twice (exit 6): the line names the look and, once the
    provider's settle time has passed since the last send, the resume. A person waits that
    long (the line's figure: the provider's commit bound, checked), looks, and resumes as
    printed: the first charge adopted, none made."""
    assert "honours the key and has not given its result yet" in said, said
    look, resume = printed_for_docker(said)
    assert look == f"{RUN} payments --reference case-keyed:pay:v1:pay", said
    assert resume == f"{RUN} resume --thread keyed", said
    settle_s = float(re.search(r"once (\S+) s have passed since the last send", said)[1])
    time.sleep(max(0.0, ended + settle_s - time.monotonic()))  # the person waits, as told
    looked = backend.run(look)  # first the look, as the line says
    assert looked.exit_code == 0, looked.stderr
    done = backend.run(resume)
    held = backend.compose_run(
        ["exec", "-T", "api", "python", "-c", PAYMENTS_SCRIPT, "case-keyed:pay:v1:pay"]
    )
    listed = json.loads(held.stdout)  # pending 0: the provider kept its bound (the model)
    assert done.exit_code == 0, (done.stderr, listed)  # at the line's time, the resume settles
    assert listed["pending"] == 0 and len(listed["payments"]) == 2, listed  # the lesson's two
    adopted = events(done.stdout)[0]
    assert (adopted["event"], adopted["payment_id"]) == (
        "effect_adopted", listed["payments"][0]["payment_id"]
    ), done.stdout  # fmt: skip
    assert events(looked.stdout)[0]["payments"] == listed["payments"]  # nothing charged since


COUNTS_SCRIPT = (  # in the api container: how many of each list the receiver holds
    "import json, sys, urllib.request; print(json.dumps({p: len(json.load(urllib.request.urlopen("
    "'http://127.0.0.1:8000/' + p, timeout=5))[p]) for p in sys.argv[1:]}))"
)


RUN = "docker compose -p stateful-lab run --rm workflow"  # the lessons' CLI, as a hint prints it


def counted(backend, *lists):
    """The receiver's lists (tickets, messages, ...) counted, in one exec."""
    held = backend.compose_run(["exec", "-T", "api", "python", "-c", COUNTS_SCRIPT, *lists])
    assert held.exit_code == 0, held.stderr
    return json.loads(held.stdout)


def follow_lab_18s_hints(outcomes, backend):
    """Lab 18 typed without its webhooks file: the receiver up again without it, ticket 2
    moved; each event came once, and the line names the `up` with the file, then the move
    again (for a move to the status a ticket holds, one through another status: followed too).
    Typed as printed, one after the other, each event comes twice; the inbox flags the second
    of each; no condition line now; a notice for each one sent, no ticket more."""
    assert backend.run(UP).exit_code == 0  # the api again, without the file: Compose recreates it
    move = ["hooks", "--ticket", "2", "--move", "opened,in_progress,resolved"]
    once = backend.workflow(move)
    assert once.exit_code == 0, once.stderr
    (line,) = [x for x in once.stderr.splitlines() if "each webhook came once" in x]
    (restart,) = restarts_for_docker(line)
    assert restart == f"{UP_FILES} -f {WEBHOOKS} up -d --build api", restart
    (again,) = printed_for_docker(line)
    assert again == f"{RUN} {' '.join(move)}", again
    # A new ticket moved to resolved: a move again to the status it holds makes no event, so
    # the line's goes through another (labs/hooks.py moved_again). Typed as printed, each
    # event comes once and one notice is sent.
    made = backend.workflow(["start", "--thread", "h", "--operation", "case-h:open-ticket:v1"])
    assert made.exit_code == 0, made.stderr
    ticket = events(made.stdout)[-1]["ticket_id"]
    same = backend.workflow(["hooks", "--ticket", str(ticket), "--move", "resolved"])
    assert same.exit_code == 0 and events(same.stdout)[-1]["status"] == "resolved", same.stdout
    (line,) = [x for x in same.stderr.splitlines() if "each webhook came once" in x]
    (through,) = printed_for_docker(line)
    assert through == f"{RUN} hooks --ticket {ticket} --move opened,resolved", line
    before = counted(backend, "messages", "tickets")
    moved = backend.run(through)
    assert moved.exit_code == 0, moved.stderr
    came = [e for e in events(moved.stdout) if e["event"] == "webhook"]
    assert [(e["status"], e["duplicate"]) for e in came] == [
        ("opened", False), ("resolved", False)
    ], moved.stdout  # fmt: skip
    assert events(moved.stdout)[-1]["status"] == "resolved", moved.stdout
    assert counted(backend, "messages", "tickets") == {**before, "messages": before["messages"] + 1}
    before = counted(backend, "messages", "tickets")
    assert backend.run(restart).exit_code == 0  # as printed: only the project is our own
    twice = backend.run(again)
    assert twice.exit_code == 0 and "came once" not in twice.stderr, twice.stderr
    came = [e for e in events(twice.stdout) if e["event"] == "webhook"]
    ids = [e["event_id"] for e in came]
    assert len(ids) == 6 and all(ids.count(i) == 2 for i in ids), twice.stdout  # the lesson's
    assert [e["duplicate"] for e in came] == [False, True] * 3, twice.stdout
    sent = [e for e in events(twice.stdout) if e["event"] == "message_sent"]
    after = {"messages": before["messages"] + len(sent), "tickets": before["tickets"]}
    assert counted(backend, "messages", "tickets") == after, twice.stdout  # nothing else sent
    follow_hooks_hints_after_ctrl_c(backend)


SILENT_SCRIPT = """
import json, socket, sys, urllib.request
def post(path, body):  # to the receiver in this container
    request = urllib.request.Request('http://127.0.0.1:8000' + path, json.dumps(body).encode(),
                                     {'Content-Type': 'application/json'})
    return json.load(urllib.request.urlopen(request, timeout=10))
pending, unmoved = (post('/tickets', {'title': t})['ticket_id'] for t in ('pending', 'unmoved'))
post('/progress', {'ticket_id': pending, 'statuses': ['opened', 'resolved']})  # no one listens
server = socket.create_server(('0.0.0.0', int(sys.argv[1])))
server.settimeout(120)  # a hang guard
print(json.dumps({'pending': pending, 'unmoved': unmoved}), flush=True)
held, _ = server.accept()
print('accepted', flush=True)
held.settimeout(120)
while held.recv(4096):  # never answers; ends when the client is gone
    pass
"""  # in the api container: two tickets, one with events pending, then a server that never answers


def follow_hooks_hints_after_ctrl_c(backend):
    """Lab 18's `hooks` hints in Docker form: Ctrl-C while hooks waits for its subscription (to
    a server in the api container that takes the connection and never answers) names the hooks
    that takes what waits; typed as printed, the pending ticket's events come (twice each, the
    faults on), its notice is sent once and it ends resolved. Then hooks for a ticket nothing
    moved names the move and the list; typed as printed, the move's events come and the list
    shows that ticket."""
    port = 8099
    silent = python_in_the_api(backend, SILENT_SCRIPT, str(port))
    accepted = threading.Event()
    try:
        tickets = json.loads(silent.stdout.readline() or "null")
        assert tickets, silent.stderr.read()
        threading.Thread(
            target=lambda: silent.stdout.readline() == "accepted\n" and accepted.set(),
            daemon=True,
        ).start()
        before = counted(backend, "messages")["messages"]
        hooks = ["hooks", "--ticket", str(tickets["pending"])]
        options = ["-e", f"API_URL=http://api:{port}"]
        code, shown = ctrl_c_in_a_terminal(backend, options, hooks, lambda _: accepted.is_set())
    finally:
        silent.kill()  # the client; the script in the container ends with the connection
        silent.communicate()
    assert code == 130 and "the receiver keeps what got no answer pending" in shown, shown
    (take,) = printed_for_docker(shown)
    assert take == f"{RUN} {' '.join(hooks)}", shown
    taken = backend.run(take)
    assert taken.exit_code == 0, taken.stderr
    came = [e["status"] for e in events(taken.stdout) if e["event"] == "webhook"]
    assert sorted(came) == ["opened", "opened", "resolved", "resolved"], taken.stdout
    status = events(taken.stdout)[-1]
    assert (status["status"], status["version"]) == ("resolved", 2), taken.stdout
    assert counted(backend, "messages")["messages"] == before + 1, taken.stdout  # one notice
    quiet = backend.workflow(["hooks", "--ticket", str(tickets["unmoved"])])
    assert quiet.exit_code == 0 and events(quiet.stdout)[-1]["status"] is None, quiet.stdout
    move, listing = printed_for_docker(quiet.stderr)
    assert move == f"{RUN} hooks --ticket {tickets['unmoved']} --move opened,resolved", move
    assert listing == f"{RUN} tickets", listing
    moved = backend.run(move)
    assert moved.exit_code == 0, moved.stderr
    status = events(moved.stdout)[-1]
    assert (status["status"], status["version"]) == ("resolved", 2), moved.stdout
    listed = backend.run(listing)
    assert listed.exit_code == 0, listed.stderr
    held = [t["ticket_id"] for t in events(listed.stdout)[0]["tickets"]]
    assert tickets["unmoved"] in held, listed.stdout


SAGA_LISTS = ("tickets", "reservations", "shipments", "releases", "refunds")  # its effects


def follow_lab_02s_hints(outcomes, backend):
    """A start typed again after its crash, as a learner does: exit 4, the line names the
    resume in Docker form. Typed as printed, it ends done with the one ticket the crashed run
    made (safe mode: the same key), no second one. Then a start whose API_URL names no
    receiver (exit 3), or a wrong path on it (exit 1): the line names the resume for once
    API_URL is right; typed as printed (the lab's API_URL), it ends done with one ticket. The
    same for another program's page, a busy receiver and an unwritable checkpoint (below)."""
    start = ["start", "--thread", "again", "--operation", "case-again:open-ticket:v1"]
    crashed = backend.workflow([*start, "--mode", "safe", "--crash"])
    assert crashed.exit_code == 137, crashed.stderr
    again = backend.workflow([*start, "--mode", "safe"])
    assert again.exit_code == 4, again.stderr
    assert "thread 'again' already exists" in again.stderr, again.stderr
    (resume,) = printed_for_docker(again.stderr)
    assert resume == f"{RUN} resume --thread again", resume
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    assert [t["key"] for t in backend.tickets()].count("case-again:open-ticket:v1") == 1
    for thread, url, code in (
        ("away", "http://nowhere:8000", 3),  # no such host
        ("astray", "http://api:8000/v1", 1),  # the receiver, a wrong path: its 404
    ):
        key = f"case-{thread}:open-ticket:v1"
        start = ["start", "--thread", thread, "--operation", key]
        stopped = backend.workflow(start, env={"API_URL": url})
        assert stopped.exit_code == code, stopped.stderr
        (resume,) = printed_for_docker(stopped.stderr)
        assert resume == f"{RUN} resume --thread {thread}", stopped.stderr
        done = backend.run(resume)
        assert done.exit_code == 0, done.stderr
        assert [t["key"] for t in backend.tickets()].count(key) == 1
    follow_another_programs_page(backend)
    follow_a_busy_receivers_resume(backend)
    follow_an_unwritable_checkpoints_resume(backend)


def python_in_the_api(backend, script, *args):
    """`python -c script args` in the api container of the backend's project (exec -T), its
    stdin, stdout and stderr piped to this process."""
    return subprocess.Popen(
        [*backend.compose, "-p", backend.project, "exec", "-T", "api", "python", "-c"]
        + [script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def running_in_the_api(backend, script, ready, *args):
    """A script in the api container while the block runs: entered once it prints ready, ended
    by closing its stdin (the scripts read it to the end, then exit)."""
    running = python_in_the_api(backend, script, *args)
    try:
        assert running.stdout.readline() == f"{ready}\n", running.stderr.read()
        yield running
    finally:
        running.communicate("")


PAGE_SCRIPT = """
import http.server, sys, threading
class Page(http.server.BaseHTTPRequestHandler):  # a web server's own 404 page, not JSON
    def do_GET(self):
        self.send_response(404)
        self.send_header('Content-Type', 'text/html')
        self.end_headers()
        self.wfile.write(b'<html><body><h1>Not Found</h1></body></html>')
    do_POST = do_GET
server = http.server.HTTPServer(('0.0.0.0', int(sys.argv[1])), Page)
threading.Thread(target=server.serve_forever, daemon=True).start()
print('serving', flush=True)
sys.stdin.read()  # until the test closes it
"""  # in the api container: another program on another port


def follow_another_programs_page(backend):
    """API_URL at another program (a web server's 404 page, no JSON): exit 1, the line says
    so and names the resume once API_URL names the receiver. Typed as printed (the lab's
    API_URL), it ends done with one ticket."""
    port, key = 8098, "case-page:open-ticket:v1"
    with running_in_the_api(backend, PAGE_SCRIPT, "serving", str(port)):
        start = ["start", "--thread", "page", "--operation", key]
        stopped = backend.workflow(start, env={"API_URL": f"http://api:{port}"})
    assert stopped.exit_code == 1, stopped.stderr
    assert "answered 404 without the receiver's JSON" in stopped.stderr, stopped.stderr
    (resume,) = printed_for_docker(stopped.stderr)
    assert resume == f"{RUN} resume --thread page", stopped.stderr
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    assert [t["key"] for t in backend.tickets()].count(key) == 1


HOLD_SCRIPT = """
import sqlite3, sys
held = sqlite3.connect('/data/receiver.sqlite', isolation_level=None)
held.execute('BEGIN EXCLUSIVE')  # as a backup or an sqlite3 shell would: no writer gets in
print('held', flush=True)
sys.stdin.read()  # until the test closes it
"""  # in the api container: the receiver's database held by another program


def follow_a_busy_receivers_resume(backend):
    """Another program holds the receiver's database for a whole start (one try, so two for a
    503): exit 1, the line names the resume once the receiver can write. Released, that
    resume typed as printed ends done with one ticket."""
    with running_in_the_api(backend, HOLD_SCRIPT, "held"):
        start = ["start", "--thread", "busy", "--operation", "case-busy:open-ticket:v1"]
        stopped = backend.workflow(start, env={"API_ATTEMPTS": "1"})
    assert stopped.exit_code == 1 and "stayed busy (503)" in stopped.stderr, stopped.stderr
    (resume,) = printed_for_docker(stopped.stderr)
    assert resume == f"{RUN} resume --thread busy", stopped.stderr
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    assert [t["key"] for t in backend.tickets()].count("case-busy:open-ticket:v1") == 1


def follow_an_unwritable_checkpoints_resume(backend):
    """A start drained by SIGTERM (saved before its ticket), then the checkpoint file made
    read-only for the container's user: the resume cannot write its ticket's intent and sends
    nothing, exit 74, naming itself once CHECKPOINT_DB can be written, and the files it cannot
    write: the -wal and -shm SQLite made then, read-only as well. Those made writable, typed as
    printed, the resume ends done: one ticket."""
    key = "case-ro:open-ticket:v1"
    start = ["start", "--thread", "ro", "--operation", key, "--term-at", "after-prepare"]
    assert backend.workflow(start).exit_code == 75  # drained: the thread is saved
    chmod = ["run", "--rm", "--no-deps", "--entrypoint", "chmod", "workflow"]
    db = "/data/checkpoints.sqlite"
    assert backend.compose_run([*chmod, "a-w", db]).exit_code == 0
    stopped = backend.workflow(["resume", "--thread", "ro"])
    assert stopped.exit_code == 74, stopped.stderr
    stuck = f"once CHECKPOINT_DB can be written (read-only now: {db}, {db}-wal, {db}-shm), "
    assert stuck in stopped.stderr, stopped.stderr
    assert "intent could not be written, so this run sent nothing;" in stopped.stderr
    assert backend.compose_run([*chmod, "u+w", db, f"{db}-wal", f"{db}-shm"]).exit_code == 0
    (resume,) = printed_for_docker(stopped.stderr)
    assert resume == f"{RUN} resume --thread ro", stopped.stderr
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    # The ledger's intent is in that file too: it could not be written, so nothing was sent
    # before, as the line said; the resume sends it now, once.
    assert events(done.stdout)[0]["event"] == "effect_ack", done.stdout
    assert [t["key"] for t in backend.tickets()].count(key) == 1


def follow_lab_07s_hints(outcomes, backend):
    """Lab 07 types the commands its refusals name (the_guide_types_its_hints). Then a bound
    approval's request edited while it waits: the line names the resume that asks again, and
    approve, typed too early, names it too. Typed as printed, the question is about the new
    title; nothing was sent. Then approve stopped by Ctrl-C after the ticket's answer, and by a
    receiver it cannot reach: each line names the approve again, typed as printed: one ticket."""
    the_guide_types_its_hints(
        [f"{RUN} approve --thread in-node", f"{RUN} approve --thread bound"],  # by ana
        [f"{RUN} state --thread bound"],  # the review the refusal names: done by now
    )(outcomes, backend)
    key = "case-asked:open-ticket:v1"
    asked = backend.workflow(
        ["start", "--thread", "asked", "--operation", key, "--title", "Pay 120 EUR",
         "--approval", "before"]
    )  # fmt: skip
    assert asked.exit_code == 0, asked.stderr
    edited = backend.workflow(["edit", "--thread", "asked", "--title", "Pay 1200 EUR"])
    assert edited.exit_code == 0, edited.stderr
    (again,) = printed_for_docker(edited.stderr)
    assert again == f"{RUN} resume --thread asked", edited.stderr
    early = backend.workflow(["approve", "--thread", "asked"])
    assert early.exit_code == 4 and printed_for_docker(early.stderr) == [again], early.stderr
    resumed = backend.run(again)
    assert resumed.exit_code == 0, resumed.stderr
    assert events(resumed.stdout)[-1]["request"] == {"title": "Pay 1200 EUR"}, resumed.stdout
    assert [t["key"] for t in backend.tickets()].count(key) == 0
    # Ctrl-C in a terminal during approve, the ticket's answer in: the line names the approve
    # that goes on; typed as printed, it ends approved with that ticket, no second one.
    key = "case-cc:open-ticket:v1"
    start = ["start", "--thread", "cc", "--operation", key, "--mode", "safe", "--approval"]
    waiting = backend.workflow(start)
    assert events(waiting.stdout)[-1]["event"] == "awaiting_approval", waiting.stdout
    code, shown = ctrl_c_through_docker(backend, ["approve", "--thread", "cc"], "approve")
    assert code == 130 and "labs: interrupted; a request in flight" in shown, shown
    (again,) = printed_for_docker(shown)
    assert again == f"{RUN} approve --thread cc", shown
    approved = backend.run(again)
    assert approved.exit_code == 0, approved.stderr
    (answered,) = [e["ticket_id"] for e in events(shown) if e.get("event") == "effect_ack"]
    assert events(approved.stdout)[-1]["ticket_id"] == answered, approved.stdout
    assert [t["key"] for t in backend.tickets()].count(key) == 1
    # The answer typed while API_URL names no receiver: exit 3, the line names that answer
    # again (a resume would be refused: the run waits for one); typed as printed, one ticket.
    key = "case-away:open-ticket:v1"
    start = ["start", "--thread", "away", "--operation", key, "--mode", "safe", "--approval"]
    assert events(backend.workflow(start).stdout)[-1]["event"] == "awaiting_approval"
    away = backend.workflow(["approve", "--thread", "away"], env={"API_URL": "http://nowhere:8000"})
    assert away.exit_code == 3, away.stderr
    (again,) = printed_for_docker(away.stderr)
    assert again == f"{RUN} approve --thread away", away.stderr
    approved = backend.run(again)
    assert approved.exit_code == 0 and events(approved.stdout)[-1]["approved"], approved.stdout
    assert [t["key"] for t in backend.tickets()].count(key) == 1


def follow_lab_10s_hints(outcomes, backend):
    """Lab 10's workers stopped, a job submitted: `wait` says no worker runs it and names the
    Docker command that starts one (not the native `python -m labs.workers run`). Typed as
    printed, a worker takes the job: the next `wait` ends idle, one ticket for its operation.
    Then `resume` on that thread in the workers' database names the workers' state."""
    worker = "docker compose -p stateful-lab run --rm worker"
    assert backend.compose_run(["stop", "worker"]).exit_code == 0  # the guide's three workers
    key = "case-8:open-ticket:v1"
    submitted = backend.run(f"{worker} submit --thread case-8 --operation {key}")
    assert submitted.exit_code == 0, submitted.stderr
    waited = backend.run(f"{worker} wait --thread case-8 --timeout 5")  # notice after 3 s
    assert waited.exit_code == 3 and "no worker is running" in waited.stderr, waited.stderr
    start = "docker compose -p stateful-lab up -d worker"
    assert waited.stderr.count(f"(Docker: {start})") == 2, waited.stderr  # then once at 5 s
    assert backend.run(start).exit_code == 0
    done = backend.run(f"{worker} wait --thread case-8")
    assert done.exit_code == 0 and events(done.stdout)[0]["event"] == "idle", done.stdout
    listed = backend.run(f"{RUN} tickets --operation {key}")
    assert len(events(listed.stdout)[0]["tickets"]) == 1, listed.stdout
    # The lessons' CLI pointed at the workers' database, on the thread a worker ran: exit 4,
    # one line naming the workers' own look (labs/threads.py owning_command_line); typed as
    # printed, it shows the thread done and sends nothing.
    postgres = {"CHECKPOINT_DB": "postgresql://postgres:lab@postgres:5432/postgres"}
    refused = backend.workflow(["resume", "--thread", "case-8"], env=postgres)
    assert refused.exit_code == 4 and refused.stderr.count("\n") == 1, refused.stderr
    (look,) = printed_for_docker(refused.stderr)
    assert look == f"{worker} state --thread case-8", refused.stderr
    shown = backend.run(look)
    assert shown.exit_code == 0, shown.stderr
    assert events(shown.stdout)[0]["next"] == [], shown.stdout
    listed = backend.run(f"{RUN} tickets --operation {key}")
    assert len(events(listed.stdout)[0]["tickets"]) == 1, listed.stdout


def follow_lab_13s_hints(outcomes, backend):
    """A saga killed after its charge's answer, then `resume` typed without saga: exit 4, the
    line names saga resume in Docker form. Typed as printed, it finishes the saga: one charge
    and one reservation more, nothing released or refunded; `state` on it names `saga state`,
    which shows it; a second saga of its key names its state. Then a naive saga killed after
    its release's answer: the line names a look at the releases instead, and it shows the one;
    the same look after Ctrl-C there, typed into a terminal."""
    before = counted(backend, *SAGA_LISTS)
    start = ["saga", "start", "--thread", "again", "--operation", "case-again:book:v1"]
    crashed = backend.workflow([*start, "--seats", "2", "--crash-at", "after-charge-ack"])
    assert crashed.exit_code == 137, crashed.stderr
    refused = backend.workflow(["resume", "--thread", "again"])
    assert refused.exit_code == 4, refused.stderr
    (resume,) = printed_for_docker(refused.stderr)
    assert resume == f"{RUN} saga resume --thread again", resume
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    assert "done" in [e["event"] for e in events(done.stdout)], done.stdout
    after = counted(backend, *SAGA_LISTS)
    more = {name: after[name] - before[name] for name in SAGA_LISTS}
    assert more == {"tickets": 1, "reservations": 1, "shipments": 1, "releases": 0, "refunds": 0}
    shown = other_lessons_state(backend, "state", "again", "saga state")  # the saga's own look
    assert events(shown.stdout)[0]["values"]["seats"] == 2, shown.stdout
    # A second saga of that --operation asking for other seats: exit 1, one line naming the
    # saga that holds the key (labs/saga.py not_undone); typed as printed, its state, done.
    other = ["saga", "start", "--thread", "other", "--operation", "case-again:book:v1"]
    held = backend.workflow([*other, "--seats", "3"])
    assert held.exit_code == 1 and held.stderr.count("\n") == 1, held.stderr
    (look,) = printed_for_docker(held.stderr)
    assert look == f"{RUN} saga state --thread again", held.stderr
    shown = backend.run(look)
    assert shown.exit_code == 0, shown.stderr
    (state,) = events(shown.stdout)
    assert (state["values"]["seats"], state["next"]) == (2, []), shown.stdout
    assert counted(backend, *SAGA_LISTS) == after  # a look: nothing sent
    # A naive saga killed after its release's answer waits at the release, which goes without
    # a key: `resume` typed without saga names no saga resume (it would release again) but a
    # look at the releases, which changes nothing and lists the one release made.
    start = ["saga", "start", "--thread", "naive-again", "--operation", "case-naive-again:book:v1"]
    crashed = backend.workflow(
        [*start, "--seats", "2", "--ship-to", "AQ", "--mode", "naive", "--crash-at",
         "after-release-ack"]
    )  # fmt: skip
    assert crashed.exit_code == 137, crashed.stderr
    refused = backend.workflow(["resume", "--thread", "naive-again"])
    assert refused.exit_code == 4 and "releases again if the first" in refused.stderr
    (look,) = printed_for_docker(refused.stderr)
    assert look == f"{RUN} saga releases", refused.stderr
    looked = backend.run(look)
    assert looked.exit_code == 0, looked.stderr
    (listed,) = events(looked.stdout)
    now = counted(backend, *SAGA_LISTS)
    assert len(listed["releases"]) == now["releases"] == after["releases"] + 1, looked.stdout
    # Ctrl-C in a naive saga after its release's answer: the line names the same look, not the
    # tickets (which do not show a release), nor the saga resume that would release again.
    start = ["saga", "start", "--thread", "ctrl-c", "--operation", "case-ctrl-c:book:v1"]
    code, shown = ctrl_c_through_docker(
        backend,
        [*start, "--seats", "2", "--ship-to", "AQ", "--mode", "naive"],
        "saga",
        "after-release-ack",
        "released",
    )
    assert code == 130 and "labs: interrupted; a request in flight" in shown, shown
    assert printed_for_docker(shown) == [look], shown
    looked = backend.run(look)
    assert looked.exit_code == 0, looked.stderr
    assert len(events(looked.stdout)[0]["releases"]) == now["releases"] + 1, looked.stdout


def follow_lab_19s_hints(outcomes, backend):
    """The outbox's start killed after its outbox write, then typed again: exit 4, the line
    names outbox resume in Docker form (and so does saga resume). Typed as printed, it ends
    done; the relay's --once sends its one message (one ticket more). Its own hints,
    followed: the list shows it published; the start (a thread and an operation of its own:
    the outbox holds two) writes a message, which the relay then sends (one ticket more).
    `saga state` on the outbox's thread names `outbox state`, which shows it; `outbox resume`
    on a ticket run's thread names its `state`, which shows it."""
    before = counted(backend, "tickets")
    start = ["outbox", "start", "--thread", "again", "--operation", "case-again:open-ticket:v1"]
    crashed = backend.workflow([*start, "--crash-at", "after-outbox"])
    assert crashed.exit_code == 137, crashed.stderr
    again = backend.workflow(start)
    assert again.exit_code == 4, again.stderr
    (resume,) = printed_for_docker(again.stderr)
    assert resume == f"{RUN} outbox resume --thread again", resume
    not_a_saga = backend.workflow(["saga", "resume", "--thread", "again"])  # the same, named
    assert not_a_saga.exit_code == 4 and printed_for_docker(not_a_saga.stderr) == [resume]
    done = backend.run(resume)
    assert done.exit_code == 0, done.stderr
    relay = "docker compose -p stateful-lab run --rm relay"
    relayed = backend.run(f"{relay} --once")
    assert relayed.exit_code == 0, relayed.stderr
    assert counted(backend, "tickets") == {"tickets": before["tickets"] + 1}
    nothing = backend.run(f"{relay} --once")  # nothing left: its hints name --show and a start
    assert nothing.exit_code == 0, nothing.stderr
    show, start_hint = printed_for_docker(nothing.stderr)
    fresh = "outbox start --thread outbox-3 --operation case-outbox-3:open-ticket:v1"
    assert (show, start_hint) == (f"{relay} --show", f"{RUN} {fresh}"), nothing.stderr
    shown = backend.run(show)
    assert shown.exit_code == 0, shown.stderr
    states = {m.get("thread"): m["state"] for m in events(shown.stdout)[0]["messages"]}
    assert states.get("again") == "published", shown.stdout
    assert counted(backend, "tickets") == {"tickets": before["tickets"] + 1}
    shown = other_lessons_state(backend, "saga state", "again", "outbox state")
    assert events(shown.stdout)[0]["values"]["delivery"] == "outbox", shown.stdout
    written = backend.run(start_hint)
    assert written.exit_code == 0, written.stderr
    assert backend.run(f"{relay} --once").exit_code == 0
    assert counted(backend, "tickets") == {"tickets": before["tickets"] + 2}  # its one ticket
    # A ticket run killed after its send, then outbox resume typed on it: the line names the
    # ticket run's own look (labs/outbox.py outbox_run); typed as printed, it sends nothing.
    plain = ["start", "--thread", "plain", "--operation", "case-plain:open-ticket:v1"]
    assert backend.workflow([*plain, "--crash-at", "after-send"]).exit_code == 137
    shown = other_lessons_state(backend, "outbox resume", "plain", "state")
    assert "delivery" not in events(shown.stdout)[0]["values"], shown.stdout
    assert counted(backend, "tickets") == {"tickets": before["tickets"] + 3}  # the crashed run's


def other_lessons_state(backend, typed, thread, names):
    """`typed --thread THREAD` on another lesson's thread: exit 4, one line naming that
    lesson's look (`names --thread THREAD`) in Docker form. Typed as printed: exit 0, and
    what it printed."""
    refused = backend.workflow([*typed.split(), "--thread", thread])
    assert refused.exit_code == 4, refused.stderr
    (look,) = printed_for_docker(refused.stderr)
    assert look == f"{RUN} {names} --thread {thread}", refused.stderr
    shown = backend.run(look)
    assert shown.exit_code == 0, shown.stderr
    return shown


def follow_lab_17s_hints(outcomes, backend):
    """Lab 17's start, with Ctrl-C typed while the ticket's answer is in and not yet saved (held
    there by a pause), in a terminal as a learner's: Compose gives the container the terminal,
    so the ^C reaches the run. Exit 130, and the line names what to type in Docker form: in
    safe mode the resume, which ends done with the same ticket (the key); in naive mode a look
    at the receiver first (a resume would send it again), which lists the one ticket."""
    for mode, hint in (("safe", f"{RUN} resume --thread ctrl-c-safe"), ("naive", f"{RUN} tickets")):
        key = f"case-017-ctrl-c-{mode}:open-ticket:v1"
        start = ["start", "--thread", f"ctrl-c-{mode}", "--operation", key, "--mode", mode]
        before = len(backend.tickets())
        code, shown = ctrl_c_through_docker(backend, [*start, "--retry-after-ack", "timeout"], mode)
        assert code == 130 and "labs: interrupted; a request in flight" in shown, shown
        assert printed_for_docker(shown) == [hint], shown
        followed = backend.run(hint)
        assert followed.exit_code == 0, followed.stderr
        acks = [e["created"] for e in events(followed.stdout) if e["event"] == "effect_ack"]
        assert acks == ([False] if mode == "safe" else []), followed.stdout  # safe: its key
        (answered,) = [e["ticket_id"] for e in events(shown) if e.get("event") == "effect_ack"]
        held = [t["ticket_id"] for t in backend.tickets()]
        assert len(held) == before + 1 and answered in held, (held, shown)  # no ticket more
        if mode == "naive":  # what the look shows: the ticket the interrupted run made
            assert answered in [t["ticket_id"] for t in events(followed.stdout)[0]["tickets"]]


def ctrl_c_through_docker(backend, args, name, point="after-ack", answered="effect_ack"):
    """`docker compose run --rm workflow ARGS` held at failpoint `point`, with Ctrl-C typed
    once the answer's line (its event `answered`) is on screen: ctrl_c_in_a_terminal."""
    held = f"FAILPOINTS={point}=pause(/data/held-{name})"  # in the run's checkpoint volume
    line = f'"event": "{answered}"'.encode()
    return ctrl_c_in_a_terminal(backend, ["-e", held], args, lambda shown: line in shown)


def ctrl_c_in_a_terminal(backend, options, args, ready):
    """`docker compose run --rm OPTIONS workflow ARGS` in a terminal of its own (a pty, as a
    learner's: Compose then gives the container a terminal too); Ctrl-C typed once
    ready(what the terminal showed so far) is true. Returns (the exit code, what it showed)."""
    import pty
    import select

    command = [*backend.compose, "-p", backend.project, "run", "--rm", *options, "workflow"]
    pid, terminal = pty.fork()
    if pid == 0:  # the child: Compose, its terminal the pty's other end
        try:
            os.execvp(command[0], [*command, *args])
        finally:
            os._exit(127)
    shown, typed = b"", False
    deadline = time.monotonic() + 120  # a hang guard, not a speed bound
    try:
        while time.monotonic() < deadline:
            if not typed and ready(shown):
                os.write(terminal, b"\x03")  # Ctrl-C, as a keyboard types it
                typed = True
            if select.select([terminal], [], [], 0.2)[0]:
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:  # the other end closed: Compose exited
                    break
                if not chunk:
                    break
                shown += chunk
    finally:
        os.close(terminal)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode("utf-8", "replace").replace("\r", "")


def the_guide_types_its_hints(typed_after, followed_here=()):
    """A guide's own run follows its hints: each Docker command its stderr names is typed by a
    later command of the guide, as printed (or with a switch added, such as approve's --by),
    in the order printed: typed_after. followed_here: those the guide does not type, each
    typed as printed after the guide's last command (a look: it must exit 0). No command more
    than the guide's own, but for those."""

    def check(outcomes, backend):
        typed = [o.step.command for o in outcomes]
        found = [
            (at, hint)
            for at, outcome in enumerate(outcomes)
            if "(Docker: " in outcome.stderr
            for hint in printed_for_docker(outcome.stderr)
        ]
        later = [
            hint
            for at, hint in found
            if any(t == hint or t.startswith(f"{hint} --") for t in typed[at + 1 :])
        ]
        assert later == list(typed_after), found
        left = [hint for _, hint in found if hint not in later]
        assert left == list(followed_here), found
        for hint in left:
            looked = backend.run(hint)
            assert looked.exit_code == 0, looked.stderr

    return check


HINTS_FOLLOWED = {  # the guides whose Docker run then follows their hints as printed
    "02": follow_lab_02s_hints,
    "06": follow_lab_06s_hints,
    "07": follow_lab_07s_hints,
    "10": follow_lab_10s_hints,
    "12": the_guide_types_its_hints(
        [
            RUN.replace("--rm", "--rm -e LAB_GRAPH_VERSION=2") + " migrate --thread guarded",
            RUN.replace("--rm", "--rm -e LAB_KEY_VERSION=2") + " migrate --thread rekeyed",
        ]
    ),
    "13": follow_lab_13s_hints,
    "15": follow_lab_15s_hints,
    "17": follow_lab_17s_hints,
    "18": follow_lab_18s_hints,
    "19": follow_lab_19s_hints,
}


def assert_the_demos_drill_reports_reach_the_host(guide, backend, folder, monkeypatch):
    """`make demo BACKEND=docker` on lab 16, through the demo's own step (Demo.run): each
    drill gets `--html /reports/lab-NN-drill-K.html`, which compose.yaml binds to the demo's
    pictures folder (demo.docker_reports, as main sets it), so the report is on the host, the
    user's own, and the demo says where; the guide's commands print what it says all the same.
    (Lab 11's Docker run sets the same environment: its replays, run as the user, must read the
    workflow's checkpoints.)"""
    for name, value in demo.docker_reports(folder).items():
        monkeypatch.setenv(name, value)
    teller, ledger = (
        demo.Demo(backend, demo.Style(False), pictures=folder),
        demo.TicketsByOperation(),
    )
    teller.guide = guide.name
    for step in parse_guide(guide.read_text(encoding="utf-8")):
        teller.run(step, ledger)
    outcomes = teller.outcomes
    assert all(o.ok for o in outcomes), f"{guide.name} differs:\n{describe(outcomes)}"
    drills = [o for o in outcomes if " --html /reports/" in o.step.command and o.exit_code != 2]
    reports = sorted(folder.glob(f"lab-{guide.name[:2]}-drill-*.html"))
    assert len(reports) == len(drills) == 2, reports  # lab 16's two drills
    for outcome in drills:
        report = folder / outcome.step.command.rsplit("/reports/", 1)[1]
        assert report.stat().st_uid == os.getuid()  # the drill ran as the user: theirs to remove
        (summary,) = [x for x in outcome.stdout.splitlines() if x.startswith("summary: ")]
        points = summary.split()[1]  # "summary: 16 crash points, ..."
        graph = outcome.step.command.split(" drill ", 1)[1].split(":", 1)[0]
        page = report.read_text(encoding="utf-8")
        assert graph in page and f"{points} crash point" in page, summary  # or points


def follow_lab_16s_traceback(guide, backend, monkeypatch):
    """Lab 16's drill typed with the wrong input key (`{"thread": ...}` where its graph reads
    "customer"): its graph fails in the clean run, exit 3, one line. Its traceback is kept in
    the drill's /reports mount, not in its /tmp (gone with the container), and the line names
    the command that reads it; typed as printed, it shows the KeyError. (After the guide's
    reset: its `up` again, then its reset again.)"""
    for name in ("LAB_REPORTS", "LAB_DRILL_USER"):  # as a learner types it: not the demo's
        monkeypatch.delenv(name, raising=False)
    steps = parse_guide(guide.read_text("utf-8"))
    (drill, *_) = [step.command for step in steps if " drill " in step.command]
    mistake = drill.replace('{"customer": "{thread}"}', '{"thread": "{thread}"}')
    assert mistake != drill and backend.run(UP).exit_code == 0  # the guide ended with its reset
    failed = backend.run(mistake)
    assert failed.exit_code == 3 and failed.stderr.count("\n") == 1, failed.stderr
    assert "node quote: KeyError: 'customer' (its traceback: /reports/" in failed.stderr
    read = failed.stderr.split("; read it: ", 1)[1].removesuffix(")\n")
    assert read.startswith("docker compose -p stateful-lab run --rm --entrypoint cat drill "), read
    shown = backend.run(read)
    assert shown.exit_code == 0, shown.stderr
    assert "Traceback (most recent call last)" in shown.stdout, shown.stdout
    assert "KeyError: 'customer'" in shown.stdout, shown.stdout
    reset = backend.run(steps[-1].command)
    assert reset.exit_code == 0, reset.stderr


@pytest.mark.docker
@pytest.mark.long
def test_compose_v1_runs_lab_06_as_the_readme_says():
    """The README says Debian's docker-compose 1.29 works too, typed where a guide says `docker
    compose`. Lab 06 is the guide where Compose versions differ (-f on every command). Before its
    reset, a learner forgets --rm once; the reset still leaves nothing, and the lab starts as it
    says again (test_the_reset_survives_a_run_typed_without_rm, for Compose 1.29)."""
    v1 = which("docker-compose") and run_command(
        ["docker-compose", "version", "--short"], timeout=30
    )
    if not v1 or not v1.stdout.startswith("1."):
        reason = "COMPOSE V1 NOT CHECKED: no docker-compose 1.x on PATH (Debian: docker-compose)"
        if os.environ.get("LAB_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + " (LAB_REQUIRE_DOCKER=1 requires it)")
        pytest.skip(reason)
    backend = DockerBackend(f"{PROJECT_PREFIX}-v1", compose=("docker-compose",))
    lab_06 = parse_guide((ROOT / "labs" / "06-the-lost-acknowledgement.md").read_text("utf-8"))
    try:
        assert backend.down().exit_code == 0
        outcomes = [run_step(step, backend) for step in lab_06[:-1]]
        assert all(o.ok for o in outcomes), f"lab 06 differs:\n{describe(outcomes)}"
        assert_the_reset_survives_a_run_typed_without_rm(backend, lab_06, lab_06[-2])
    finally:
        backend.close()


def test_a_guide_that_disagrees_with_the_code_fails(tmp_path):
    """The runner must catch a wrong ticket number and a wrong exit code."""
    text = (ROOT / "labs" / "01-the-duplicate.md").read_text(encoding="utf-8")
    wrong = text.replace('"ticket_id": 2}', '"ticket_id": 1}', 1).replace("[exit 137]", "")
    assert wrong.count("ticket_id") == text.count("ticket_id") and wrong != text
    guide = tmp_path / "01-wrong.md"
    guide.write_text(wrong, encoding="utf-8")
    backend = LocalBackend(tmp_path / "data", in_process=True)
    try:
        outcomes = run_guide(guide, backend)
    finally:
        backend.close()
    problems = [p for o in outcomes for p in o.problems]
    assert "exit code 137, the guide says 0" in problems
    assert "output differs from the guide" in problems


def test_guide_directory_has_only_guides_the_compose_files_they_name_and_the_lessons_code():
    text = "".join(g.read_text(encoding="utf-8") for g in GUIDES)
    for path in (ROOT / "labs").iterdir():
        if path.is_file() and path.suffix not in (".md", ".py"):  # .py: the lessons' modules
            assert path.name.endswith(".compose.yaml"), path.name
            assert f"labs/{path.name}" in text, f"no guide names {path.name}"


def compose_backend(compose, name):
    """A docker backend driving this Compose (v2 plugin or v1 docker-compose), or a loud skip."""
    version = which(compose[0]) and run_command([*compose, "version", "--short"], timeout=30)
    wanted = "1." if compose == ("docker-compose",) else "2."
    if not version or version.returncode or not version.stdout.lstrip("v").startswith(wanted):
        reason = f"COMPOSE {wanted[0]} NOT CHECKED: no `{' '.join(compose)}` {wanted}x here"
        if os.environ.get("LAB_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + " (LAB_REQUIRE_DOCKER=1 requires it)")
        pytest.skip(reason)
    return DockerBackend(f"{PROJECT_PREFIX}-{name}-v{wanted[0]}", compose=compose)


def project_left(backend, kind):
    label = f"label=com.docker.compose.project={backend.project}"
    listing = ["docker", kind, "ls", "-q", "--filter", label] + (
        ["-a"] if kind == "container" else []
    )
    return run_command(listing, timeout=30).stdout.split()


@pytest.mark.docker
def test_the_reset_survives_a_run_typed_without_rm():
    """A learner forgets --rm once: its stopped container mounts the checkpoint volume, which
    Compose 2's plain `down -v` then keeps ("Resource is still in use", exit 0), and lab 01's
    start finds its old thread (exit 4, "reset the lab"). The guides' reset removes both, and
    lab 01 starts as it says. (Compose 1.29: test_compose_v1_runs_lab_06_as_the_readme_says,
    on lab 06 before its reset.)"""
    backend = compose_backend(("docker", "compose"), "no-rm")
    lab_01 = parse_guide((ROOT / "labs" / "01-the-duplicate.md").read_text(encoding="utf-8"))
    crash = next(i for i, step in enumerate(lab_01) if step.command.endswith(" --crash"))
    try:
        assert backend.down().exit_code == 0
        first = [run_step(step, backend) for step in lab_01[: crash + 1]]
        assert all(o.ok for o in first), describe(first)
        assert_the_reset_survives_a_run_typed_without_rm(backend, lab_01, lab_01[crash + 1])
    finally:
        backend.close()


def assert_the_reset_survives_a_run_typed_without_rm(backend, guide, step):
    """Before the guide's reset: `step`, one of its `run --rm` lines typed without --rm, leaves a
    stopped container; the guide's reset (its last line) removes it and every volume; and its
    first lines, to its first crash, print what they say again (a volume kept would keep the old
    thread: exit 4, and the receiver's ticket numbers)."""
    forgot = step.command.replace(" run --rm ", " run ", 1)
    assert forgot != step.command
    assert backend.run(forgot).exit_code == 0
    assert len(project_left(backend, "container")) == 2  # the api and the stopped run

    reset = run_step(guide[-1], backend)  # the guide's own reset line, as typed
    assert reset.ok and guide[-1].command == DOWN, describe([reset])
    for kind in ("container", "volume"):
        assert project_left(backend, kind) == [], kind
    crash = next(i for i, s in enumerate(guide) if re.search(r" --crash(-at \S+)?$", s.command))
    again = [run_step(s, backend) for s in guide[: crash + 1]]
    assert all(o.ok for o in again), describe(again)  # the crash makes ticket 1 again


@pytest.mark.docker
def test_a_run_without_the_override_leaves_the_receiver_alone():
    """Lab 14 names its retention file on its `up` only. A `run` typed without it must not
    recreate the api without the setting (with `depends_on: [api]`, Compose 2.26's `run`
    recreates a running api whose configuration differs from that command's files; 1.29's
    leaves it alone either way, so v1 is not run here)."""
    backend = compose_backend(("docker", "compose"), "keep-api")
    lab_14 = parse_guide((ROOT / "labs" / "14-the-key-that-expired.md").read_text("utf-8"))
    up = lab_14[1]  # a Step: its command names the 2 s file
    assert parse_command(up.command).files == ["compose.yaml", KEY_RETENTION]

    def api():
        (container,) = backend.compose_run(["ps", "-q", "api"]).stdout.split()
        env = run_command(
            ["docker", "inspect", "-f", "{{json .Config.Env}}", container], timeout=30
        )
        return container, "RECEIVER_KEY_RETENTION_S=2" in env.stdout

    try:
        assert backend.down().exit_code == 0
        assert run_step(up, backend).ok
        before = api()
        assert before[1], "the up did not set the retention"
        assert (
            backend.run("docker compose -p stateful-lab run --rm workflow tickets").exit_code == 0
        )
        assert backend.run("docker compose -p stateful-lab logs api").exit_code == 0
        assert api() == before  # the same container, still with the 2 s retention
    finally:
        backend.close()
