"""The snapshot engine against the kill engine: both drill the same graph, row by row equal.

The default run compares a small representative set (COMPARED): a Send fan-out with every held
set of its writes (jokes, its world a folder restored in place), and a lab graph whose ledger
sits beside its effects (the shop's ledger mode, a copy of its world per resume).
EFFECTDRILL_COMPARE_ALL=1 compares every case of CASES (the test suite's graphs, interrupts
and subgraphs included, and the lab's drill graphs): about 90 s on 2 cores.
"""

import os
import sqlite3
import sys
from contextlib import closing

import pytest
from effectdrill_graphs import (
    agent,
    asking,
    functional,
    handler,
    jokes,
    loop,
    nested,
    orders,
    parallel,
    retrying,
    subapproval,
)
from langgraph.graph import END, START, StateGraph

import effectdrill
from effectdrill.cli import EXIT_ENGINES_DIFFER
from effectdrill.errors import DrillError
from effectdrill.snapshot import choose
from effectdrill.world import SqliteWorld, declared_world
from labs.graphs import approval, shop, ticket, webhook
from tools.local import ROOT, run_command

INPUT = {"thread": "{thread}"}
EFFECTS = SqliteWorld(env="EFFECTS_DB")


def case(name, graph, observe, world=EFFECTS, input=INPUT, **options):
    return pytest.param(graph, observe, world, input, options, id=name)


CASES = {
    "orders": case(
        "orders", orders.build, orders.observe, SqliteWorld(env="ORDERS_DB"), {"order": "{thread}"}
    ),
    "jokes": case("jokes", jokes.build, jokes.observe, "EFFECTS_DB folder"),  # in place
    "asking": case("asking", asking.build_twice, asking.observe, resume_with="ok"),
    "shop-ledger": case(
        "shop-ledger",
        shop.graph,
        shop.observe,
        SqliteWorld(env="SHOP_DB"),
        {"order": "{thread}", "mode": "ledger"},
    ),
    "loop": case("loop", loop.build, loop.observe),
    "parallel": case("parallel", parallel.build, parallel.observe),
    "functional": case("functional", functional.workflow, functional.observe),
    "together": case("together", asking.build_together, asking.observe, resume_with=asking.answer),
    "nested": case(
        "nested", nested.build, nested.observe, SqliteWorld(env="NESTED_DB"), {"order": "{thread}"}
    ),
    "retrying": case("retrying", retrying.build, retrying.observe),
    "subapproval": case("subapproval", subapproval.build, subapproval.observe, resume_with=True),
    "handler": case("handler", handler.build, handler.observe),
    "agent": case("agent", agent.build, agent.observe, input={"messages": [["user", "{thread}"]]}),
    "shop": case(
        "shop", shop.graph, shop.observe, SqliteWorld(env="SHOP_DB"), {"order": "{thread}"}
    ),
    "approval": case(
        "approval",
        approval.graph,
        approval.observe,
        SqliteWorld(env="APPROVAL_DB"),
        {"refund": "{thread}"},
        resume_with=True,
    ),
    "approval-ledger": case(
        "approval-ledger",
        approval.graph,
        approval.observe,
        SqliteWorld(env="APPROVAL_DB"),
        {"refund": "{thread}", "mode": "ledger"},
        resume_with=True,
    ),
    "webhook": case(
        "webhook",
        webhook.graph,
        webhook.observe,
        SqliteWorld(env="WEBHOOK_DB"),
        {"event_id": "{thread}", "ticket": "{thread}", "status": "resolved", "version": 1},
    ),
    "webhook-inbox": case(
        "webhook-inbox",
        webhook.graph,
        webhook.observe,
        SqliteWorld(env="WEBHOOK_DB"),
        {
            "event_id": "{thread}",
            "ticket": "{thread}",
            "status": "resolved",
            "version": 1,
            "mode": "inbox",
        },
    ),
}
COMPARED = ["jokes", "shop-ledger"]
ALL = os.environ.get("EFFECTDRILL_COMPARE_ALL") == "1"


