"""Lab 13's saga against a real receiver: charge, reserve, ship; a refused step undoes the
completed ones in reverse order (release the seats, then refund the charge).

The drill (effectdrill, real forks and SIGKILLs) runs over the whole saga, forward and backward,
and an observer counts the receiver's charges, reservations, releases and refunds: without a key
each undo repeats at exactly one crash point, the one after its answer and before its result is
saved; keyed by what its step made (OP:release:reservation-N) it never does.
The CLI's own crash (--crash-at, a real process that gets its SIGKILL) shows the same, and a
kill in each effect's window (--crash-at after-send: the receiver has answered, the ledger has
no receipt yet) ends in the lookup adopting what the receiver made: its /metrics counts no
second POST.
"""

import os
import re
import sys
import urllib.request

import pytest
from workflow_helpers import events

import effectdrill
from labs import cli as lab_py
from labs import saga, saga_store
from tools.local import events as local_events
from tools.local import run_workflow_here

REFUSED = 11  # seats: more than the receiver has (labs/saga_store.py's SEATS, 10): refused
NO_CARRIER = "AQ"  # no carrier ships there (labs/saga_store.py's CARRIERS): the shipment refused
AFTER_THE_REFUNDS_ANSWER = "put_writes refund [refund_id]"  # the drill's names for those points
AFTER_THE_RELEASES_ANSWER = "put_writes release [branch:to:refund, release_id]"
MADE = ("tickets", *saga_store.LISTED)  # the receiver's tables a saga's POSTs make rows in


@pytest.fixture
def drill(receiver, monkeypatch):
    """effectdrill.drill over the saga in a mode; the nodes and the observer use API_URL."""
    monkeypatch.setenv("API_URL", receiver.url)

    def run(mode, durability="sync"):
        data = {"operation_id": "{thread}", "title": "{thread}", "seats": 2, "mode": mode}
        data["ship_to"] = NO_CARRIER  # every run goes forward three steps, then back two
        return effectdrill.drill(
            saga.graph, data, saga.observe, durability=durability, context=saga.context()
        )

    return run


def test_naive_undoes_twice_at_exactly_the_points_after_each_undos_answer(drill):
    report = drill("naive")

    once = {"charge": 1, "reservation": 1, "release": 1, "refund": 1}
    assert report.clean == {"sync": once}
    releases = {row.point: row.counts("release") for row in report.rows}
    refunds = {row.point: row.counts("refund") for row in report.rows}
    assert releases.pop(AFTER_THE_RELEASES_ANSWER) == refunds.pop(AFTER_THE_REFUNDS_ANSWER) == [2]
    assert set(map(tuple, releases.values())) == {(1,)} and len(releases) == 12
    assert {tuple(row.counts("charge")) for row in report.rows} == {(1,)}  # keyed: once
    assert sorted((f["point"], f["effect"], f["count"]) for f in report.duplicates) == [
        (AFTER_THE_REFUNDS_ANSWER, "refund", 2),
        (AFTER_THE_RELEASES_ANSWER, "release", 2),
    ]
    assert report.missing == [] and report.failed == []


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_safe_undoes_each_step_once_at_every_crash_point(drill, durability):
    report = drill("safe", durability)

    assert report.rows, "the drill found no crash point"
    assert {row.point for row in report.rows} >= (
        {AFTER_THE_RELEASES_ANSWER, AFTER_THE_REFUNDS_ANSWER} if durability != "exit" else set()
    )
    for row in report.rows:
        for effect in ("charge", "reservation", "release", "refund"):
            assert row.counts(effect) == [1], row.as_json()
    assert report.ok, report.table()


def killed(args, env, tmp_path):
    """`labs/cli.py ARGS` for a run that its own --crash-at SIGKILLs: lab.main in a forked child of
    this process, a real process that really dies (LangGraph imported already: a fork costs
    milliseconds, a new interpreter seconds). (exit code, as os.waitpid tells it; stdout)."""
    import langgraph.checkpoint.sqlite  # noqa: F401 (before the fork: the child has them)
    import langgraph.graph  # noqa: F401

    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.dup2(write, 1)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(tmp_path / "killed.err", "a", buffering=1)  # noqa: SIM115
            code = lab_py.main(list(args), env)
        finally:
            os._exit(code)
    os.close(write)
    with open(read) as out:
        printed = out.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), local_events(printed)


