"""Lab 13's saga against a real receiver: charge, a refused reservation, the refund.

The drill (effectdrill, real forks and SIGKILLs) runs over the whole saga and an observer counts
the receiver's refunds: without a key the refund repeats at exactly one crash point, the one
after the refund's answer and before its result is saved; keyed by op:refund it never does.
The CLI's own crash (--crash-at, a real process that gets its SIGKILL) shows the same.
"""

import pytest
from workflow_helpers import events

import effectdrill
from labs.graphs import saga
from labs.tools.local import run_workflow, run_workflow_here

REFUSED = 11  # seats: more than the receiver has (api.py's SEATS, 10), so the reservation fails
AFTER_THE_REFUNDS_ANSWER = "put_writes refund [refund_id]"  # the drill's name for that point


@pytest.fixture
def drill(receiver, monkeypatch):
    """effectdrill.drill over the saga in a mode; the nodes and the observer use API_URL."""
    monkeypatch.setenv("API_URL", receiver.url)

    def run(mode, durability="sync"):
        data = {"operation_id": "{thread}", "title": "{thread}", "seats": REFUSED, "mode": mode}
        return effectdrill.drill(
            saga.graph, data, saga.observe, durability=durability, context=saga.context()
        )

    return run


def test_naive_refunds_twice_at_exactly_the_point_after_the_refunds_answer(drill):
    report = drill("naive")

    assert report.clean == {"sync": {"charge": 1, "refund": 1}}
    refunds = {row.point: row.counts("refund") for row in report.rows}
    assert refunds.pop(AFTER_THE_REFUNDS_ANSWER) == [2]
    assert len(refunds) == 8 and set(map(tuple, refunds.values())) == {(1,)}
    assert {tuple(row.counts("charge")) for row in report.rows} == {(1,)}  # keyed: once
    assert [(f["point"], f["effect"], f["count"]) for f in report.duplicates] == [
        (AFTER_THE_REFUNDS_ANSWER, "refund", 2)
    ]
    assert report.missing == [] and report.failed == []


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_safe_refunds_once_at_every_crash_point(drill, durability):
    report = drill("safe", durability)

    assert report.rows, "the drill found no crash point"
    assert {row.point for row in report.rows} >= (
        {AFTER_THE_REFUNDS_ANSWER} if durability != "exit" else set()
    )
    for row in report.rows:
        assert row.counts("refund") == [1] and row.counts("charge") == [1], row.as_json()
    assert report.ok, report.table()


def refunds(lab):
    (listed,) = events(run_workflow_here(["saga", "refunds"], lab))
    return listed["refunds"]


@pytest.mark.parametrize("mode,made", [("naive", [1, 2]), ("safe", [1])])
def test_a_crash_after_the_refunds_answer_then_resume(receiver, lab, mode, made):
    start = ["saga", "start", "--thread", "t", "--operation", "case-13:book:v1", "--mode", mode]
    crashed = run_workflow([*start, "--seats", str(REFUSED), "--crash-at", "after-refund-ack"], lab)
    assert crashed.returncode == -9, crashed.stderr
    assert events(crashed)[-2:] == [
        {"event": "refunded", "created": True, "refund_id": 1},
        {"event": "crash", "at": "after-refund-ack"},
    ]
    resumed = run_workflow_here(["saga", "resume", "--thread", "t"], lab)

    assert resumed.returncode == 0, resumed.stderr
    again = events(resumed)[0]
    assert again == {"event": "refunded", "created": mode == "naive", "refund_id": made[-1]}
    assert [r["refund_id"] for r in refunds(lab)] == made
    key = "case-13:book:v1:refund" if mode == "safe" else None
    assert {r["key"] for r in refunds(lab)} == {key}


def test_a_crash_after_the_charge_repeats_nothing_in_naive_mode_either(receiver, lab):
    start = ["saga", "start", "--thread", "c", "--mode", "naive", "--seats", str(REFUSED)]
    crashed = run_workflow([*start, "--crash-at", "after-charge-ack"], lab)
    assert crashed.returncode == -9, crashed.stderr
    resumed = run_workflow_here(["saga", "resume", "--thread", "c"], lab)

    assert events(resumed)[0] == {"event": "charged", "created": False, "ticket_id": 1}
    assert [r["ticket_id"] for r in refunds(lab)] == [1]


def test_a_reservation_with_seats_left_ends_the_saga_without_a_refund(receiver, lab):
    done = run_workflow_here(["saga", "start", "--thread", "ok", "--seats", "2"], lab)

    assert done.returncode == 0, done.stderr
    assert [e["event"] for e in events(done)] == ["charged", "reserved", "done"]
    assert events(done)[-1]["reservation_id"] == 1 and "refund_id" not in events(done)[-1]
    assert refunds(lab) == []


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["saga", "resume", "--thread", "nope"], 4, "no thread 'nope'"),
        (["saga", "state", "--thread", "nope"], 4, "no thread 'nope'"),
        (["saga", "start", "--seats", "many"], 2, "whole number from 1 to 1000"),
        (["saga", "start", "--seats", "0"], 2, "whole number from 1 to 1000"),
        (["saga", "start", "--crash-at", "after-everything"], 2, "invalid choice"),
        (["saga"], 2, "required"),
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


def test_only_a_no_capacity_refusal_is_compensated_a_key_conflict_stops_the_run(receiver, lab):
    """A 409 "no_capacity" reserved nothing: refund the charge, once. A 409 "key_conflict" says
    a reservation exists under the key (here the same --operation booked 2 seats, then asks for
    3): a protocol error, exit 1, one line, and the standing booking's charge is not refunded."""
    saga = ["saga", "start", "--operation", "case-k:book:v1"]
    assert run_workflow_here([*saga, "--thread", "a", "--seats", "2"], lab).returncode == 0
    conflict = run_workflow_here([*saga, "--thread", "b", "--seats", "3"], lab)
    assert conflict.returncode == 1 and conflict.stderr.count("\n") == 1, conflict.stderr
    assert "409 key_conflict" in conflict.stderr and "not refunded" in conflict.stderr
    assert events(conflict) == [{"event": "charged", "created": False, "ticket_id": 1}]
    assert refunds(lab) == []

    refused = run_workflow_here(["saga", "start", "--thread", "c", "--seats", "9"], lab)
    assert [e["event"] for e in events(refused)] == ["charged", "refused", "refunded", "done"]
    assert [r["ticket_id"] for r in refunds(lab)] == [2]
