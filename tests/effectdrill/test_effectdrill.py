"""effectdrill on graphs nobody else in this repository wrote: real forks, real SIGKILLs, real
SQLite files (and a real Postgres cluster) counting the effects.

The library is called in-process (its crash runs fork from the test process and die by
SIGKILL); the CLI runs in-process where nothing is killed (bad input), and as a real
`python -m effectdrill` process on the crash path.
"""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
from importlib.metadata import entry_points

import pytest
from chromium_helpers import chromium
from conftest import require_postgres
from effectdrill_graphs import asyncgraph, broken, contextual, nested, orders, review, sidebyside
from langgraph.checkpoint.sqlite import SqliteSaver

import effectdrill
from effectdrill.__main__ import main
from tools.local import ROOT, run_command
from tools.pg import TempPostgres

GRAPHS = "effectdrill_graphs"  # the test graphs' package, in tests/ (on sys.path, as conftest's)
pytest_plugins = ["pytester"]
TESTS = str(ROOT / "tests")  # PYTHONPATH for a `python -m effectdrill` naming them
SUMMARY_KEYS = {"summary", "points", "clean", "duplicates", "missing", "repeated_in_clean_run"}
FINDING_KEYS = {"durability", "point", "effect", "count", "clean"}


@pytest.fixture
def orders_db(tmp_path, monkeypatch):
    path = tmp_path / "orders.sqlite"
    monkeypatch.setenv("ORDERS_DB", str(path))
    return path


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """The system temp folder, for this test a folder of its own: it must be empty after."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def drill_orders(**options):
    return effectdrill.drill(orders.build, {"order": "order-{thread}"}, orders_observe, **options)


def orders_observe(thread_id):
    return orders.observe(f"order-{thread_id}")


def rows_of(report, mode):
    return [row for row in report.rows if row.durability == mode]


def test_sync_reports_each_unkeyed_effect_where_it_happened_and_its_node_was_not_saved(orders_db):
    report = drill_orders(durability="sync", repeat=2)

    assert report.clean == {"sync": {"charge": 1, "audit": 1, "ledger": 1, "shipment": 1}}
    rows = rows_of(report, "sync")
    points = [row.point for row in rows]
    assert len(points) == len(set(points)) == 9  # the input's 3, then writes + checkpoint a node
    assert report.missing == [] and report.failed == [] and report.repeated_in_clean_run == []
    found = {(f["point"], f["effect"], f["count"], f["times"]) for f in report.duplicates}
    assert found == {
        ("put_writes pay [branch:to:ship, paid]", "charge", 2, 2),
        ("put_writes ship [shipped]", "audit", 2, 2),
    }
    for point, effect, *_ in found:
        (row,) = [row for row in rows if row.point == point]
        node = orders.UNKEYED[effect]
        # The effect happened, the node's writes were not saved: the resume runs it again.
        step = {"pay": 1, "ship": 2}[node]  # validate is step 0
        assert {run.saved for run in row.runs} == {f"step {step}: {node}"}
        assert all(run.ran[0] == node for run in row.runs)
    (after_pay,) = [row for row in rows if row.point == "put step 2"]
    assert after_pay.runs[0].saved == "step 1: pay (writes saved)" and after_pay.verdict == "ok"


def test_a_kill_before_the_first_checkpoint_leaves_no_next_node_but_a_task(orders_db, tmp_path):
    """Why the drill resumes on get_state().tasks, not .next (effectdrill/README.md)."""
    from effectdrill.plan import CrashState
    from effectdrill.restart import KILLED, crash
    from effectdrill.runs import Plan
    from effectdrill.savers import Sqlite

    db = Sqlite(str(tmp_path / "checkpoints.sqlite"))
    db.check()  # makes the tables, as drill() does first
    plan = Plan(orders.build(), {"order": "o-1"}, orders.observe, None, None, "t")
    writes = "put_writes __start__ [branch:to:validate, order]"  # the input's, saved first
    state = CrashState("put step 0", "put step 0", frozenset({writes}))
    assert crash(plan, db, "sync", state, "thread-1") is KILLED

    with db.saver() as saver:
        state = (
            orders.build()
            .copy(update={"checkpointer": saver})
            .get_state({"configurable": {"thread_id": "thread-1"}})
        )
    assert state.next == () and state.values == {"order": "o-1"}
    assert [task.name for task in state.tasks] == ["__start__"]
    assert orders.observe("o-1")["charge"] == 0  # no node ran


def test_exit_mode_reports_every_unkeyed_effect_and_no_keyed_one(orders_db):
    report = drill_orders(durability="exit", repeat=2)

    (row,) = rows_of(report, "exit")  # nothing is saved before the end: one saver call
    assert row.point == "put step 3"
    assert [run.saved for run in row.runs] == ["nothing", "nothing"]
    assert [run.ran for run in row.runs] == [["validate", "pay", "ship"]] * 2
    assert {f["effect"] for f in report.duplicates} == set(orders.UNKEYED)
    assert all(row.counts(effect) == [2, 2] for effect in orders.UNKEYED)
    assert all(row.counts(effect) == [1, 1] for effect in orders.KEYED)


def test_async_repeats_each_point_and_never_repeats_a_keyed_effect(orders_db):
    report = drill_orders(durability="async", repeat=2)

    rows = rows_of(report, "async")
    assert rows and all(len(row.runs) == 2 for row in rows)
    assert {f["effect"] for f in report.duplicates} <= set(orders.UNKEYED)
    assert all(row.counts(effect) == [1, 1] for row in rows for effect in orders.KEYED)
    assert "2 runs each" in report.table()


def test_a_graph_with_an_interrupt_is_drilled_through_it(tmp_path, monkeypatch):
    monkeypatch.setattr(review, "DB_PATH", str(tmp_path / "review.sqlite"))

    report = effectdrill.drill(
        review.build(), {"post": "{thread}"}, review.observe, resume_with="ok"
    )

    assert report.clean == {"sync": {"draft": 1, "post": 1}}
    assert report.repeated_in_clean_run == []
    points = [row.point for row in report.rows]
    assert "put_writes review [__interrupt__]" in points  # the stop at interrupt() itself
    # Command(resume=...) is saved beside review's writes when it re-runs: a step of two.
    assert any(point.startswith("put_writes [__resume__] (others saved)") for point in points)
    assert {f["effect"] for f in report.duplicates} == {"post"}
    for finding in report.duplicates:
        assert "publish" in finding["point"] or finding["point"].startswith("put step")
    with pytest.raises(effectdrill.DrillError, match="stopped at interrupt\\(\\) in review"):
        effectdrill.drill(review.build(), {"post": "{thread}"}, review.observe)


def test_a_graph_compiled_with_its_own_saver_keeps_it_untouched(orders_db, tmp_path):
    own_file = tmp_path / "own.sqlite"
    own = SqliteSaver(sqlite3.connect(own_file, check_same_thread=False))
    graph = orders.build(checkpointer=own)

    report = effectdrill.drill(graph, {"order": "order-{thread}"}, orders_observe)

    assert graph.checkpointer is own
    assert {f["effect"] for f in report.duplicates} == set(orders.UNKEYED)
    assert list(own.list(None)) == []  # not one checkpoint of the drill's in the graph's saver


def test_the_runtime_context_reaches_every_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTEXT_DB", str(tmp_path / "context.sqlite"))

    report = effectdrill.drill(
        contextual.build, {"to": "{thread}"}, contextual.observe, context=contextual.make_context()
    )

    assert report.clean == {"sync": {"sent": 1}}
    assert not report.failed and all(row.counts("sent")[0] >= 1 for row in report.rows)
    assert [(f["point"], f["count"]) for f in report.duplicates] == [
        ("put_writes notify [sent]", 2)
    ]


def test_a_subgraphs_saver_calls_are_crash_points_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("NESTED_DB", str(tmp_path / "nested.sqlite"))

    report = effectdrill.drill(nested.build, {"order": "{thread}"}, nested.observe)

    points = [row.point for row in report.rows]
    assert "put_writes effect [done] in child" in points  # the subgraph's namespace, no task id
    assert [f["point"] for f in report.duplicates] == ["put_writes effect [done] in child"]


def test_a_resume_that_fails_is_a_failed_row_not_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("STRICT_DB", str(tmp_path / "strict.sqlite"))

    report = effectdrill.drill(broken.build_strict, {"item": "{thread}"}, broken.observe_strict)

    (row,) = [row for row in report.rows if row.point == "put_writes book [__no_writes__]"]
    assert row.verdict == "FAILED" and row.counts("booked") == [1]
    assert row.failures()[0].startswith("node book: IntegrityError: UNIQUE constraint failed")
    assert not report.ok and report.duplicates == []
    (line,) = [line for line in report.table().splitlines() if "FAILED" in line]
    assert line.startswith("put_writes book") and "FAILED: node book:" in line
    assert "IntegrityError: UNIQUE" in report.table()
    assert row.runs[0].saved == "step 0: book"


def test_cli_on_the_shop_prints_the_table_and_exits_1(tmp_path, temp_root):
    env = os.environ | {"SHOP_DB": str(tmp_path / "shop.sqlite"), "TMPDIR": str(temp_root)}
    done = run_command(
        [sys.executable, "-m", "effectdrill", "labs.graphs.shop:graph", "--verify", "2"]
        + ["--input", '{"order": "{thread}"}', "--observe", "labs.graphs.shop:observe"],
        env=env,
    )

    assert done.returncode == 1  # no world declared: real kills, so nothing to --verify
    assert done.stderr == (
        "effectdrill: --verify 2: nothing to verify, no row was made by the snapshot engine "
        "(sync: no world declared (--world, or drill_world beside the observer): the drill "
        "cannot restore what the resume touches)\n"
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "durability sync: 9 crash points"
    assert lines[1].split() == "point saved ran on recovery charge receipt verdict".split()
    assert lines[2].split() == ["(clean", "1)", "(clean", "1)"]
    assert max(len(line) for line in lines) <= 120
    duplicated = [line for line in lines if "DUPLICATE" in line]
    assert len(duplicated) == 1 and duplicated[0].startswith("put_writes charge")
    assert duplicated[0].split()[-2:] == ["DUPLICATE", "charge"]
    assert lines[-1].startswith("summary: 9 crash points, ")
    assert list(temp_root.iterdir()) == []


def test_cli_json_on_the_approval_graph_reports_the_clean_run_repeating(tmp_path, temp_root):
    """--json, and the same run's --html opened in headless Chromium (what a reader sees)."""
    env = os.environ | {"APPROVAL_DB": str(tmp_path / "approval.sqlite")}
    page = tmp_path / "drill.html"
    done = run_command(
        [sys.executable, "-m", "effectdrill", "labs.graphs.approval:graph", "--json"]
        + ["--input", '{"refund": "{thread}"}', "--observe", "labs.graphs.approval:observe"]
        + ["--resume-with", "true", "--durability", "all", "--html", str(page)],
        env=env,
    )

    assert (done.returncode, done.stderr) == (1, "")
    *rows, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert SUMMARY_KEYS <= set(summary) and summary["summary"] is True
    assert summary["points"] == len(rows) and {r["durability"] for r in rows} == {
        "sync",
        "async",
        "exit",
    }
    assert summary["clean"] == {"request": 2, "notice": 1}  # the interrupt re-ran the request
    assert summary["repeated_in_clean_run"] == ["request"]  # made again by the node re-run
    assert all(FINDING_KEYS <= set(f) for f in summary["duplicates"])
    assert {f["effect"] for f in summary["duplicates"]} == {"request"}
    assert all(r["counts"]["notice"] == [1] for r in rows)

    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text
    dom = chromium_dom(page, tmp_path / "drill.png")  # the page as Chromium built it
    shown = [(r["mode"], r["point"], r["verdict"], r["counts"]) for r in dom["rows"]]
    assert shown == [
        (r["durability"], r["point"], r["verdict"], {e: c[0] for e, c in r["counts"].items()})
        for r in rows
    ]
    assert all(
        r["verdict_text"].split()[0] in (r["verdict"], r["verdict"].split("+")[0])
        for r in dom["rows"]
    )  # the word is in the cell, not only its colour
    assert dom["counts"]["crash points"] == summary["points"]
    assert dom["counts"]["duplicates"] == len(summary["duplicates"])
    assert dom["counts"]["missing"] == 0 and dom["counts"]["failed resumes"] == 0
    assert dom["clean"] == {mode: "request 2, notice 1" for mode in ("sync", "async", "exit")}
    assert "REPEATED request: request_refund re-ran it after an interrupt" in dom["text"]
    assert "labs.graphs.approval:graph --json" in dom["text"]  # the command, in the header
    from importlib.metadata import version

    assert version("langgraph") in dom["text"]
    assert (tmp_path / "drill.png").stat().st_size > 10_000  # looked at by hand: see the commit


