"""Benchmark effectdrill against a git ref (default HEAD): the whole CLI drill of a 4-node sync
graph, and the median crash run, this tree and the baseline side by side (part of make bench).

1. `effectdrill GRAPH ...` as a user types it (a fresh interpreter: imports, the clean run,
   every crash run), wall seconds, median of --runs, alternating the trees;
2. per crash run (fork, the killed child, a fresh saver, the resume, the observer): the time
   of an in-process drill after its clean run, over its crash runs, the median of --runs
   drills in each tree (wall time: this tree resumes one run while the next child runs),
   and where its CPU goes (getrusage): the drill's own process (its clean run left out), the
   warm parent and its crash children (forks, runs up to the kill, exits), of which system
   time (mostly the children's copy-on-write page faults), and those page faults. A baseline
   with no effectdrill (older than the drill) shows "-".

    python -m tools.bench_drill [--runs N] [--baseline REF]

Targets (the issue's, on a quiet 2-core machine): at most 1.5 s for the whole CLI drill, 50 ms
per crash run, and a crash run at most 1.5 times a clean invoke of the same graph (a warm
`invoke` on a new thread through a SqliteSaver, timed just before each drill). The load
average is printed with the figures: a busy machine is slower. The graph (below) and its
effects live in a temporary folder, removed after; the baseline is `git archive REF` unpacked
there (tools/bench.py's export_commit). Exit codes: 0 measured, 2 bad arguments, 4 no
baseline, 130 Ctrl-C.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commandline import Parser
from exitcodes import EXIT_INTERRUPTED
from tools.bench import NoBaseline, baseline_commit, export_commit
from tools.local import ROOT

RUNS = 5  # CLI drills per tree, and in-process drills per tree: their medians
CPU_FIGURES = [("drill_cpu_ms", 1000), ("children_cpu_ms", 1000), ("children_sys_ms", 1000),
               ("children_faults", 1)]  # fmt: skip
EXIT_NO_BASELINE = 4

GRAPH = '''
"""prepare -> reserve -> charge -> notify: four sync nodes, one unkeyed effect (charge)."""
import os, sqlite3
from contextlib import closing
from typing import TypedDict
from langgraph.graph import END, START, StateGraph


class Order(TypedDict, total=False):
    order: str
    step: int


def effect(name, order, key=None):
    with closing(sqlite3.connect(os.environ["BENCH_EFFECTS"])) as db, db:
        db.execute("CREATE TABLE IF NOT EXISTS e (name, ord, key, UNIQUE (name, ord, key))")
        db.execute("INSERT OR IGNORE INTO e VALUES (?, ?, ?)", (name, order, key))


def node(name, key):
    def run(state: Order):
        effect(name, state["order"], key)
        return {"step": state.get("step", 0) + 1}
    run.__name__ = name
    return run


def build():
    builder = StateGraph(Order)
    names = [("prepare", "k"), ("reserve", "k"), ("charge", None), ("notify", "k")]
    for name, key in names:
        builder.add_node(name, node(name, key))
    builder.add_edge(START, "prepare")
    for (a, _), (b, _) in zip(names, names[1:]):
        builder.add_edge(a, b)
    builder.add_edge("notify", END)
    return builder.compile()


def observe(thread):
    with closing(sqlite3.connect(os.environ["BENCH_EFFECTS"])) as db:
        db.execute("CREATE TABLE IF NOT EXISTS e (name, ord, key, UNIQUE (name, ord, key))")
        rows = db.execute("SELECT name, COUNT(*) FROM e WHERE ord = ? GROUP BY name", (thread,))
        return dict(rows.fetchall())
'''

IN_PROCESS = """
import json, os, resource, sqlite3, statistics, sys, time
import effectdrill
try:
    from effectdrill.runs import Plan
except ImportError:  # a tree from before core.py was split
    from effectdrill.core import Plan
