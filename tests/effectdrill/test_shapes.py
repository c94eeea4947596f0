"""effectdrill on the shapes LangGraph graphs take: a loop, Send, nodes side by side, the
functional API, async nodes, several interrupts, a subgraph, the prebuilt agent. Real forks,
real SIGKILLs, real SQLite files.

Each expectation is reasoned from where LangGraph 1.2.24 saves (langgraph/pregel/_loop.py):
a run's input is one `put step -1`, the input's `put_writes __start__ [...]` and `put step 0`;
then each step N is the put_writes of each of its tasks (PregelLoop.put_writes, submitted to
the BackgroundExecutor as each task finishes) and `put step N+1` (_put_checkpoint). A task
runs again on resume exactly when its own writes were not saved; an @task call's writes are
its cached result, so it runs again only when its entrypoint does and its result was lost.
Under sync, a step saving several put_writes side by side is drilled as every set of them a
kill can leave unsaved (the others saved, every task of the step run): with k writes, 2**k - 1
rows, and an unkeyed effect of each task in the set happens once more.
"""

import json
import os
import sys
import threading
from importlib.metadata import entry_points

import pytest
from effectdrill_graphs import (
    agent,
    asking,
    asyncgraph,
    functional,
    handler,
    jokes,
    loop,
    nested,
    parallel,
    retrying,
    subapproval,
)

import effectdrill
from effectdrill import savers
from effectdrill.__main__ import main
from tools.local import ROOT, run_command

GRAPHS = "effectdrill_graphs"
TESTS = str(ROOT / "tests")
INPUT = {"thread": "{thread}"}
pytest_plugins = ["pytester"]

INPUT_POINTS = ["put step -1", "put step 0"]  # and the input's put_writes __start__ between