def refunds(lab):
    (listed,) = events(run_workflow_here(["saga", "refunds"], lab))
    return listed["refunds"]


def releases(lab):
    """The receiver's releases, and the seats it says are left (10 when every hold is undone)."""
    (listed,) = events(run_workflow_here(["saga", "releases"], lab))
    return listed["releases"], listed["seats_left"]


def posts(receiver):
    """What the receiver's POSTs did, from its GET /metrics: made (created), replayed (a key it
    knew: a second request), refused (a 409 key_conflict)."""
    with urllib.request.urlopen(receiver.url + "/metrics") as response:
        text = response.read().decode()
    names = {
        "made": tuple(f"{table}_created" for table in MADE),
        "replayed": ("idempotent_replays",),
        "refused": ("key_conflicts",),
    }
    count = lambda name: int(re.search(rf"^receiver_{name}_total (\d+)$", text, re.M)[1])  # noqa: E731
    return {what: sum(map(count, counters)) for what, counters in names.items()}


@pytest.mark.parametrize("mode,made", [("naive", [1, 2]), ("safe", [1])])
def test_a_crash_after_the_refunds_answer_then_resume(receiver, lab, tmp_path, mode, made):
    start = ["saga", "start", "--thread", "t", "--operation", "case-13:book:v1", "--mode", mode]
    code, crashed = killed(
        [*start, "--seats", str(REFUSED), "--crash-at", "after-refund-ack"], lab, tmp_path
    )
    assert code == -9
    assert crashed[-2:] == [
        {"event": "refunded", "created": True, "refund_id": 1},
        {"event": "crash", "at": "after-refund-ack"},
    ]
    plain = run_workflow_here(["resume", "--thread", "t"], lab)  # `saga` forgotten
    assert plain.returncode == 4 and plain.stderr.count("\n") == 1, plain.stderr
    assert "saga resume --thread t" in plain.stderr
    # the hint warns where following it repeats the refund: naive sends it without a key
    assert ("refunds again if the first refund went through" in plain.stderr) == (mode == "naive")
    twice = run_workflow_here([*start, "--seats", str(REFUSED)], lab)  # no reset between
    assert twice.returncode == 4 and "saga resume --thread t" in twice.stderr, twice.stderr
    assert ("look at the refunds first" in twice.stderr) == (mode == "naive")
    assert ("python -m labs saga resume --thread t (Docker: " in twice.stderr) == (mode != "naive")
    resumed = run_workflow_here(["saga", "resume", "--thread", "t"], lab)

    assert resumed.returncode == 0, resumed.stderr
    again = events(resumed)[0]
    if mode == "naive":  # no key, no ledger: a second request, a second refund
        assert again == {"event": "refunded", "created": True, "refund_id": 2}
    else:  # the ledger's receipt answered: the receiver heard no second refund request
        key = "case-13:book:v1:refund:ticket-1"
        assert again == {"event": "refunded", "how": "receipt", "key": key, "refund_id": 1}
        assert posts(receiver) == {"made": 2, "replayed": 0, "refused": 0}
    assert [r["refund_id"] for r in refunds(lab)] == made
    key = "case-13:book:v1:refund:ticket-1" if mode == "safe" else None
    assert {r["key"] for r in refunds(lab)} == {key}
    assert releases(lab) == ([], 10)  # the reservation was refused: nothing to release