def test_cli_with_context_and_postgres_checkpoints_and_an_async_graph_on_them(
    tmp_path, monkeypatch
):
    require_postgres()
    env = os.environ | {"CONTEXT_DB": str(tmp_path / "context.sqlite"), "PYTHONPATH": TESTS}
    monkeypatch.setenv("EFFECTS_DB", str(tmp_path / "effects.sqlite"))
    with TempPostgres() as pg:
        # async nodes: AsyncPostgresSaver, killed before aput / aput_writes
        async_report = effectdrill.drill(
            asyncgraph.build, {"thread": "{thread}"}, asyncgraph.observe, checkpoint_db=pg.url
        )
        done = run_command(
            [sys.executable, "-m", "effectdrill", f"{GRAPHS}.contextual:build", "--json"]
            + ["--input", '{"to": "{thread}"}', "--observe", f"{GRAPHS}.contextual:observe"]
            + ["--context", f"{GRAPHS}.contextual:make_context", "--checkpoint-db", pg.url],
            env=env,
        )
        import psycopg

        with psycopg.connect(pg.url) as conn:
            threads = conn.execute("SELECT COUNT(DISTINCT thread_id) FROM checkpoints").fetchone()

    assert (done.returncode, done.stderr) == (1, "")
    summary = json.loads(done.stdout.splitlines()[-1])
    duplicated = [(f["point"], f["effect"]) for f in summary["duplicates"]]
    assert duplicated == [("put_writes notify [sent]", "sent")]
    assert threads[0] == summary["points"] + 1 + len(async_report.rows) + 1  # clean, crashes
    assert [f["point"] for f in async_report.duplicates] == [
        "put_writes charge [branch:to:receipt, charged]"
    ]
    assert all(row.runs[0].reached for row in async_report.rows)


