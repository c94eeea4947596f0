"""effectdrill's two engines, per crash point, against a clean invoke of the same graph.

    python -m tools.bench_engines [--runs N]

For each graph (tools/bench_drill.py's 4-node chain, a Send fan-out of 3 with its held sets,
the lab's shop in ledger mode) and each engine (kill, snapshot) with one and two resumers side
by side (effectdrill.processes.CHILDREN_AT_ONCE): the whole in-process drill's wall time and
CPU time (this process and every process it forked, getrusage), divided by its crash points:
the clean run and the forks are in it. The clean invoke: the same graph, warm, in this
process, on a new thread, through a SqliteSaver on a file in WAL mode with synchronous=OFF and
durability="sync", as the drill's own saver; three of them before each drill, so that both
sides meet the same load. The four drills of a run follow each other, run after run. Medians
of --runs (of all the invokes, for the invoke); the load average is printed.
"""

import argparse
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.bench_drill import GRAPH
from tools.local import ROOT


def usage():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Invoker:
    """A warm invoke on a new thread, the drill's saver settings: each sample() times a few,
    after a first one (lazy imports) that is not kept."""

    def __init__(self, build, input_of):
        from langgraph.checkpoint.sqlite import SqliteSaver

        from effectdrill.api import compiled

        folder = tempfile.mkdtemp()
        self.conn = sqlite3.connect(os.path.join(folder, "c.sqlite"), check_same_thread=False)
        self.conn.execute("PRAGMA synchronous=OFF")
        saver = SqliteSaver(self.conn)
        saver.setup()  # journal_mode=WAL
        self.graph = compiled(build).copy(update={"checkpointer": saver})
        self.input_of, self.walls, self.cpus, self.made = input_of, [], [], 0
        self.invoke()

    def invoke(self):
        self.made += 1
        thread = f"clean-{self.made}-{time.monotonic_ns()}"
        config = {"configurable": {"thread_id": thread}}
        start, cpu = time.perf_counter(), time.process_time()
        self.graph.invoke(self.input_of(thread), config, durability="sync")
        return time.perf_counter() - start, time.process_time() - cpu

    def sample(self, count=3):
        for _ in range(count):
            wall, cpu = self.invoke()
            self.walls.append(wall)
            self.cpus.append(cpu)

    def medians(self):
        return statistics.median(self.walls), statistics.median(self.cpus)


def drill_once(case, engine, resumers):
    import effectdrill
    from effectdrill import processes

    processes.CHILDREN_AT_ONCE = resumers
    graph, input, observe, world, options = case
    start, cpu = time.perf_counter(), usage()
    report = effectdrill.drill(graph, input, observe, engine=engine, world=world, **options)
    wall, used = time.perf_counter() - start, usage() - cpu
    engines = {row.engine for row in report.rows}
    return wall / len(report.rows), used / len(report.rows), len(report.rows), engines


def cases(folder):
    sys.path[:0] = [str(ROOT / "tests"), folder]
    Path(folder, "bench_graph.py").write_text(GRAPH)
    for name in ("BENCH_EFFECTS", "EFFECTS_DB", "SHOP_DB"):
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        os.environ[name] = os.path.join(folder, name, "effects.sqlite")
    import bench_graph
    from effectdrill_graphs import jokes

    from effectdrill import SqliteWorld
    from labs.graphs import shop

    return {
        "chain of 4": (bench_graph.build, {"order": "{thread}"}, bench_graph.observe,
                       SqliteWorld(env="BENCH_EFFECTS"), {}),
        "Send x3": (jokes.build, {"thread": "{thread}"}, jokes.observe,
                    SqliteWorld(env="EFFECTS_DB"), {}),
        "shop ledger": (shop.graph, {"order": "{thread}", "mode": "ledger"}, shop.observe,
                        SqliteWorld(env="SHOP_DB"), {}),
    }  # fmt: skip


def input_maker(value):
    from effectdrill.runs import with_thread

    return lambda thread: with_thread(value, thread)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.bench_engines", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="bench-engines-")
    print(
        f"# bench_engines: load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.runs} runs"
    )
    print("graph        | points | invoke ms wall/cpu | engine   | resumers | ms/point wall/cpu"
          " | x invoke wall/cpu")  # fmt: skip
    ratios = {}
    configs = [(engine, resumers) for engine in ("kill", "snapshot") for resumers in (1, 2)]
    for name, case in cases(folder).items():
        graph, input, *_ = case
        invoker = Invoker(graph, input_maker(input))
        runs = {config: [] for config in configs}
        for _ in range(args.runs):  # interleaved, each beside invokes of its moment
            for engine, resumers in configs:
                invoker.sample()
                runs[engine, resumers].append(drill_once(case, engine, resumers))
        invoker.sample()
        walls, cpus = invoker.medians()
        invoker.conn.close()
        for (engine, resumers), figures in runs.items():
            wall = statistics.median(f[0] for f in figures)
            cpu = statistics.median(f[1] for f in figures)
            points, made = figures[0][2], "+".join(sorted(figures[0][3]))
            ratios.setdefault((engine, resumers), []).append((wall / walls, cpu / cpus))
            print(
                f"{name:12} | {points:6} | {walls * 1e3:6.1f} / {cpus * 1e3:6.1f}   "
                f"| {made:8} | {resumers:8} | {wall * 1e3:6.1f} / {cpu * 1e3:6.1f}   "
                f"| {wall / walls:4.2f}x / {cpu / cpus:4.2f}x"
            )
    for (engine, resumers), pairs in ratios.items():
        wall = statistics.median(p[0] for p in pairs)
        cpu = statistics.median(p[1] for p in pairs)
        print(f"# median over graphs: {engine}, {resumers} resumer(s): {wall:.2f}x wall, "
              f"{cpu:.2f}x CPU a clean invoke per crash point")  # fmt: skip
    print(f"# load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
