"""Where a snapshot drill's CPU goes, per crash point (docs/performance.md).

    python -m tools.bench_breakdown [--runs N]

For each graph of tools/bench_engines.py, --runs snapshot drills with two resumers, each
timed from inside its processes (wrappers set in this process before the drill forks, so its
processes inherit them; each writes a line to a file, read back after the drill):

- resume: one resume's process, from its fork to just before its exit (getrusage in it), and
  of that its invoke, its world's restore and its observer's call;
- clean run: the warm parent's CPU for it and its invoke's process;
- prime: the warm parent's run of its own two-node graph (processes.prime_langgraph);
- drill: the drill's own process (the graph built, its database, the rows);
- forks and exits: the rest (the warm parent's forks, each process's exit);
- fork + exit alone: a child forked from this process that exits at once, timed apart.

Medians over the runs, in ms of CPU per crash point, beside a clean invoke's CPU (as
tools/bench_engines measures it, three invokes before each drill). The load average is printed
with the figures.
"""

import argparse
import json
import os
import resource
import statistics
import tempfile
import time

from tools.bench_engines import Invoker, cases, input_maker


def cpu(who=resource.RUSAGE_SELF):
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def write_note(log, **figures):
    with open(log, "a") as out:
        out.write(json.dumps(figures) + "\n")


def instrument(log):
    """Wrap the functions timed (in this process: every process of a drill inherits them)."""
    from effectdrill import processes, runs, snapshot

    prime = processes.prime_langgraph

    def timed_prime(db):
        start = cpu()
        prime(db)
        write_note(log, kind="prime", cpu=cpu() - start)

    processes.prime_langgraph = timed_prime
    run_chain = processes.run_chain

    def timed_run_chain(*args, **kwargs):  # the warm parent's clean runs (processes.HERE)
        start, kids = cpu(), cpu(resource.RUSAGE_CHILDREN)
        try:
            return run_chain(*args, **kwargs)
        finally:
            used = cpu() - start + cpu(resource.RUSAGE_CHILDREN) - kids
            write_note(log, kind="clean", cpu=used)

    processes.run_chain = timed_run_chain
    resume = snapshot.snap_resume_chain
    parts = {}

    def part(owner, name, label):
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            start = cpu()
            try:
                return real(*args, **kwargs)
            finally:
                parts[label] = parts.get(label, 0) + cpu() - start

        setattr(owner, name, timed)

    part(runs.Plan, "one_invoke", "invoke")
    part(runs.Plan, "counts", "observe")

    def timed_resume(plan, *args):
        parts.clear()  # what this process inherited is not its own
        world = plan.world
        restore = world.restore

        def timed_restore(image):
            start = cpu()
            restore(image)
            parts["restore"] = parts.get("restore", 0) + cpu() - start

        world.restore = timed_restore
        try:
            return resume(plan, *args)
        finally:
            write_note(log, kind="resume", cpu=cpu(), **parts)  # a new process: cpu() is its own

    snapshot.snap_resume_chain = timed_resume  # run_chain looks it up at each call


def fork_and_exit(count=20):
    """CPU of a fork whose child exits at once, parent's and child's (this process's size)."""
    start, kids = cpu(), cpu(resource.RUSAGE_CHILDREN)
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return (cpu() - start + cpu(resource.RUSAGE_CHILDREN) - kids) / count


def timed_drill(case, log):
    import effectdrill

    graph, input, observe, world, options = case
    open(log, "w").close()
    start, kids, wall = cpu(), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    report = effectdrill.drill(graph, input, observe, engine="snapshot", world=world, **options)
    wall = time.perf_counter() - wall
    mine, total = cpu() - start, cpu() - start + cpu(resource.RUSAGE_CHILDREN) - kids
    with open(log) as lines:
        notes = [json.loads(line) for line in lines]
    points = len(report.rows)
    resumes = [n for n in notes if n["kind"] == "resume"]
    sums = {kind: sum(n["cpu"] for n in notes if n["kind"] == kind) for kind in ("prime", "clean")}
    figures = {
        "total": total,
        "wall": wall,
        "resume": sum(n["cpu"] for n in resumes),
        **{part: sum(n.get(part, 0) for n in resumes) for part in ("invoke", "restore", "observe")},
        **sums,
        "drill": mine,
    }
    figures["forks and exits"] = total - mine - figures["resume"] - sums["prime"] - sums["clean"]
    return {key: value / points for key, value in figures.items()}, points, len(resumes)


ORDER = ["total", "wall", "resume", "invoke", "restore", "observe", "clean", "prime", "drill"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.bench_breakdown", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    from effectdrill import processes

    processes.CHILDREN_AT_ONCE = 2
    log = tempfile.mktemp(prefix="bench-breakdown-")
    instrument(log)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# bench_breakdown: load {load}, {args.runs} runs, 2 resumers, ms per crash point")
    for name, case in cases(tempfile.mkdtemp(prefix="bench-breakdown-")).items():
        graph, input, *_ = case
        invoker, runs = Invoker(graph, input_maker(input)), []
        for _ in range(args.runs):
            invoker.sample()  # beside each drill: the same load
            runs.append(timed_drill(case, log))
        invoker.sample()
        invoke = invoker.medians()[1]
        alone = fork_and_exit()
        cells = [
            f"{key} {statistics.median(r[0][key] for r in runs) * 1e3:.1f}"
            for key in [*ORDER, "forks and exits"]
        ]
        print(f"{name}: {runs[0][1]} points ({runs[0][2]} resumed), clean invoke "
              f"{invoke * 1e3:.1f}; " + ", ".join(cells) +
              f"; fork + exit alone {alone * 1e3:.1f}")  # fmt: skip
    print(f"# load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    os.unlink(log)


if __name__ == "__main__":
    main()