def test_the_library_and_cli_agree_on_a_clean_graph(tmp_path, monkeypatch):
    """A graph whose only effect is keyed: exit 0, report.ok, assert_clean passes."""
    monkeypatch.setattr(review, "DB_PATH", str(tmp_path / "review.sqlite"))
    report = effectdrill.drill(
        review.build, {"post": "{thread}"}, review.observe_drafts, resume_with="ok"
    )
    assert report.ok and report.assert_clean() is report
    assert report.table().endswith(
        "summary: 12 crash points, 0 duplicate, 0 missing, 0 failed resumes, clean run ok"
    )

    code = main(
        [f"{GRAPHS}.review:build", "--input", '{"post": "{thread}"}', "--resume-with", '"ok"']
        + ["--observe", f"{GRAPHS}.review:observe_drafts"]
    )
    assert code == 0


def test_assert_clean_raises_with_the_table(orders_db):
    report = drill_orders()
    with pytest.raises(AssertionError) as raised:
        report.assert_clean()
    assert "DUPLICATE charge" in str(raised.value) and "summary:" in str(raised.value)


BAD_INPUTS = {
    "no module": (["nosuch.module:graph"], "cannot import nosuch.module: ModuleNotFoundError"),
    "no attribute": ([f"{GRAPHS}.broken:nothing"], f"{GRAPHS}.broken has no nothing"),
    "not a graph": ([f"{GRAPHS}.broken:NOT_A_GRAPH"], "not a compiled LangGraph graph: str"),
    "bad json": ([f"{GRAPHS}.orders:build", "--input", "{order: 1}"], "--input is not valid JSON"),
    "resume-with neither": (
        [f"{GRAPHS}.orders:build", "--resume-with", "ok"],
        "--resume-with is neither JSON nor MODULE:FUNC: 'ok'",
    ),
    "expect not counts": (
        [f"{GRAPHS}.orders:build", "--expect", '{"charge": true}'],
        "expect must be a dict of effect name -> count",
    ),
    "observer raises": (
        [f"{GRAPHS}.orders:build", "--observe", f"{GRAPHS}.broken:observe_raises"],
        "the observer raised RuntimeError: the shop database is down",
    ),
    "observer list": (
        [f"{GRAPHS}.orders:build", "--observe", f"{GRAPHS}.broken:observe_list"],
        "the observer must return a dict of effect name -> count, not [1]",
    ),
    "observer text": (
        [f"{GRAPHS}.orders:build", "--observe", f"{GRAPHS}.broken:observe_text_counts"],
        "the observer must return a dict of effect name -> count, not {'charge': '1'}",
    ),
    "sqlite unopenable": (
        [f"{GRAPHS}.orders:build", "--checkpoint-db", "/nonexistent/folder/c.sqlite"],
        "cannot open the SQLite database /nonexistent/folder/c.sqlite: unable to open",
    ),
    "sqlite not a database": (
        [f"{GRAPHS}.orders:build", "--checkpoint-db", "{tmp}/notes.txt"],
        "cannot open the SQLite database {tmp}/notes.txt: file is not a database",
    ),
    "postgres unreachable": (
        [f"{GRAPHS}.orders:build", "--checkpoint-db", "postgresql://u:secret@127.0.0.1:1/x"],
        "cannot open the database postgresql://u:***@127.0.0.1:1/x: OperationalError",
    ),
    "in-memory": (
        [f"{GRAPHS}.orders:build", "--checkpoint-db", ":memory:"],
        "an in-memory checkpoint database dies with the killed process",
    ),
    "html not ours": (
        [f"{GRAPHS}.orders:build", "--html", "{tmp}/notes.txt"],
        "--html {tmp}/notes.txt exists and is not an effectdrill report: not overwritten",
    ),
    "html no folder": (
        [f"{GRAPHS}.orders:build", "--html", "/nonexistent/folder/r.html"],
        "--html /nonexistent/folder/r.html: no folder /nonexistent/folder",
    ),
    "repeat 0": ([f"{GRAPHS}.orders:build", "--repeat", "0"], "argument --repeat: must be"),
    "durability": ([f"{GRAPHS}.orders:build", "--durability", "never"], "argument --durability"),
    "context raises": (
        [f"{GRAPHS}.orders:build", "--context", f"{GRAPHS}.broken:observe_raises"],
        f"--context {GRAPHS}.broken:observe_raises raised TypeError",
    ),
}