def test_a_kill_in_the_window_of_the_charge_then_of_the_refund_is_adopted_by_lookup(
    receiver, lab, tmp_path
):
    """Killed after the receiver answered and before the ledger kept a receipt (after-send),
    twice: in the charge, then in the refund. Each resume finds only the intent, asks the
    receiver by key and adopts what it made: one POST each, no replay."""
    start = ["saga", "start", "--thread", "w", "--operation", "case-w:book:v1"]
    code, in_the_charge = killed(
        [*start, "--seats", str(REFUSED), "--crash-at", "after-send"], lab, tmp_path
    )
    assert (code, in_the_charge) == (-9, [{"event": "crash", "at": "after-send"}])
    resume = ["saga", "resume", "--thread", "w"]
    code, in_the_refund = killed([*resume, "--crash-at", "after-send"], lab, tmp_path)
    error = "no capacity: 11 seats asked for, 10 of 10 left"
    assert code == -9 and in_the_refund == [
        {"event": "charged", "how": "adopted", "key": "case-w:book:v1:charge", "ticket_id": 1},
        {"event": "refused", "error": error},  # the reservation sends; a 409 has no window
        {"event": "crash", "at": "after-send"},
    ]
    done = run_workflow_here(resume, lab)

    assert done.returncode == 0, done.stderr
    key = "case-w:book:v1:refund:ticket-1"
    assert events(done)[0] == {"event": "refunded", "how": "adopted", "key": key, "refund_id": 1}
    assert events(done)[-1]["refund_id"] == 1 and events(done)[-1]["ticket_id"] == 1
    assert posts(receiver) == {"made": 2, "replayed": 0, "refused": 0}  # a ticket, a refund
    assert [r["ticket_id"] for r in refunds(lab)] == [1]


def test_reconcile_settles_a_saga_effect_killed_in_its_window(receiver, lab, tmp_path):
    """`python -m labs reconcile` knows the saga's effects: it asks the receiver by key, records
    what it made as confirmed, and the resume takes the receipt (it does not even look up)."""
    start = ["saga", "start", "--thread", "z", "--seats", str(REFUSED), "--crash-at", "after-send"]
    assert killed(start, lab, tmp_path)[0] == -9
    reconciled = run_workflow_here(["reconcile"], lab)

    assert reconciled.returncode == 0, reconciled.stderr
    key = "case-013:book:v1:charge"
    assert events(reconciled) == [
        {
            "event": "reconciled",
            "effect": "charge",
            "key": key,
            "now": "confirmed",
            "was": "requested",
        },
        {"event": "effects_unknown", "count": 0, "oldest_s": 0},
    ]
    resumed = run_workflow_here(["saga", "resume", "--thread", "z"], lab)
    assert events(resumed)[0] == {"event": "charged", "how": "receipt", "key": key, "ticket_id": 1}
    assert posts(receiver) == {"made": 2, "replayed": 0, "refused": 0}


def test_a_kill_in_the_window_of_the_reservation_then_of_the_shipment_is_adopted(
    receiver, lab, tmp_path
):
    """--mode naive decides only the undos: the forward steps go through the ledger in both
    modes. Killed after the charge's receipt, the resume sends no charge; killed in the
    reservation's window, then in the shipment's, each next run adopts what the receiver made.
    The shipment's outcome was unknown until the lookup settled it: shipped, nothing undone."""
    start = ["saga", "start", "--thread", "r", "--mode", "naive", "--seats", "2"]
    assert killed([*start, "--crash-at", "after-charge-ack"], lab, tmp_path)[0] == -9
    resume = ["saga", "resume", "--thread", "r"]
    code, in_the_reservation = killed([*resume, "--crash-at", "after-send"], lab, tmp_path)
    key = "case-013:book:v1"
    assert code == -9 and in_the_reservation == [
        {"event": "charged", "how": "receipt", "key": f"{key}:charge", "ticket_id": 1},
        {"event": "crash", "at": "after-send"},
    ]
    code, in_the_shipment = killed([*resume, "--crash-at", "after-send"], lab, tmp_path)
    adopted = {"event": "reserved", "how": "adopted", "key": f"{key}:reserve", "reservation_id": 1}
    assert code == -9 and in_the_shipment == [adopted, {"event": "crash", "at": "after-send"}]
    done = run_workflow_here(resume, lab)

    assert done.returncode == 0, done.stderr
    shipped = {"event": "shipped", "how": "adopted", "key": f"{key}:ship", "shipment_id": 1}
    assert [e["event"] for e in events(done)] == ["shipped", "done"] and events(done)[0] == shipped
    assert posts(receiver) == {"made": 3, "replayed": 0, "refused": 0}  # a ticket, 2 seats, a ship
    assert refunds(lab) == [] and releases(lab) == ([], 8)