import bench_graph
from langgraph.checkpoint.sqlite import SqliteSaver
conn = sqlite3.connect(os.environ["BENCH_EFFECTS"] + ".checkpoints", check_same_thread=False)
conn.execute("PRAGMA synchronous=OFF")  # as the drill's own saver
saver = SqliteSaver(conn)
saver.setup()
graph = bench_graph.build().copy(update={"checkpointer": saver})
invokes = []
def clean_invoke():  # what a crash run is measured against: one invoke, warm, on a new thread
    times = []
    for _ in range(3):
        thread = f"clean-{len(invokes)}-{len(times)}"
        start = time.perf_counter()
        graph.invoke({"order": thread}, {"configurable": {"thread_id": thread}}, durability="sync")
        times.append(time.perf_counter() - start)
    invokes.append(statistics.median(times))
clean, clean_cpu = [], []
real = Plan.clean_run
def clean_run(self, *args):
    start, cpu = time.perf_counter(), time.process_time()
    try:
        return real(self, *args)
    finally:
        clean.append(time.perf_counter() - start)
        clean_cpu.append(time.process_time() - cpu)
Plan.clean_run = clean_run
def usage():  # CPU s of this process, CPU s and system s and page faults of its reaped children
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, kids.ru_stime,
            kids.ru_minflt)
whole, per_run, cpu = [], [], []
for _ in range(int(sys.argv[1])):
    clean_invoke()  # before each drill: the same moment's load
    before, start = usage(), time.perf_counter()
    report = effectdrill.drill(bench_graph.build, {"order": "{thread}"}, bench_graph.observe)
    whole.append(time.perf_counter() - start)
    used = [b - a for a, b in zip(before, usage())]
    rows = len(report.rows)
    per_run.append((whole[-1] - clean[-1]) / rows)
    cpu.append([(used[0] - clean_cpu[-1]) / rows, used[1] / rows, used[2] / rows, used[3] / rows])
print(json.dumps({"per_run": per_run, "whole": whole, "points": len(report.rows),
                  "invoke": invokes, "cpu": cpu}))