GRAPH_FAILS = {
    "node fails": (
        [f"{GRAPHS}.broken:build", "--observe", f"{GRAPHS}.broken:observe_nothing"],
        "the graph failed in its clean run: node pick: ValueError: no stock for x",
    ),
    "no context": (
        [f"{GRAPHS}.contextual:build", "--input", '{"to": "{thread}"}']
        + ["--observe", f"{GRAPHS}.contextual:observe"],
        "the graph failed in its clean run: node notify: AttributeError: 'NoneType' object has "
        "no attribute 'db_path' (the graph takes a runtime context, Deps: give it with "
        "--context MODULE:FUNC, or context= in the library)",
    ),
}


@pytest.mark.parametrize("case", GRAPH_FAILS, ids=str)
def test_a_graph_failing_in_its_clean_run_is_exit_3_one_line_and_its_traceback_kept(
    case, orders_db, tmp_path, temp_root, capsys, monkeypatch
):
    """Not a usage mistake (2) nor a finding (1): CI tells the graph's own failure apart."""
    monkeypatch.setenv("CONTEXT_DB", str(tmp_path / "context.sqlite"))
    argv, message = GRAPH_FAILS[case]
    argv = (
        [*argv, "--input", '{"item": "x", "order": "{thread}"}'] if "--input" not in argv else argv
    )

    code = main(argv)

    err = capsys.readouterr().err
    assert code == 3
    assert err.count("\n") == 1 and err.startswith(f"effectdrill: {message} (its traceback: ")
    (log,) = temp_root.iterdir()  # nothing else left behind
    assert err.endswith(f"{log})\n")
    assert log.name.startswith("effectdrill-graph-failed-")
    assert "Traceback (most recent call last)" in log.read_text()
    assert_no_children()