@pytest.fixture(autouse=True)
def effects_db(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFECTS_DB", str(tmp_path / "effects.sqlite"))
    monkeypatch.setenv("NESTED_DB", str(tmp_path / "nested.sqlite"))


def verdicts(report):
    return {row.point: row.verdict for row in report.rows}


def counts(report, effect):
    return {row.point: row.counts(effect)[0] for row in report.rows}


FIRST, SECOND = "put_writes agent [branch:to:tools, turn]", "put_writes agent [turn]"
LOOP_POINTS = [  # 3 for the input, then agent, tools, agent: a put_writes and a put each
    "put step -1",
    "put_writes __start__ [branch:to:agent, thread]",
    "put step 0",
    FIRST,
    "put step 1",
    "put_writes tools [branch:to:agent]",
    "put step 2",
    SECOND,  # the second turn routes to END: no branch write
    "put step 3",
]


def assert_the_loops_rows(report):
    """The agent loop's rows, in step order; agent's call repeated where its writes were not
    saved, and only there."""
    assert report.clean == {"sync": {"model_call": 2, "lookup": 1}}
    assert report.repeated_in_clean_run == []
    assert [row.point for row in report.rows] == LOOP_POINTS
    assert {f["point"] for f in report.duplicates} == {FIRST, SECOND}
    assert all(f["count"] == 3 and f["clean"] == 2 for f in report.duplicates)
    assert all(row.counts("lookup") == [1] for row in report.rows)  # keyed on the turn


def test_an_agent_loops_two_model_calls_are_its_baseline_not_a_failure():
    report = effectdrill.drill(loop.build, INPUT, loop.observe)
    assert_the_loops_rows(report)

    keyed = effectdrill.drill(loop.build, {**INPUT, "keyed": True}, loop.observe)
    assert keyed.ok and keyed.assert_clean() is keyed
    assert keyed.table().endswith("0 failed resumes, clean run ok")


def test_a_checkpoint_saved_before_its_steps_writes_changes_no_row(monkeypatch):
    """LangGraph saves a task's writes and the next checkpoint in the background, in no fixed
    order (langgraph#8039): now and then the checkpoint's save begins first. Forced here every
    time (each of agent's writes waits until a later checkpoint's save has begun), in the clean
    run and in every crash run, the rows are those of the order LangGraph submits them, the
    writes first: the same points, in step order, the same duplicates."""
    begun, puts = threading.Condition(), [0]
    put, put_writes = savers.Recording.put, savers.Recording.put_writes

    def put_first(self, config, *rest):
        with begun:
            puts[0] += 1
            begun.notify_all()
        return put(self, config, *rest)

    def writes_after(self, config, writes, task_id, task_path=""):
        if task_path.endswith(", agent"):
            with begun:
                seen = puts[0]
                begun.wait_for(lambda: puts[0] > seen, timeout=10)  # a guard: none may come
        return put_writes(self, config, writes, task_id, task_path)

    monkeypatch.setattr(savers.Recording, "put", put_first)  # the drill's forks inherit them
    monkeypatch.setattr(savers.Recording, "put_writes", writes_after)
    assert_the_loops_rows(effectdrill.drill(loop.build, INPUT, loop.observe))


def test_expected_counts_judge_the_clean_run_when_given():
    report = effectdrill.drill(
        loop.build, {**INPUT, "keyed": True}, loop.observe, expect={"model_call": 1}
    )
    assert report.repeated_in_clean_run == ["model_call"]
    assert not report.ok
    assert report.table().endswith("the clean run repeated model_call (counted 2, expected 1)")
    with pytest.raises(effectdrill.DrillError, match="expect must be a dict"):
        effectdrill.drill(loop.build, INPUT, loop.observe, expect={"model_call": "2"})


def test_sends_are_named_by_node_and_index_and_every_unsaved_set_is_a_row():
    report = effectdrill.drill(jokes.build, INPUT, jokes.observe)

    assert report.clean == {"sync": {"joke": 3, "pick": 1}} and report.repeated_in_clean_run == []
    rows = {row.point: row for row in report.rows}
    one = "put_writes generate_joke (Send {} of 3) [branch:to:best_joke, jokes] (others saved)"
    for index in (1, 2, 3):  # one Send's writes lost: that Send's joke again
        assert rows[one.format(index)].counts("joke") == [4]
        assert rows[one.format(index)].runs[0].ran == [
            f"generate_joke (Send {index} of 3)",
            "best_joke",
        ]
    pair = "put_writes generate_joke (Send 1 of 3) + generate_joke (Send 3 of 3) (others saved)"
    assert rows[pair].counts("joke") == [5]
    everything = "put_writes " + " + ".join(f"generate_joke (Send {i} of 3)" for i in (1, 2, 3))
    assert rows[everything + " (none saved)"].counts("joke") == [6]
    assert len(report.rows) == 3 + 2 + 7 + 3  # input; topics; 2**3 - 1 sets; put, best, put
    assert len(report.duplicates) == 7 and {f["effect"] for f in report.duplicates} == {"joke"}
    assert rows["put step 2"].verdict == "ok"  # all three saved: none runs again
    assert not any("__pregel_push" in point for point in rows)

    keyed = effectdrill.drill(jokes.build, {**INPUT, "keyed": True}, jokes.observe)
    assert keyed.ok, keyed.table()


def test_three_nodes_side_by_side_each_repeat_only_when_their_own_writes_are_lost():
    report = effectdrill.drill(parallel.build, INPUT, parallel.observe)

    assert report.clean == {"sync": {"notify": 3}} and report.ok is False
    assert report.repeated_in_clean_run == []
    held = [row for row in report.rows if row.point.endswith(("others saved)", "none saved)"))]
    assert len(held) == 7
    for row in held:  # the nodes named in the row are the ones whose writes were lost
        lost = [c for c in parallel.CHANNELS if f" {c} " in f" {row.point.split(' (')[0]} "]
        assert row.counts("notify") == [3 + len(lost)], row.point
        assert row.runs[0].ran == [*sorted(lost), "join"]
    assert verdicts(report)["put step 2"] == "ok"


def test_an_entrypoints_task_repeats_only_if_its_result_and_the_entrypoint_are_both_lost():
    report = effectdrill.drill(functional.workflow, INPUT, functional.observe)

    assert report.clean == {"sync": {"charge": 1, "email": 1}}
    dup = {f["point"] for f in report.duplicates}
    assert dup == {
        "put_writes charge (@task) + workflow (others saved)",
        "put_writes charge (@task) + email (@task) + workflow (none saved)",
    }
    # The review's false DUPLICATE: the entrypoint's own writes lost, its tasks' results saved.
    row = next(r for r in report.rows if r.point.startswith("put_writes workflow [__end__"))
    assert row.verdict == "ok" and row.runs[0].ran == ["workflow"]
    assert len(report.rows) == 1 + 7 + 1  # put -1, the 7 sets of 3 writes, put 0


def test_async_nodes_and_an_async_entrypoint_are_drilled_through_the_async_api():
    report = effectdrill.drill(asyncgraph.build, INPUT, asyncgraph.observe)
    assert [f["point"] for f in report.duplicates] == [
        "put_writes charge [branch:to:receipt, charged]"
    ]
    assert len(report.rows) == 9 and not report.failed
    assert all(row.runs[0].reached for row in report.rows)

    report = effectdrill.drill(functional.workflow_async, INPUT, functional.observe)
    assert {f["point"] for f in report.duplicates} == {
        "put_writes charge_later (@task) + workflow_async (others saved)",
        "put_writes charge_later (@task) + email_later (@task) + workflow_async (none saved)",
    }


def test_a_node_that_asks_twice_repeats_its_first_lines_in_the_clean_run_too():
    report = effectdrill.drill(asking.build_twice, INPUT, asking.observe, resume_with="ok")

    # draft is written before the first question; each answer re-runs the node from there.
    assert report.clean == {"sync": {"draft": 3, "submit": 1}}
    assert report.repeated_in_clean_run == ["draft"]
    assert "draft (ask_twice re-ran it after an interrupt)" in report.summary_line()
    assert report.ok is False


def test_two_interrupts_at_once_are_answered_by_a_function_of_them(capsys):
    report = effectdrill.drill(
        asking.build_together, INPUT, asking.observe, resume_with=asking.answer
    )
    assert report.clean == {"sync": {"submit": 1}} and report.repeated_in_clean_run == []
    assert [f["point"] for f in report.duplicates] == ["put_writes submit [__no_writes__]"]

    with pytest.raises(effectdrill.DrillError, match="2 interrupts are pending at once"):
        effectdrill.drill(asking.build_together, INPUT, asking.observe, resume_with="x")
    code = main(
        [f"{GRAPHS}.asking:build_together", "--input", json.dumps(INPUT), "--json"]
        + ["--observe", f"{GRAPHS}.asking:observe", "--resume-with", f"{GRAPHS}.asking:answer"]
    )
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 1 and [f["point"] for f in summary["duplicates"]] == [
        "put_writes submit [__no_writes__]"
    ]


def test_a_subgraphs_rows_show_its_own_saved_step():
    report = effectdrill.drill(nested.build, {"order": "{thread}"}, nested.observe)
    row = next(r for r in report.rows if r.point == "put_writes effect [done] in child")
    assert row.runs[0].saved == "step 0: child [step 0: effect]"
    assert row.runs[0].ran == ["child/effect", "child"]
    assert row.verdict == "DUPLICATE" and row.counts("sent") == [2]


def test_cli_tables_fit_120_columns_with_repeats_and_a_gate_passes(tmp_path):
    env = os.environ | {"PYTHONPATH": TESTS}
    done = run_command(
        [sys.executable, "-m", "effectdrill", f"{GRAPHS}.jokes:build", "--repeat", "3"]
        + ["--input", json.dumps(INPUT), "--observe", f"{GRAPHS}.jokes:observe"],
        env=env,
    )
    assert done.returncode == 1 and done.stderr == ""
    assert max(map(len, done.stdout.splitlines())) <= 120
    duplicated = [line for line in done.stdout.splitlines() if "DUPLICATE" in line]
    assert len(duplicated) == 7 and all("DUPLICATE joke in 3" in line for line in duplicated)

    done = run_command(
        [sys.executable, "-m", "effectdrill", f"{GRAPHS}.loop:build"]
        + ["--input", json.dumps({**INPUT, "keyed": True}), "--observe", f"{GRAPHS}.loop:observe"]
        + ["--expect", '{"model_call": 2}'],
        env=env,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_the_fixture_passes_a_graph_whose_clean_run_counts_more_than_one(pytester):
    pytester.makepyfile(
        test_user_project="""
        from effectdrill_graphs import jokes, loop

        def test_the_keyed_jokes(effect_drill):
            effect_drill(jokes.build, {"thread": "{thread}", "keyed": True}, jokes.observe
                ).assert_clean()

        def test_the_unkeyed_loop(effect_drill):
            effect_drill(loop.build, {"thread": "{thread}"}, loop.observe).assert_clean()

        def test_the_keyed_loop_calls_its_model_twice(effect_drill):
            effect_drill(loop.build, {"thread": "{thread}", "keyed": True}, loop.observe,
                expect={"model_call": 2}).assert_clean()
        """
    )
    installed = any(e.name == "effect_drill" for e in entry_points(group="pytest11"))
    result = pytester.runpytest_inprocess(*([] if installed else ["-p", "effectdrill.plugin"]))
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*DUPLICATE model_call*"])


def test_the_prebuilt_agents_tool_calls_are_named_by_their_send():
    """create_react_agent (v2) runs each tool call as a Send of `tools`: agent, 2 tool calls side
    by side, agent again. The model is called twice in a clean run; each tool call repeats
    only when its own writes are lost, each model call where `agent`'s are."""
    report = effectdrill.drill(agent.build, {"messages": [["user", "{thread}"]]}, agent.observe)

    assert report.clean == {"sync": {"model_call": 2, "lookup": 2}}
    assert report.repeated_in_clean_run == []
    lookups = {f["point"]: f["count"] for f in report.duplicates if f["effect"] == "lookup"}
    send = "put_writes tools (Send {} of 2) [branch:to:agent, messages] (others saved)"
    assert lookups == {
        send.format(1): 3,
        send.format(2): 3,
        "put_writes tools (Send 1 of 2) + tools (Send 2 of 2) (none saved)": 4,
    }
    models = [f["point"] for f in report.duplicates if f["effect"] == "model_call"]
    assert models == ["put_writes agent [__pregel_tasks, messages]", "put_writes agent [messages]"]
    assert len(report.rows) == 3 + 2 + 3 + 3


@pytest.mark.parametrize("build", [handler.build, handler.build_async])
def test_a_state_langgraph_waits_for_ends_at_once_with_no_verdict(build, monkeypatch):
    """An error handler's input (the failed task's error) is saved, and LangGraph waits for it
    before the handler runs: holding that save back cannot make the row's state, so the child
    ends as soon as LangGraph waits on it (not at the hold deadline, made short here so that a
    wait would show as "held") and the row says so, with no counts and no verdict. An async
    graph's child sees it too: its event loop waits with nothing to wake it.

    Not always, under sync: Pregel.stream's runner (PregelRunner.tick, langgraph/pregel/
    _runner.py) wakes from concurrent.futures.wait when the failed task's future is set, which
    is before its done-callback commits the error writes (Future.set_exception notifies
    waiters, then runs callbacks), so schedule_error_handler (_loop.py) may find no save to
    wait for and run the handler first: then the state is reached, and the row is a row."""
    import effectdrill.kill

    monkeypatch.setattr(effectdrill.kill, "HOLD_DEADLINE_S", 3.0)
    report = effectdrill.drill(build, INPUT, handler.observe)

    waited_on = [
        "put_writes send [__error__, __error_source_node__] (others saved)",
        "put_writes send (error handler) + send (none saved)",
    ]
    unreached = [row for row in report.rows if row.verdict == "not reached"]
    assert {row.point for row in unreached} <= set(waited_on)
    if build is handler.build_async:  # its runner commits before it looks: no race
        assert [row.point for row in unreached] == waited_on
    assert not any(run.saved.endswith("(held 3 s)") for row in report.rows for run in row.runs)
    assert all(
        run.saved == "point not reached" and run.counts == {} for r in unreached for run in r.runs
    )
    assert all(row.counts("sent") == [] and not row.duplicates() for row in unreached)
    raced = [row for row in report.rows if row.point in waited_on and row not in unreached]
    assert all(row.runs[0].reached and row.duplicates() for row in raced)  # reached: a row
    assert report.unreached == [{"durability": "sync", "point": r.point} for r in unreached]
    assert (
        report.table()
        .splitlines()[-1]
        .endswith(f"{len(unreached)} not reached, clean run ok" if unreached else "clean run ok")
    )
    assert_cells_whole(report)  # "__error_handler__send, send" is wider than its column
    # The handler's own writes, lost: it runs again (sent happened once, in the failed node).
    assert [f["point"] for f in report.duplicates if f["point"] not in waited_on] == [
        "put_writes send (error handler) [recovered] (others saved)",
        "put step 1",
    ]


def test_a_retry_that_repeats_an_effect_is_flagged_in_the_clean_run_without_expect():
    """RetryPolicy runs a node again in-process: its first attempt's effect, made again by the
    second, is the node's repeat (LangGraph's retry log says which task it retries)."""
    report = effectdrill.drill(retrying.build, INPUT, retrying.observe)

    assert report.clean["sync"]["notice"] == 2  # one per attempt, no crash
    assert report.clean_findings() == {"notice": "notify re-ran it on a retry, by its RetryPolicy"}
    assert not report.ok
    keyed = effectdrill.drill(retrying.build, {**INPUT, "keyed": True}, retrying.observe)
    assert keyed.clean["sync"]["notice"] == 1 and keyed.ok


def test_a_repeat_in_a_subgraph_is_pinned_on_its_node():
    report = effectdrill.drill(subapproval.build, INPUT, subapproval.observe, resume_with=True)
    assert report.clean_findings() == {"sent": "review/confirm re-ran it after an interrupt"}


@pytest.mark.parametrize("build", [subapproval.build, subapproval.build_async])
def test_a_repeat_is_pinned_on_its_node_however_late_the_stream_is_read(build, monkeypatch):
    """Effects are counted in the task that made them, as it ends, not when its result is read
    off LangGraph's stream: read after the whole invoke ran (the latest a reader can be), the
    subgraph's repeat is still confirm's, and the retry's still notify's."""
    stream, astream = effectdrill.runs.Plan.stream, effectdrill.runs.Plan.astream

    def late(self, *args, **kwargs):  # every event of the invoke read once it has ended
        return iter(list(stream(self, *args, **kwargs)))

    async def alate(self, *args, **kwargs):
        for chunk in [chunk async for chunk in astream(self, *args, **kwargs)]:
            yield chunk

    monkeypatch.setattr(effectdrill.runs.Plan, "stream", late)
    monkeypatch.setattr(effectdrill.runs.Plan, "astream", alate)
    report = effectdrill.drill(build, INPUT, subapproval.observe, resume_with=True)
    assert report.clean_findings() == {"sent": "review/confirm re-ran it after an interrupt"}
    if build is subapproval.build:  # and a retry's attempts (once: a sync graph)
        retried = effectdrill.drill(retrying.build, INPUT, retrying.observe)
        assert retried.clean_findings() == {
            "notice": "notify re-ran it on a retry, by its RetryPolicy"
        }


def test_rows_of_a_subgraph_drill_carry_their_threads():
    report = effectdrill.drill(subapproval.build, INPUT, subapproval.observe, resume_with=True)
    assert report.unreached == []  # the subgraph's saves inside a held step go through
    rows = [row.as_json() for row in report.rows]
    assert all(len(r["threads"]) == 1 and r["threads"][0].startswith("drill-") for r in rows)
    assert len({r["threads"][0] for r in rows}) == len(rows)  # each row its own thread
    assert len({r["point"] for r in rows}) == len(rows)  # no two rows share a label
    assert_cells_whole(report)


def assert_cells_whole(report):
    """The table's cells wrap at spaces only: every word of every cell is whole in it."""
    from effectdrill.report import ran_cell

    tokens = set(report.table().split())
    for row in report.rows:
        cells = [row.point, row.runs[0].saved, ran_cell(row.runs[0].ran)]
        assert all(word in tokens for cell in cells for word in cell.split()), cells
