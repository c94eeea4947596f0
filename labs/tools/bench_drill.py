"""Benchmark effectdrill on the three-node shop graph (labs/graphs/shop.py): medians.

1. one durability mode (sync), the whole drill: about 10 crash points (target < 2 s);
2. --durability all --repeat 5 (target < 15 s);
3. the drill's saver wrapper, per saver call: the same put and put_writes calls, captured from
   a clean run, replayed on LangGraph's SqliteSaver and on the drill's recording subclass of
   it, side by side; and a whole clean run through each.

    python -m labs.tools.bench_drill [--runs N] [--all-runs N] [--repeat N] [--calls N]

Everything lives in a temporary folder (the shop's SHOP_DB and the checkpoints), removed after.
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time

from workflow import Parser

RUNS = 10  # drills of one mode: their median
ALL_RUNS = 3  # drills of every mode with --repeat: their median (each takes seconds)
REPEAT = 5  # runs per crash point in the every-mode drill, as the target says
CALLS = 2000  # replays of each captured saver call per saver: enough for a stable median


def main(argv=None):
    args = parse_args(argv)
    folder = tempfile.mkdtemp(prefix="bench-drill-")
    os.environ["SHOP_DB"] = os.path.join(folder, "shop.sqlite")
    try:
        bench(args, folder)
    except KeyboardInterrupt:
        print("bench_drill: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def bench(args, folder):
    import effectdrill
    from labs.graphs import shop

    order = {"order": "{thread}"}
    times, report = timed(args.runs, lambda: effectdrill.drill(shop.graph, order, shop.observe))
    print(
        f"one mode (sync), {len(report.rows)} crash points: median {median_s(times)} "
        f"over {args.runs} drills"
    )
    if args.all_runs:
        times, report = timed(
            args.all_runs,
            lambda: effectdrill.drill(
                shop.graph, order, shop.observe, durability="all", repeat=args.repeat
            ),
        )
        print(
            f"--durability all --repeat {args.repeat}, {len(report.rows)} crash points, "
            f"{sum(len(r.runs) for r in report.rows)} crash runs: median {median_s(times)} "
            f"over {args.all_runs} drills"
        )
    plain, wrapped, per_run = saver_calls(shop.graph, folder, args.calls)
    print(
        f"saver call (put and put_writes of a clean run): median {plain:.1f} us on "
        f"SqliteSaver, {wrapped:.1f} us through the drill's wrapper ({wrapped - plain:+.1f} us)"
    )
    print(
        f"clean run of the shop ({per_run['calls']} saver calls): median "
        f"{per_run['plain']:.2f} ms on SqliteSaver, {per_run['wrapped']:.2f} ms wrapped"
    )


# helpers


def timed(runs, action):
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return times, result


def median_s(times):
    return f"{statistics.median(times):.2f} s"


def saver_calls(graph, folder, calls):
    """Median microseconds per saver call, plain and wrapped, and per clean run (ms)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from effectdrill.core import Recorder, recording

    captured = []

    class Capture(SqliteSaver):
        def put(self, *args):
            captured.append(("put", args))
            return super().put(*args)

        def put_writes(self, *args):
            captured.append(("put_writes", args))
            return super().put_writes(*args)

    def saver(cls, name):
        conn = sqlite3.connect(os.path.join(folder, name), check_same_thread=False)
        conn.execute("PRAGMA synchronous=OFF")  # as the drill opens its own
        made = cls(conn)
        made.setup()
        return made

    graph.copy(update={"checkpointer": saver(Capture, "capture.sqlite")}).invoke(
        {"order": "bench"}, {"configurable": {"thread_id": "bench"}}, durability="sync"
    )
    plain = saver(SqliteSaver, "plain.sqlite")
    wrapped = saver(recording(SqliteSaver), "wrapped.sqlite")
    wrapped.recorder = Recorder()
    per_call = {"plain": [], "wrapped": []}
    for _ in range(calls):
        for name, target in (("plain", plain), ("wrapped", wrapped)):  # side by side
            for method, args in captured:
                start = time.perf_counter()
                getattr(target, method)(*args)
                per_call[name].append(time.perf_counter() - start)
        wrapped.recorder = Recorder()  # its list of labels would grow without end
    per_run = {"plain": [], "wrapped": []}
    for i in range(max(10, calls // 20)):
        for name, target in (("plain", plain), ("wrapped", wrapped)):  # side by side
            config = {"configurable": {"thread_id": f"{name}-{i}"}}
            copy = graph.copy(update={"checkpointer": target})
            start = time.perf_counter()
            copy.invoke({"order": f"{name}-{i}"}, config, durability="sync")
            per_run[name].append(time.perf_counter() - start)
        wrapped.recorder = Recorder()
    per_run = {name: statistics.median(values) * 1000 for name, values in per_run.items()}
    per_run["calls"] = len(captured)
    micro = {name: statistics.median(values) * 1e6 for name, values in per_call.items()}
    return micro["plain"], micro["wrapped"], per_run


def count(minimum):
    def parse(text):
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}: {text!r}")
        return int(text)

    return parse


def parse_args(argv):
    parser = Parser(prog="python -m labs.tools.bench_drill")
    parser.add_argument("--runs", type=count(1), default=RUNS)
    parser.add_argument("--all-runs", type=count(0), default=ALL_RUNS, help="0: skip")
    parser.add_argument("--repeat", type=count(1), default=REPEAT)
    parser.add_argument("--calls", type=count(1), default=CALLS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