def test_killed_at_every_point_forward_and_backward_each_step_and_undo_happens_once(
    receiver, lab, tmp_path
):
    """A saga whose shipment is refused, killed at each point of its path in turn: in each
    effect's window (after-send: answered, no receipt yet) and after each answer (the node not
    returned). Each resume goes on from where the last one died. The receiver ends with one
    charge, one reservation, no shipment, one release of that reservation and one refund of
    that charge, in that order, every seat back, and no key it heard twice."""
    points = ["after-send", "after-charge-ack", "after-send", "after-reserve-ack", "after-send"]
    points += ["after-release-ack", "after-send", "after-refund-ack"]
    start = ["saga", "start", "--thread", "k", "--seats", "2", "--ship-to", NO_CARRIER]
    for number, point in enumerate(points):
        typed = start if number == 0 else ["saga", "resume", "--thread", "k"]
        code, printed = killed([*typed, "--crash-at", point], lab, tmp_path)
        assert code == -9 and printed[-1] == {"event": "crash", "at": point}, printed
    done = run_workflow_here(["saga", "resume", "--thread", "k"], lab)

    assert done.returncode == 0, done.stderr
    key = "case-013:book:v1:refund:ticket-1"
    assert events(done)[0] == {"event": "refunded", "how": "receipt", "key": key, "refund_id": 1}
    assert posts(receiver) == {"made": 4, "replayed": 0, "refused": 0}
    released = [{"key": "case-013:book:v1:release:reservation-1", "release_id": 1}]
    assert [{k: r[k] for k in ("key", "release_id")} for r in releases(lab)[0]] == released
    assert releases(lab)[1] == 10
    assert [(r["refund_id"], r["ticket_id"]) for r in refunds(lab)] == [(1, 1)]
    made = re.findall(r"created key=\S+ (\w+)=", receiver.log_path.read_text())
    assert made == ["ticket", "reservation", "release", "refund"], made  # the undos reversed


def test_a_refusal_is_kept_and_every_later_attempt_is_answered_from_the_ledger(receiver, lab):
    """no_capacity is recorded as failed: another saga of the same operation (a second thread)
    gets the refusal, the charge and the refund from the ledger, and the receiver hears nothing."""
    saga = ["saga", "start", "--operation", "case-f:book:v1", "--seats", str(REFUSED)]
    first = run_workflow_here([*saga, "--thread", "a"], lab)
    assert [e["event"] for e in events(first)] == ["charged", "refused", "refunded", "done"]
    before = posts(receiver)
    again = run_workflow_here([*saga, "--thread", "b"], lab)

    assert again.returncode == 0, again.stderr
    key, error = "case-f:book:v1", events(first)[1]["error"]
    assert events(again)[:3] == [
        {"event": "charged", "how": "receipt", "key": f"{key}:charge", "ticket_id": 1},
        {"event": "refused", "how": "receipt", "key": f"{key}:reserve", "error": error},
        {"event": "refunded", "how": "receipt", "key": f"{key}:refund:ticket-1", "refund_id": 1},
    ]
    assert posts(receiver) == before == {"made": 2, "replayed": 0, "refused": 0}
    assert [r["ticket_id"] for r in refunds(lab)] == [1]
    assert releases(lab) == ([], 10)  # refused, the reservation made nothing: nothing released