@pytest.fixture(autouse=True)
def worlds(tmp_path, monkeypatch):
    for name in ("EFFECTS_DB", "ORDERS_DB", "NESTED_DB", "SHOP_DB", "APPROVAL_DB", "WEBHOOK_DB"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name / "effects.sqlite"))


def rows(report):
    """Each row as both engines must find it: not its threads, nor its engine, nor its place
    (LangGraph saves a step's writes and the next checkpoint in no fixed order: langgraph#8039;
    the snapshot engine's clean run makes them one at a time, in an order of its own)."""
    return sorted(
        (
            row.point,
            row.verdict,
            [r.saved for r in row.runs],
            [r.ran for r in row.runs],
            {e: row.counts(e) for e in row.effects()},
            [r.error is None for r in row.runs],
        )
        for row in report.rows
    )


@pytest.mark.parametrize(
    "graph, observe, world, input, options",
    [CASES[name] for name in (CASES if ALL else COMPARED)],
)
def test_the_snapshot_engine_finds_the_kill_engines_rows(graph, observe, world, input, options):
    if world == "EFFECTS_DB folder":  # a PATH: restored in place, one resume at a time
        world = SqliteWorld(os.path.dirname(os.environ["EFFECTS_DB"]))
    killed = effectdrill.drill(graph, input, observe, engine="kill", **options)
    snapped = effectdrill.drill(graph, input, observe, engine="snapshot", world=world, **options)

    assert [r.engine for r in killed.rows] == ["kill"] * len(killed.rows)
    assert "snapshot" in {r.engine for r in snapped.rows}
    assert rows(snapped) == rows(killed)
    assert snapped.clean == killed.clean and snapped.reruns == killed.reruns
    assert "engine: snapshot (asked for: " in snapped.table()
    assert {row.as_json()["engine"] for row in snapped.rows} <= {"snapshot", "kill"}


def test_auto_picks_snapshot_for_a_declared_world_and_verify_agrees():
    def observe(thread):
        return orders.observe(thread)

    observe.drill_world = SqliteWorld(env="ORDERS_DB")
    report = effectdrill.drill(orders.build, {"order": "{thread}"}, observe, verify=3)

    assert report.engines["sync"][0] == "snapshot"
    assert {row.engine for row in report.rows} == {"snapshot"}
    assert len(report.verified) == 3 and all(v["same"] for v in report.verified)
    assert {f["point"] for f in report.duplicates} == {
        "put_writes pay [branch:to:ship, paid]",
        "put_writes ship [shipped]",
    }


def test_what_a_node_writes_to_its_stdout_goes_to_stderr(capfd):
    """A node whose subprocess writes to file descriptor 1 (redirect_stdout cannot catch it):
    stdout is the report's (--json), so the clean run's and every resume's writes go to
    stderr."""

    def loud(state):
        os.write(1, b"loud node\n")
        with closing(sqlite3.connect(os.environ["EFFECTS_DB"])) as db, db:
            db.execute("CREATE TABLE IF NOT EXISTS sent (thread)")
            db.execute("INSERT INTO sent VALUES (?)", (state["thread"],))
        return {}

    def observe(thread):
        with closing(sqlite3.connect(os.environ["EFFECTS_DB"])) as db:
            db.execute("CREATE TABLE IF NOT EXISTS sent (thread)")
            (count,) = db.execute(
                "SELECT COUNT(*) FROM sent WHERE thread = ?", (thread,)
            ).fetchone()
        return {"sent": count}

    builder = StateGraph(dict)
    builder.add_node("loud", loud)
    builder.add_edge(START, "loud")
    builder.add_edge("loud", END)
    report = effectdrill.drill(builder.compile(), INPUT, observe, world=EFFECTS)

    out, err = capfd.readouterr()
    assert {row.engine for row in report.rows} == {"snapshot"}
    resumed = sum(row.runs[0].ran.count("loud") for row in report.rows)
    assert out == "" and err.count("loud node") == 1 + resumed, (out, err)  # the clean run's too


