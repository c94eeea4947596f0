"""Random kills: SIGKILL safe-mode runs from outside at a random moment, recover, count tickets.

The drill kills the workflow at the boundaries we thought of. Here the kill comes from
another process, at a moment drawn at random, so it can land anywhere: inside a node, in
the middle of a checkpoint write, between the receiver's commit and the node's return.
Every run is then resumed until it prints `done`, and the receiver must hold exactly one
ticket per run.

Where the kill can land: a workflow process lives ~0.7 s here, but the graph itself (both
nodes, the request and the checkpoints) takes only ~5-10 ms of it; the rest is importing
langgraph and shutting down. So the moment is drawn from the first KILL_WINDOW_S after the
process prints its first event (`prepare`: the graph runs and its input is saved). Kills
before that point would only test "start again", which the drill's "exit" row covers.
`--mode naive` is the control: the same kills then leave duplicate tickets.

    python -m labs.tools.chaos --runs N [--seed S] [--mode safe|naive|node-uuid] [--workers N]

The seed fixes each run's kill offset; where an offset lands still depends on the machine's
timing, so a replay covers the same offsets, not necessarily the same outcomes.
The last line is one JSON object: {"runs", "operations", "tickets", "duplicates", ...}.
Exit codes: 0 one ticket per run; 1 duplicates or a run that did not finish;
2 bad arguments; 3 the lab could not run.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from labs.tools.drill import LabError, LocalLab, Parser, events
from labs.tools.local import ROOT, run_workflow

KILL_WINDOW_S = 0.015  # seconds after the first event: a bit longer than the graph's
#                        ~5-10 ms here, so some kills land after `done` (the clean path)
MAX_RECOVERIES = 3  # resumes per run before it counts as unfinished; one is enough
START_TIMEOUT_S = 60  # seconds for a workflow process to print its first event
EXIT_OK, EXIT_FOUND, EXIT_NO_LAB = 0, 1, 3  # and 2 for bad arguments (Parser)


def kill_at_random(env, start_args, offset_s):
    """Start a run; SIGKILL it offset_s after its first event -> (killed, last event seen)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "workflow.py"), *start_args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watchdog = threading.Timer(START_TIMEOUT_S, proc.kill)  # a hung start must not hang us
    watchdog.start()
    with proc:
        first = proc.stdout.readline()  # blocks until the graph runs, or the process exits
        watchdog.cancel()
        try:
            proc.wait(offset_s)  # the random delay; returns early if the run ends first
        except subprocess.TimeoutExpired:
            proc.kill()
        printed = first + proc.stdout.read()
    if proc.returncode != -signal.SIGKILL:
        return False, "finished first"
    seen = events(printed)
    return True, seen[-1] if seen else "nothing"


def chaos_run(lab, mode, index, offset_s):
    name = f"chaos-{index}"  # thread, operation key and title; the receiver is fresh
    start = ["start", "--thread", name, "--operation", name, "--title", name, "--mode", mode]
    killed, landed = kill_at_random(lab.env, start, offset_s)
    finished = False
    for _ in range(MAX_RECOVERIES):
        resumed = run_workflow(["resume", "--thread", name], lab.env)
        finished = "done" in events(resumed.stdout)
        if finished:
            break
    return {"name": name, "killed": killed, "landed": landed, "finished": finished}


def count_tickets(lab, names):
    """Tickets per run title, from the receiver itself (`tickets` lists them all)."""
    done = run_workflow(["tickets"], lab.env)
    if done.returncode != 0:
        raise LabError(f"`tickets` failed with exit {done.returncode}: {done.stderr.strip()}")
    titles = Counter(t["payload"].get("title") for t in json.loads(done.stdout)["tickets"])
    return {name: titles[name] for name in names}


def summary(runs, per_run, seed):
    counts = list(per_run.values())
    return {
        "runs": len(runs),
        "operations": len(per_run),
        "tickets": sum(counts),
        "duplicates": sum(n - 1 for n in counts if n > 1),
        "missing": sum(1 for n in counts if n == 0),
        "unfinished": sum(1 for r in runs if not r["finished"]),
        "killed": sum(1 for r in runs if r["killed"]),
        "seed": seed,
    }


def main(argv=None):
    parser = Parser(
        prog="python -m labs.tools.chaos", description="Kill workflow runs at random moments."
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None, help="replay these kill offsets")
    parser.add_argument("--mode", choices=("safe", "naive", "node-uuid"), default="safe")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    offsets = [rng.uniform(0, KILL_WINDOW_S) for _ in range(args.runs)]  # drawn before any run
    print(
        f"chaos: seed {seed} (replay: --seed {seed}), {args.runs} {args.mode} runs, "
        f"{args.workers} at a time, each killed 0-{KILL_WINDOW_S * 1000:g} ms into its graph",
        flush=True,
    )
    began = time.monotonic()
    try:
        with LocalLab() as lab, ThreadPoolExecutor(args.workers) as pool:
            runs = list(
                pool.map(lambda i: chaos_run(lab, args.mode, i, offsets[i]), range(args.runs))
            )
            per_run = count_tickets(lab, [r["name"] for r in runs])
    except (LabError, subprocess.TimeoutExpired) as error:
        print(f"chaos: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        return 130
    landed = Counter(r["landed"] for r in runs)
    print(f"chaos: last event before the kill: {dict(sorted(landed.items()))}")
    for run in runs:
        if per_run[run["name"]] != 1 or not run["finished"]:
            print(f"chaos: {run['name']}: {per_run[run['name']]} tickets, {run}")
    print(f"chaos: {time.monotonic() - began:.1f} s")
    result = summary(runs, per_run, seed)
    print(json.dumps(result, sort_keys=True))
    bad = result["duplicates"] or result["missing"] or result["unfinished"]
    return EXIT_FOUND if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