def test_a_reservation_with_seats_left_ends_the_saga_without_a_refund(receiver, lab):
    done = run_workflow_here(["saga", "start", "--thread", "ok", "--seats", "2"], lab)

    assert done.returncode == 0, done.stderr
    assert [e["event"] for e in events(done)] == ["charged", "reserved", "shipped", "done"]
    assert events(done)[-1]["shipment_id"] == 1 and "refund_id" not in events(done)[-1]
    assert refunds(lab) == [] and releases(lab) == ([], 8)


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["saga", "resume", "--thread", "nope"], 4, "no thread 'nope'"),
        (["saga", "state", "--thread", "nope"], 4, "no thread 'nope'"),
        (["saga", "start", "--seats", "many"], 2, "whole number from 1 to 1000"),
        (["saga", "start", "--seats", "0"], 2, "whole number from 1 to 1000"),
        (["saga", "start", "--crash-at", "after-everything"], 2, "invalid choice"),
        (["saga"], 2, "labs saga: the following arguments are required: action (see --help)"),
        (["saga", "strat"], 2, "argument action: invalid choice: 'strat' (choose from 'start'"),
    ],
)
def test_bad_input_is_one_line_and_its_exit_code(receiver, lab, args, code, words):
    done = run_workflow_here(args, lab)
    assert done.returncode == code and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and words in done.stderr, done.stderr


def test_saga_resume_refuses_a_thread_that_is_not_a_saga(receiver, lab):
    assert run_workflow_here(["start", "--thread", "plain"], lab).returncode == 0
    done = run_workflow_here(["saga", "resume", "--thread", "plain"], lab)
    assert done.returncode == 4 and "is not a saga" in done.stderr, done.stderr


def test_only_a_no_capacity_refusal_is_compensated_a_key_conflict_stops_the_run(
    receiver, lab, tmp_path
):
    """A 409 "no_capacity" reserved nothing: refund the charge, once. A reservation key used for
    another body (here the same --operation booked 2 seats, then asks for 3) is a protocol
    error: exit 1, one line, and the standing booking's charge is not refunded. The ledger knows
    the key and sends nothing; a ledger that does not (another CHECKPOINT_DB) sends it, and the
    receiver refuses it 409 key_conflict."""
    saga = ["saga", "start", "--operation", "case-k:book:v1"]
    assert run_workflow_here([*saga, "--thread", "a", "--seats", "2"], lab).returncode == 0
    conflict = run_workflow_here([*saga, "--thread", "b", "--seats", "3"], lab)
    assert conflict.returncode == 1 and conflict.stderr.count("\n") == 1, conflict.stderr
    assert "not sent: the ledger holds" in conflict.stderr and "not refunded" in conflict.stderr
    assert conflict.stderr.endswith(  # the saga that holds it, as the ledger's row names it
        "look at that saga's state (python -m labs saga state --thread a (Docker: docker compose "
        "-p stateful-lab run --rm workflow saga state --thread a))\n"
    ), conflict.stderr
    charged = {"event": "charged", "how": "receipt", "key": "case-k:book:v1:charge", "ticket_id": 1}
    assert events(conflict) == [charged]
    assert posts(receiver) == {"made": 3, "replayed": 0, "refused": 0}
    elsewhere_to = run_workflow_here(
        [*saga, "--thread", "d", "--seats", "2", "--ship-to", "DE"], lab
    )
    assert elsewhere_to.returncode == 1 and elsewhere_to.stderr.count("\n") == 1
    assert "shipment not sent: the ledger holds the key case-k:book:v1:ship" in elsewhere_to.stderr
    assert "reservation 1 is not released" in elsewhere_to.stderr, elsewhere_to.stderr
    assert posts(receiver) == {"made": 3, "replayed": 0, "refused": 0}
    elsewhere = dict(lab, CHECKPOINT_DB=str(tmp_path / "another" / "checkpoints.sqlite"))
    conflict = run_workflow_here([*saga, "--thread", "b", "--seats", "3"], elsewhere)
    assert conflict.returncode == 1 and conflict.stderr.count("\n") == 1, conflict.stderr
    assert "409 key_conflict" in conflict.stderr and "not refunded" in conflict.stderr
    assert "ledger does not name that saga's thread" in conflict.stderr  # its row is b's own
    assert events(conflict) == [{"event": "charged", "created": False, "ticket_id": 1}]
    assert posts(receiver) == {"made": 3, "replayed": 1, "refused": 1}
    assert refunds(lab) == []

    refused = run_workflow_here(["saga", "start", "--thread", "c", "--seats", "9"], lab)
    assert [e["event"] for e in events(refused)] == ["charged", "refused", "refunded", "done"]
    assert [r["ticket_id"] for r in refunds(lab)] == [2]