def test_verify_fails_with_its_own_exit_code_when_a_world_is_not_restored(tmp_path):
    """A world whose restore() does nothing: every resume sees what the clean run made later,
    so the snapshot rows differ from the real kills' (exit 5, one line naming the point)."""
    done = run_command(
        [sys.executable, "-m", "effectdrill", "effectdrill_graphs.orders:build"]
        + ["--input", '{"order": "{thread}"}', "--observe", "effectdrill_graphs.orders:observe"]
        + ["--world", "effectdrill_graphs.orders:forgetful_world", "--verify", "9"],
        env=os.environ | {"PYTHONPATH": str(ROOT / "tests")},
    )

    assert done.returncode == EXIT_ENGINES_DIFFER == 5
    (line,) = done.stderr.splitlines()
    assert line.startswith("effectdrill: --verify: the engines differ at put")
    assert ", kill ok (charge 1, audit 1, ledger 1, shipment 1)" in line


@pytest.mark.fast
def test_a_world_the_drill_cannot_restore_gets_real_kills():
    """The lab's receiver is an outside server: its observer declares no world, so auto uses
    real kills and says why (never a snapshot row that misses what the server absorbed);
    --engine snapshot is refused before any run."""
    world = declared_world(None, ticket.observe, None)
    engine, why = choose("auto", None, None, "sync", False, world, early=True)
    assert (world, engine) == (None, "kill") and why.startswith("no world declared")
    assert choose("auto", None, None, "async", False, EFFECTS)[0] == "kill"
    assert choose("auto", None, None, "sync", True, EFFECTS)[0] == "kill"  # --observe http
    assert choose("auto", None, None, "async", False, None) == ("kill", why)  # said nowhere
    exit_why = choose("auto", None, None, "exit", False, EFFECTS)[1]  # not "timing" alone
    assert exit_why.startswith("durability exit: it saves only as the run ends"), exit_why
    with pytest.raises(DrillError, match="--verify 2 runs snapshot rows again .* --engine kill"):
        effectdrill.drill(
            orders.build, {"order": "{thread}"}, orders.observe, engine="kill", verify=2
        )
    with pytest.raises(DrillError, match="--engine snapshot cannot drill this graph: no world"):
        effectdrill.drill(ticket.graph, {"title": "{thread}"}, ticket.observe, engine="snapshot")
    with pytest.raises(DrillError, match=r"the world names \$NOT_SET_HERE, which is not set"):
        effectdrill.drill(
            orders.build,
            {"order": "{thread}"},
            orders.observe,
            world=SqliteWorld(env="NOT_SET_HERE"),
        )


@pytest.mark.fast
def test_each_row_says_its_engine_in_the_table_the_json_and_the_page():
    from effectdrill import html
    from effectdrill.report import Report, Row, Run

    report = Report()
    report.clean["sync"] = {"sent": 1}
    report.engines["sync"] = ("snapshot", "asked for: the checkpoints and its world restored")
    for point, engine in (("put step 0", "snapshot"), ("put_writes send [x]", "kill")):
        row = Row("sync", point, {"sent": 1}, engine=engine)
        row.runs.append(Run(True, "step 0: send", ["send"], {"sent": 1}, thread="t"))
        report.rows.append(row)

    lines = report.table().splitlines()
    assert [line.split()[0:3] for line in lines if line.startswith("put")] == [
        ["put", "step", "0"],
        ["put_writes", "send", "[x]"],
    ]
    assert any(line.startswith("put_writes send [x] (by kill)") for line in lines)
    assert "engine: snapshot (asked for: the checkpoints and its world restored)" in lines
    assert [r.as_json()["engine"] for r in report.rows] == ["snapshot", "kill"]
    assert report.summary()["engines"] == {
        "sync": {"engine": "snapshot", "why": "asked for: the checkpoints and its world restored"}
    }
    page = html.render(report, "g:graph", "effectdrill g:graph")
    assert page.count('<td class="engine">snapshot</td>') == 1
    assert page.count('<td class="engine">kill</td>') == 1
    assert "engine: snapshot (asked for" in page