"""


def main(argv=None):
    parser = Parser(prog="python -m tools.bench_drill", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="drills per tree (default 5)")
    parser.add_argument("--baseline", default="HEAD", metavar="REF")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be 1 or more, not {args.runs}")
    try:
        sha, short = baseline_commit(args.baseline)
        with tempfile.TemporaryDirectory(prefix="bench-drill-") as tmp:
            figures = measure_drills(Path(tmp), args.baseline, sha, short, args.runs)
    except NoBaseline as error:
        print(f"bench_drill: {error}", file=sys.stderr)
        return EXIT_NO_BASELINE
    except KeyboardInterrupt:
        print("bench_drill: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_drill_figures(figures)
    return 0


def measure_drills(tmp, ref, sha, short, runs):
    baseline = export_commit(sha, tmp / "baseline", f"{ref} ({short})")
    (tmp / "bench_graph.py").write_text(GRAPH)
    trees = {"this_tree": ROOT, "baseline": baseline}
    figures = {"baseline": {"ref": ref, "short": short}, "runs": runs, "cli_s": {}}
    if not (baseline / "effectdrill" / "__init__.py").is_file():  # a commit older than the drill
        del trees["baseline"]
        figures["baseline"]["no_drill"] = True
    figures["load_before"] = os.getloadavg()
    times = {tree: [] for tree in trees}
    for attempt in range(runs):  # alternate the trees: a busy moment hits both alike
        for tree, folder in trees.items():
            times[tree].append(cli_seconds(folder, tmp, f"{tree}-{attempt}"))
    figures["cli_s"] = {tree: statistics.median(t) for tree, t in times.items()}
    figures["in_process"] = {}
    for tree, folder in trees.items():
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, str(runs)],
            cwd=folder,
            env=env_for(folder, tmp, f"{tree}-lib"),
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(done.stdout.splitlines()[-1])
        figures["in_process"][tree] = {
            "points": got["points"],
            "crash_run_ms": 1000 * statistics.median(got["per_run"]),
            "fastest_crash_run_ms": 1000 * min(got["per_run"]),  # the drill least disturbed
            "drill_s": statistics.median(got["whole"]),
            "clean_invoke_ms": 1000 * statistics.median(got["invoke"]),
            # per drill, its crash runs against the invoke timed just before it
            "crash_per_invoke": statistics.median(
                run / invoke for run, invoke in zip(got["per_run"], got["invoke"], strict=True)
            ),
            # per crash run, medians: CPU ms of the drill's process (its clean run left out),
            # of the warm parent and its crash children, of which system time, and their faults
            **{
                name: statistics.median(c[i] for c in got["cpu"]) * scale
                for i, (name, scale) in enumerate(CPU_FIGURES)
            },
        }
    figures["load_after"] = os.getloadavg()
    return figures


def cli_seconds(folder, tmp, name):
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "effectdrill", "bench_graph:build"]
        + ["--input", '{"order": "{thread}"}', "--observe", "bench_graph:observe"],
        cwd=folder,
        env=env_for(folder, tmp, name),
        capture_output=True,
        check=False,  # exit 1: the unkeyed charge repeats, as it should
    )
    return time.perf_counter() - start


def env_for(folder, tmp, name):
    return os.environ | {
        "PYTHONPATH": os.pathsep.join([str(folder), str(tmp)]),
        "BENCH_EFFECTS": str(tmp / f"{name}.sqlite"),
    }


def print_drill_figures(figures):
    short = figures["baseline"]["short"]
    load = " ".join(f"{x:.2f}" for x in figures["load_before"])
    print(f"# bench_drill: this tree against {figures['baseline']['ref']} ({short}); load {load}")
    if figures["baseline"].get("no_drill"):
        print(f"# {short} has no effectdrill (it came later): this tree's figures only")
    mine = figures["in_process"]["this_tree"]
    theirs = figures["in_process"].get("baseline") or dict.fromkeys(mine, math.nan)
    cli = figures["cli_s"]["this_tree"], figures["cli_s"].get("baseline", math.nan)
    print(f"{'4-node sync graph':<40}{'this tree':>11}{short:>11}{'ratio':>9}  target")
    rows = [
        ("whole CLI drill, s", *cli, 1.5),
        ("in-process drill, s", mine["drill_s"], theirs["drill_s"], None),
        ("crash run (median), ms", mine["crash_run_ms"], theirs["crash_run_ms"], 50),
        ("clean invoke (median), ms", mine["clean_invoke_ms"], theirs["clean_invoke_ms"], None),
        ("crash run / clean invoke", mine["crash_per_invoke"], theirs["crash_per_invoke"], 1.5),
    ]
    for name, ours, base, target in rows:
        mark = "" if target is None else f"  <= {target:g}" + (" ok" if ours <= target else " OVER")
        ratio = f"{ours / base:>8.2f}x" if base == base else f"{'-':>9}"  # NaN: no baseline
        print(f"  {name:<38}{ours:>11.3f}{figure(base)}{ratio}{mark}")
    for name, key in [
        ("CPU per crash run, drill, ms", "drill_cpu_ms"),
        ("CPU per crash run, children, ms", "children_cpu_ms"),
        ("  of which system time, ms", "children_sys_ms"),
        ("children's page faults per crash run", "children_faults"),
    ]:
        ours, base = mine[key], theirs.get(key, math.nan)  # an older tree's has none
        print(f"  {name:<38}{ours:>11.3f}{figure(base)}")
    fastest = mine["fastest_crash_run_ms"], theirs["fastest_crash_run_ms"]
    print(f"  crash run (fastest drill), ms{'':<9}{fastest[0]:>11.3f}{figure(fastest[1])}")
    points = theirs["points"] if theirs["points"] == theirs["points"] else "-"
    print(f"  crash points: {mine['points']} here, {points} in {short}")
    after = " ".join(f"{x:.2f}" for x in figures["load_after"])
    print(f"# load average after: {after} (2 cores: above 2 the figures are the machine's)")
    print(json.dumps(figures))


def figure(value):
    """A baseline's figure in its column, or "-" where the baseline has none (NaN)."""
    return f"{value:>11.3f}" if value == value else f"{'-':>11}"


if __name__ == "__main__":
    sys.exit(main())