def test_a_kept_traceback_goes_where_effectdrill_log_dir_says_else_to_the_temporary_folder(
    orders_db, tmp_path, temp_root, capsys, monkeypatch
):
    """EFFECTDRILL_LOG_DIR names the folder a failed graph's traceback is kept in (the lab's
    Docker drill: its /reports mount, since its /tmp is gone with the container); where no file
    can be made there, the temporary folder: a setting never loses the traceback."""
    argv = [*GRAPH_FAILS["node fails"][0], "--input", '{"item": "x", "order": "{thread}"}']
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("EFFECTDRILL_LOG_DIR", str(logs))
    assert main(argv) == 3
    (log,) = logs.iterdir()
    assert capsys.readouterr().err.endswith(f"(its traceback: {log})\n")
    monkeypatch.setenv("EFFECTDRILL_LOG_DIR", str(tmp_path / "no-such-folder"))
    assert main(argv) == 3
    (kept,) = temp_root.iterdir()
    assert capsys.readouterr().err.endswith(f"(its traceback: {kept})\n")
    assert "Traceback (most recent call last)" in kept.read_text()


@pytest.mark.fast
def test_the_labs_drill_names_the_command_that_reads_a_log_in_its_container():
    """Through Docker the path alone names a file inside a container: the line adds the
    command that reads it through the same service (compose.yaml's drill, its /reports)."""
    from labs import drill as labs_drill

    assert labs_drill.read_in_docker("/tmp/effectdrill-graph-failed-1.log") is None  # native
    assert labs_drill.read_in_docker("/reports/effectdrill-graph-failed-1.log") == (
        "read it: docker compose -p stateful-lab run --rm --entrypoint cat drill "
        "/reports/effectdrill-graph-failed-1.log"
    )
    import yaml

    drill = yaml.safe_load((ROOT / "compose.yaml").read_text("utf-8"))["services"]["drill"]
    assert drill["environment"]["EFFECTDRILL_LOG_DIR"] == labs_drill.REPORTS.rstrip("/")
    assert any(v.endswith(f":{labs_drill.REPORTS.rstrip('/')}") for v in drill["volumes"])


def test_a_bug_in_the_drill_is_exit_4_one_line_and_no_traceback_on_the_terminal(
    orders_db, temp_root, capsys, monkeypatch
):
    """The drill's own failure (here its table, made to raise as a bug would): one line that
    says so, the traceback in a file, never on the terminal."""
    import effectdrill.report

    def broken(self, width=None):
        raise TypeError("a bug of ours")

    monkeypatch.setattr(effectdrill.report.Report, "table", broken)
    argv = [f"{GRAPHS}.orders:build", "--input", '{"item": "x", "order": "{thread}"}']
    code = main([*argv, "--observe", f"{GRAPHS}.orders:observe"])

    out, err = capsys.readouterr()
    assert code == 4 and "Traceback" not in out + err
    assert err.startswith("effectdrill: a bug in effectdrill: TypeError: a bug of ours (the ")
    assert err.count("\n") == 1
    (log,) = temp_root.iterdir()
    assert f"{log}; please report it)" in err
    assert 'raise TypeError("a bug of ours")' in log.read_text()


