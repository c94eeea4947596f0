"""effectdrill on the oldest and the newest LangGraph of the range pyproject.toml declares.

The oldest lives in a second venv, .venv-drill-oldest, installed from its own hashed lock
(requirements-drill-oldest.txt: the range's lower bounds); the newest is the project's .venv
(requirements.txt). Both drill the same test graphs, side by side in two processes, and must give
the rows each graph's shape implies; where LangGraph itself changed between them (a resumed
subgraph, fixed in 1.2.16) the difference is the one LangGraph's fix explains.
"""

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
from effectdrill_graphs import orders
from effectdrill_graphs import outbound as trips
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tools.local import ROOT

OLDEST = ROOT / ".venv-drill-oldest" / "bin" / "python"
MAKE_OLDEST = "make drill-oldest"
DRILLED = ("langgraph", "langgraph-checkpoint-sqlite")  # what effectdrill imports
# Run by each venv's Python: the versions, then each graph's rows, as one JSON line apiece.
DRIVER = """
import json, os, sys
from importlib.metadata import version
import effectdrill
from effectdrill_graphs import nested, orders, outbound

print(json.dumps({name: version(name) for name in sys.argv[1:]}))
for name, graph, run, observe, options in (
    ("orders", orders.build, {"order": "{thread}"}, orders.observe, {}),
    ("nested", nested.build, {"order": "{thread}"}, nested.observe, {}),
    ("outbound", outbound.build, {"trip": "{thread}"}, "http", {}),
):
    report = effectdrill.drill(graph, run, observe, **options)
    print(json.dumps({"graph": name, "rows": [row.as_json() for row in report.rows]}))
"""


@pytest.mark.fast
def test_the_oldest_lock_holds_the_ranges_lower_bounds_and_the_main_lock_is_inside():
    declared = declared_ranges()
    oldest, newest = pins("requirements-drill-oldest.txt"), pins("requirements.txt")
    for name in DRILLED:
        (lower,) = [s.version for s in declared[name] if s.operator == ">="]
        assert Version(oldest[name]) == Version(lower), name
        assert Version(newest[name]) in declared[name], name


def test_the_oldest_and_newest_langgraph_drill_the_test_graphs_alike(receiver, tmp_path):
    if not OLDEST.exists():
        reason = (
            f"DRILL OLDEST TIER SKIPPED: no {OLDEST.parent.parent.name} (make it: {MAKE_OLDEST})"
        )
        if os.environ.get("LAB_REQUIRE_DRILL_OLDEST") == "1":
            pytest.fail(reason.replace("SKIPPED", "REQUIRED (LAB_REQUIRE_DRILL_OLDEST=1)"))
        pytest.skip(reason)
    found = {}
    runs = {}
    for which, python in (("oldest", OLDEST), ("newest", sys.executable)):
        data = tmp_path / which
        data.mkdir()
        env = os.environ | {
            "PYTHONPATH": str(ROOT / "tests"),
            "API_URL": receiver.url,
            "TMPDIR": str(data),
            **{f"{g}_DB": str(data / f"{g}.sqlite") for g in ("ORDERS", "NESTED")},
        }
        runs[which] = subprocess.Popen(
            [str(python), "-c", DRIVER, *DRILLED],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for which, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        versions, *graphs = [json.loads(line) for line in out.splitlines()]
        found[which] = versions, {g["graph"]: g["rows"] for g in graphs}

    (old_versions, old), (new_versions, new) = found["oldest"], found["newest"]
    assert old_versions == pins("requirements-drill-oldest.txt", DRILLED)
    assert new_versions == pins("requirements.txt", DRILLED)
    # An unkeyed effect repeats at the kill before its node's writes, on both: the node runs
    # again (the drill holds the next checkpoint back there: langgraph#8039).
    for rows in (old["orders"], new["orders"]):
        expected = {(writes(n), e) for e, n in orders.UNKEYED.items()}
        assert duplicated(rows) == expected and {p for p, _ in expected} <= rerun(rows), rows
    for rows in (old["outbound"], new["outbound"]):  # the requests notify and remind resend
        unkeyed = {writes(node) for node, key in trips.KEYS.items() if key != "thread"}
        assert {p for p, _ in duplicated(rows)} == unkeyed and unkeyed <= rerun(rows)
    # The subgraph's effect repeats before its writes are saved, on both...
    in_child = (f"{writes('effect')} in child", "sent")  # nested.py: child runs effect
    assert in_child in duplicated(old["nested"]) and duplicated(new["nested"]) == {in_child}
    # ...and on LangGraph before 1.2.16 after too: a resumed subgraph re-ran its saved nodes.
    assert duplicated(old["nested"]) - {in_child} == {("put step 1 in child", "sent")}
    for graph in ("orders", "outbound"):  # alike, row for row
        assert [r["point"] for r in old[graph]] == [r["point"] for r in new[graph]], graph
        assert shape(old[graph]) == shape(new[graph]), graph


# helpers


def declared_ranges():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = {}
    for requirement in tomllib.loads(text)["project"]["dependencies"]:
        name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", requirement.replace(" ", "")).groups()
        found[name] = SpecifierSet(spec)
    return found


def pins(lock, names=None):
    text = (ROOT / lock).read_text(encoding="utf-8")
    found = dict(re.findall(r"^([a-z0-9_.-]+)==([^ ;\\\n]+)", text, re.M))
    return found if names is None else {name: found[name] for name in names}


def duplicated(rows):
    """(crash point without its channel list, effect) of each effect counted above the clean run."""
    return {
        (re.sub(r" \[[^]]*\]", "", row["point"]), effect)
        for row in rows
        for effect, counts in row["counts"].items()
        if max(counts) > row["clean"].get(effect, 0)
    }


def writes(node):
    """A crash point that saves `node`'s writes, without its channel list (see duplicated)."""
    return f"put_writes {node}"


def rerun(rows):
    """The put_writes points (see writes) whose kill left their node to run again on recovery."""
    points = {re.sub(r" \[[^]]*\]", "", row["point"]): row for row in rows}
    return {
        point
        for point, row in points.items()
        if point.startswith("put_writes ")
        and any(point.split()[1] in ran for ran in row["ran_on_recovery"])
    }


def shape(rows):
    """The crash points and what each found. Not `saved`: before the first checkpoint, what a
    kill finds saved varies run to run (the input's writes go to a background thread)."""
    return [(r["point"], r["counts"], r["verdict"]) for r in rows]
