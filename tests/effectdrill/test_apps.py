"""effectdrill on the shapes real applications take (tests/effectdrill_graphs/apps.py, agent.py):
it never crashes on a graph LangGraph runs, and drills each to the verdicts its shape implies.
Real forks, real SIGKILLs, real SQLite files, a scripted chat model (no network)."""

import pytest
from effectdrill_graphs import apps

import effectdrill
from effectdrill.__main__ import main
from effectdrill.introspect import needs_async, uses_store

CHAT = {"messages": [["user", "{thread}"]]}


@pytest.fixture(autouse=True)
def effects_db(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFECTS_DB", str(tmp_path / "effects.sqlite"))


def flagged(report):
    return {row.point: row.verdict for row in report.rows if row.verdict != "ok"}


def test_tools_with_fallbacks_behind_a_breakpoint_drill_to_their_one_duplicate(capsys):
    """The support bot's shape: `ToolNode(...).with_fallbacks(...)`, whose attribute probe
    raises NameError (it read as a traceback before the first run), and `interrupt_before`:
    the drill resumes past the breakpoint, and only a kill after the booking, before the
    tools' writes are saved, books twice."""
    chat = '{"messages": [["user", "{thread}"]]}'
    observe = "effectdrill_graphs.apps:observe"
    code = main(["effectdrill_graphs.apps:support", "--input", chat, "--observe", observe])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err, out.err
    report = effectdrill.drill(apps.support, CHAT, apps.observe)
    assert report.clean == {"sync": {"booking": 1}}
    assert flagged(report) == {"put_writes tools [branch:to:assistant, messages]": "DUPLICATE"}


def test_an_agent_run_inside_an_async_node_repeats_its_tools_call_only():
    """The triager's shape: async nodes, one of which runs a prebuilt agent as a function. The
    inner agent saves as a subgraph of that node (`in comment`): its tool's Send is the one
    state whose resume comments again; a kill before the outer node's writes resumes the inner
    agent from its own saved steps (LangGraph >= 1.2.16)."""
    report = effectdrill.drill(apps.triager, CHAT, apps.observe)
    assert report.clean == {"sync": {"comment": 1}}
    assert flagged(report) == {
        "put_writes tools (Send) [branch:to:agent, messages] in comment": "DUPLICATE"
    }
    (row,) = [row for row in report.rows if row.verdict != "ok"]
    assert row.node == "comment/tools"  # the inner step, named inside its outer node
    assert row.tools == ["tool post_comment, call call-post_comment"]
    assert "comment/tools" in row.runs[0].ran  # what the recovery ran, inner steps included
    assert any("node comment/tools, tool post_comment" in fix for fix in row.as_json()["fix"])


def test_a_tool_run_through_a_runnable_lambda_is_a_node_like_any():
    report = effectdrill.drill(apps.lambda_tool, CHAT, apps.observe)
    assert flagged(report) == {"put_writes price [messages]": "DUPLICATE"}


class Hostile:
    """A runnable-like object every attribute read of which raises (not AttributeError)."""

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} for you")


def test_every_probe_of_a_users_object_tolerates_what_it_raises():
    from langgraph.graph import START, StateGraph

    builder = StateGraph(dict)
    builder.add_node("hostile", lambda state: state)
    builder.add_edge(START, "hostile")
    graph = builder.compile()
    graph.nodes["hostile"].bound = Hostile()  # reached by the walk, read by every probe
    assert needs_async(graph) is False and uses_store(graph) is False
    assert needs_async(apps.support()) is False  # the NameError of with_fallbacks' __getattr__


GUARDED = {"thread": "{thread}", "customer": "c-1"}


def test_a_resume_starts_cold_as_a_restarted_process_does():
    """A module-level 'already sent' guard: the drill's resumes run in a process that imported
    the graph and never ran it, so the guard is empty there, as after a real restart, and the
    kill after the send, before welcome's writes are saved, shows the second welcome."""
    from effectdrill_graphs import guarded

    report = effectdrill.drill(guarded.build, GUARDED, guarded.observe)
    assert report.clean == {"sync": {"welcome": 1}}
    assert flagged(report) == {"put_writes welcome [done]": "DUPLICATE"}


def test_the_clean_runs_resume_after_an_interrupt_starts_cold_too():
    """The node sends, then asks: answered in a new process, it runs again from its first line
    with an empty guard and sends again, as a server restarted between the two would."""
    from effectdrill_graphs import guarded

    report = effectdrill.drill(guarded.build_asking, GUARDED, guarded.observe, resume_with=True)
    assert report.clean_findings() == {"welcome": "welcome re-ran it after an interrupt"}