@pytest.mark.parametrize("case", BAD_INPUTS, ids=str)
def test_bad_input_is_one_line_and_exit_2_with_nothing_left(
    case, orders_db, tmp_path, temp_root, capsys, monkeypatch
):
    monkeypatch.setenv("CONTEXT_DB", str(tmp_path / "context.sqlite"))
    (tmp_path / "notes.txt").write_text("not a database, " * 100)
    argv, message = BAD_INPUTS[case]
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    message = message.replace("{tmp}", str(tmp_path))
    defaults = {"--input": '{"item": "x", "order": "{thread}"}'}
    defaults["--observe"] = f"{GRAPHS}.orders:observe"
    for option, value in defaults.items():
        if option not in argv:
            argv = [*argv, option, value]

    code = main(argv)

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("effectdrill: "), err
    assert message in err
    assert "secret" not in err
    assert list(temp_root.iterdir()) == []
    assert (tmp_path / "notes.txt").read_text() == "not a database, " * 100
    assert_no_children()


def test_two_crash_children_run_side_by_side(tmp_path, monkeypatch):
    """The warm parent keeps two crash runs (each a chain of processes: the killed run, its
    resume) running at once (two cores). In sidebyside's graph, the first run to pass its gate
    waits for a second run's mark: one at a time, it would wait alone (and say so)."""
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("SIDE_DIR", str(tmp_path))
    report = effectdrill.drill(sidebyside.build, {"run": "{thread}"}, sidebyside.observe)
    assert not (tmp_path / "alone").exists(), "a crash child passed its gate alone"
    marked = {mark.name for mark in (tmp_path / "marks").iterdir()}
    assert len(marked) >= 2 and marked <= {run.thread for row in report.rows for run in row.runs}
    assert report.clean["sync"] == {"send": 1} and report.duplicates  # verdicts as ever
    assert_no_children()


def test_an_observer_failing_after_crash_runs_leaves_no_child_or_folder(orders_db, temp_root):
    calls = []

    def observe_then_fail(thread_id):
        calls.append(thread_id)
        if len(calls) > 5:  # clean run before/after, crash runs 1 and 2 before/after...
            raise OSError("disk gone")
        return orders_observe(thread_id)

    with pytest.raises(effectdrill.DrillError, match="the observer raised OSError: disk gone"):
        effectdrill.drill(orders.build, {"order": "order-{thread}"}, observe_then_fail)
    assert list(temp_root.iterdir()) == []
    assert_no_children()


def test_an_observer_counting_every_thread_is_refused(orders_db):
    def observe_all(thread_id):
        with orders.connect() as db:
            return {"charge": db.execute("SELECT COUNT(*) FROM effects").fetchone()[0]}

    fix = "fix the observer: count only the effects tagged with the thread id it is given"
    with pytest.raises(effectdrill.DrillError, match=fix):
        effectdrill.drill(orders.build, {"order": "order-{thread}"}, observe_all)


def test_a_saver_object_in_memory_is_refused(orders_db):
    from langgraph.checkpoint.memory import InMemorySaver

    with pytest.raises(effectdrill.DrillError, match="in-memory checkpoint database dies"):
        drill_orders(checkpoint_db=InMemorySaver())


@pytest.mark.fast
def test_a_postgres_url_without_the_postgres_saver_says_what_to_install(orders_db, monkeypatch):
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.postgres", None)  # not installed
    with pytest.raises(effectdrill.DrillError, match=r"pip install 'effectdrill\[postgres\]'"):
        drill_orders(checkpoint_db="postgresql://127.0.0.1:1/none")


def test_without_fork_it_says_posix_only(monkeypatch, capsys):
    monkeypatch.delattr(os, "fork")
    assert main(["x:y", "--input", "{}", "--observe", "x:y"]) == 2
    assert capsys.readouterr().err == (
        "effectdrill: effectdrill needs POSIX fork() and SIGKILL: on Windows run it under WSL "
        "or in a Linux container\n"
    )


def test_ctrl_c_exits_130_and_reaps_the_child(tmp_path, temp_root):
    """A real SIGINT to a drill whose crash child blocks: one line, 130, nothing left. The
    drill process also holds a thread nothing will stop, as CPython leaves one when the
    KeyboardInterrupt lands inside ThreadPoolExecutor._adjust_thread_count (LangGraph's
    executor, about one Ctrl-C in 30 under load): the interpreter's exit would join it forever."""
    env = os.environ | {"ORDERS_DB": str(tmp_path / "o.sqlite"), "TMPDIR": str(temp_root)}
    env["PYTHONPATH"] = TESTS
    script = (
        "import effectdrill.__main__ as m, sys, threading, time\n"
        "from effectdrill_graphs import orders\n"
        "import effectdrill.api as api, effectdrill.processes as d\n"
        "ready = open(sys.argv[1], 'w')\n"
        "real = d.fork_chain\n"
        "def fork_chain(*a):  # in the warm parent\n"
        "    ready.write('forking'); ready.flush()\n"
        "    return real(*a)\n"
        "crash_all = api.crash_all\n"
        "def stranding(*a):  # in the drill's own process\n"
        "    threading.Thread(target=threading.Event().wait, name='stranded').start()\n"
        "    return crash_all(*a)\n"
        "api.crash_all = stranding\n"
        "d.fork_chain = fork_chain\n"
        "sys.exit(m.main(sys.argv[2:]))\n"
    )
    ready = tmp_path / "ready"
    ready.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(ready), "effectdrill_graphs.orders:build"]
        + ["--input", '{"order": "{thread}"}', "--observe", "effectdrill_graphs.orders:observe"]
        + ["--repeat", "50"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from tools.local import wait_until

    try:
        wait_until(lambda: proc.poll() is not None or ready.read_text(), 60, "the drill to fork")
    finally:
        if proc.poll() is not None:
            pytest.fail(f"the drill ended before Ctrl-C: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=180)  # a hang guard: the stranded thread hung it here
    except subprocess.TimeoutExpired:
        proc.kill()  # a hang fails the test and leaves no process behind
        proc.communicate()
        raise

    assert (proc.returncode, err, out) == (130, "effectdrill: interrupted\n", "")
    assert list(temp_root.iterdir()) == []


def test_the_fixture_drills_a_graph_in_three_lines(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "shop.sqlite"))
    monkeypatch.setattr(review, "DB_PATH", str(tmp_path / "review.sqlite"))
    pytester.makepyfile(
        test_user_project="""
        from labs.graphs import shop
        from effectdrill_graphs import review

        def test_the_shop(effect_drill):
            effect_drill(shop.graph, {"order": "{thread}"}, shop.observe).assert_clean()

        def test_the_reviews(effect_drill):
            effect_drill(
                review.build, {"post": "{thread}"}, review.observe_drafts, resume_with=1
            ).assert_clean()
        """
    )
    installed = any(e.name == "effect_drill" for e in entry_points(group="pytest11"))
    result = pytester.runpytest_inprocess(*([] if installed else ["-p", "effectdrill.plugin"]))

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*put_writes charge *DUPLICATE charge*", "*summary: 9 crash*"])


def test_a_read_only_checkout_installs_effectdrill_its_plugin_and_command(tmp_path):
    """pip install from a checkout that cannot be written: nothing is written into it, and
    the installed `effectdrill` command runs."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    subprocess.run(["cp", "-r", str(ROOT / "effectdrill"), str(source)], check=True)
    subprocess.run(
        ["find", str(source), "-name", "__pycache__", "-prune", "-exec", "rm", "-r", "{}", "+"]
    )
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    subprocess.run(["chmod", "-R", "a-w", str(source)], check=True)
    try:
        installed = run_command(
            [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--no-compile"]
            + ["--target", str(tmp_path / "site"), str(source)],
            cwd=tmp_path,
        )
        assert installed.returncode == 0, installed.stderr
        assert sorted(p.relative_to(source) for p in source.rglob("*")) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(source)], check=True)
    site = tmp_path / "site"
    (info,) = site.glob("effectdrill-*.dist-info")
    metadata = (info / "METADATA").read_text()
    points = (info / "entry_points.txt").read_text()
    assert {p.name for p in site.iterdir()} == {"effectdrill", info.name, "bin"}
    assert (site / "effectdrill" / "README.md").is_file()
    assert "Requires-Dist: langgraph-checkpoint-sqlite" in metadata
    assert "[pytest11]\neffect_drill=effectdrill.plugin" in points
    assert "[console_scripts]\neffectdrill=effectdrill.__main__:main" in points
    command = run_command(
        [str(site / "bin" / "effectdrill"), "--help"], env=os.environ | {"PYTHONPATH": str(site)}
    )
    assert command.returncode == 0 and command.stdout.startswith("usage: effectdrill ")


# helpers


def chromium_dom(page, png):
    """The rows, counts and clean run of the report as Chromium's DOM holds them (and its
    picture in png, from the same launch)."""
    from html.parser import HTMLParser

    class Reader(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.counts, self.clean, self.text = [], {}, {}, []
            self.mode = self.row = self.cell = self.count = self.clean_mode = None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            classes = (attrs.get("class") or "").split()
            if tag == "section" and "mode" in classes:
                self.mode = attrs["data-mode"]
            elif tag == "tr" and "row" in classes:
                self.row = {"mode": self.mode, "verdict": attrs["data-verdict"], "cells": {}}
            elif tag == "tr" and "data-mode" in attrs and self.mode is None:
                self.clean_mode = attrs["data-mode"]
                self.clean[self.clean_mode] = ""
            elif tag == "td" and self.row is not None:
                self.cell = (
                    ("effect", attrs["data-effect"]) if "data-effect" in attrs else classes[0]
                )
                self.row["cells"][self.cell] = ""
            elif tag == "div" and "count" in classes:
                self.count = attrs["data-count"]

        def handle_endtag(self, tag):
            if tag == "tr" and self.row is not None:
                self.rows.append(self.row)
            if tag == "tr":
                self.row = self.clean_mode = None
            self.cell = None if tag == "td" else self.cell
            self.count = None if tag == "div" else self.count

        def handle_data(self, data):
            self.text.append(data)
            if self.row is not None and self.cell is not None:
                self.row["cells"][self.cell] += data
            elif self.clean_mode is not None and self.lasttag == "td":
                self.clean[self.clean_mode] += data
            if self.count is not None and data.strip().isdigit():
                self.counts[self.count] = int(data)

    reader = Reader()
    flags = ["--dump-dom", "--window-size=1400,1800", f"--screenshot={png}"]
    reader.feed(chromium(page.as_uri(), *flags))
    rows = [
        {
            "mode": r["mode"],
            "point": r["cells"]["point"],
            "verdict": r["verdict"],
            "verdict_text": r["cells"]["verdict"],
            "counts": {c[1]: int(v) for c, v in r["cells"].items() if isinstance(c, tuple)},
        }
        for r in reader.rows
    ]
    text = " ".join(" ".join(reader.text).split())
    return {"rows": rows, "counts": reader.counts, "clean": reader.clean, "text": text}


def assert_no_children():
    """Every child the drill forked was reaped (waitpid: no child processes at all)."""
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_the_benchmark_prints_this_tree_and_the_last_commit_side_by_side():
    done = run_command([sys.executable, "-m", "tools.bench_drill", "--runs", "1"])

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"# bench_drill: this tree against HEAD \(\w+\); load [\d. ]+", lines[0])
    assert re.match(r"  whole CLI drill, s +[\d.]+ +[\d.]+ +[\d.]+x  <= 1.5 (ok|OVER)$", lines[2])
    assert re.match(
        r"  crash run \(median\), ms +[\d.]+ +[\d.]+ +[\d.]+x  <= 50 (ok|OVER)$", lines[4]
    )
    assert re.match(r"  CPU per crash run, children, ms +[\d.]+ +[\d.]+$", lines[8])
    figures = json.loads(lines[-1])
    assert figures["in_process"]["this_tree"]["points"] == 11  # 3 for the input, 2 per node
    mine = figures["in_process"]["this_tree"]
    assert 0 < mine["children_sys_ms"] < mine["children_cpu_ms"] and mine["children_faults"] > 0


def test_the_benchmark_against_a_commit_older_than_the_drill_prints_this_tree_alone():
    """make bench BASELINE=2a0ed38 (the README's Performance figures; the lab's first commit,
    which has no effectdrill): this tree's figures, "-" in the baseline's column, valid JSON."""
    done = run_command(
        [sys.executable, "-m", "tools.bench_drill", "--runs", "1", "--baseline", "2a0ed38"]
    )

    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[1] == "# 2a0ed38 has no effectdrill (it came later): this tree's figures only"
    assert re.match(r"  whole CLI drill, s +[\d.]+ +- +-  <= 1.5 (ok|OVER)$", lines[3])
    figures = json.loads(lines[-1])
    assert figures["in_process"]["this_tree"]["points"] == 11
    assert "baseline" not in figures["in_process"]


def test_a_graph_that_expects_the_platforms_store_says_so_and_drills_with_one(
    tmp_path, monkeypatch, capsys, temp_root
):
    monkeypatch.setenv("EFFECTS_DB", str(tmp_path / "effects.sqlite"))
    argv = [f"{GRAPHS}.memory:build", "--input", '{"thread": "{thread}"}']
    argv += ["--observe", f"{GRAPHS}.memory:observe"]

    assert main(argv) == 3  # the graph failed in its clean run, and the drill says why
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the graph reads a store" in err and "--store sqlite" in err
    for log in temp_root.iterdir():  # its traceback, kept for the user
        log.unlink()

    assert main([*argv, "--store", "sqlite", "--json"]) == 0  # the saved memory is found again
    *rows, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert summary["clean"] == {"memory": 1} and summary["duplicates"] == []
    assert rows and all(r["counts"]["memory"] == [1] for r in rows)
    assert list(temp_root.iterdir()) == []  # the store's file went with the drill
