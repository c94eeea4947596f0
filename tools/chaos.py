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

    python -m tools.chaos --runs N [--seed S] [--mode safe|naive|node-uuid] [--workers N]
    make chaos RUNS=N SEED=S MODE=M          # the same; the run prints this line to replay it

The seed fixes each run's kill offset; where an offset lands still depends on the machine's
timing, so a replay covers the same offsets, not necessarily the same outcomes. A kill lands
in the crash window when the receiver had answered (`effect_ack`) and the node's checkpoint
was not written: the resume then ran create_ticket again. Those are the kills that make a
duplicate without a stable key; the run counts them.

stdout is one JSON object (`make chaos | jq`): {"runs", "operations", "tickets",
"duplicates", "in_crash_window", ...}; everything else, the verdict sentence last, goes to
stderr. Exit codes: 0 one ticket per run; 1 duplicates or a run that did not finish;
2 bad arguments; 3 the lab could not run; 130 Ctrl-C.
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from commandline import Parser
from labs.modes import MODES
from tools.backends import LabError, LocalBackend
from tools.local import ROOT
from tools.local import event_names as events

KILL_WINDOW_S = 0.015  # seconds after the first event: a bit longer than the graph's
#                        ~5-10 ms here, so some runs end on their own first (the clean path)
MAX_RECOVERIES = 3  # resumes per run before it counts as unfinished; one is enough
START_TIMEOUT_S = 60  # seconds for a workflow process to print its first event
EXIT_OK, EXIT_FOUND, EXIT_NO_LAB = 0, 1, 3  # and 2 for bad arguments (Parser)


@dataclass(frozen=True)
class ChaosOptions:
    """One chaos run: main() builds it from the command line (chaos reads no environment
    variable; the CPU count gives the default number of workers)."""

    runs: int = 30  # workflow runs, each killed once at a random moment
    mode: str = "safe"  # where the key comes from (lab.MODES); naive is the control
    seed: int | None = None  # the kill offsets' seed; None draws a new one, printed to replay it
    workers: int = field(default_factory=lambda: os.cpu_count() or 2)  # runs at once: per core


def kill_at_random(env, start_args, offset_s):
    """Start a run; SIGKILL it offset_s after its first event -> (killed, last event seen, the
    last line it wrote to stderr: why a run that ended on its own ended)."""
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: nobody reads it live
        proc = subprocess.Popen(
            [sys.executable, "-m", "labs", *start_args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,
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
        errors.seek(0)
        said = last_line(errors.read())
    if proc.returncode != -signal.SIGKILL:
        return False, "finished first", f"exit {proc.returncode}: {said}"
    seen = events(printed)
    return True, seen[-1] if seen else "nothing", said


def last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def killed_run(lab, mode, index, offset_s):
    name = f"chaos-{index}"  # thread, operation key and title; the receiver is fresh
    start = ["start", "--thread", name, "--operation", name, "--title", name, "--mode", mode]
    killed, landed, said = kill_at_random(lab.env, start, offset_s)
    finished, reran, resume_said = False, [], ""
    for _ in range(MAX_RECOVERIES):
        resumed = lab.workflow(["resume", "--thread", name])
        reran += events(resumed.stdout)
        finished = "done" in reran
        if finished:
            break
        resume_said = f"exit {resumed.exit_code}: {last_line(resumed.stderr)}"
    # Answered, and create_ticket had to run again: its result was not checkpointed.
    in_window = killed and landed == "effect_ack" and "effect_ack" in reran
    run = {
        "name": name,
        "killed": killed,
        "landed": landed,
        "finished": finished,
        "in_crash_window": in_window,
    }
    if not finished:  # what the start and the last resume said, for the one-line report
        run.update(start_said=said, resume_said=resume_said)
    return run


def count_tickets(lab, names):
    """Tickets per run title, from the receiver itself."""
    titles = Counter(t["payload"].get("title") for t in lab.tickets())
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
        "in_crash_window": sum(1 for r in runs if r.get("in_crash_window")),
        "seed": seed,
    }


def main(argv=None):
    defaults = ChaosOptions()
    parser = Parser(
        prog="python -m tools.chaos", description="Kill workflow runs at random moments."
    )
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--seed", type=int, default=defaults.seed, help="replay these kill offsets")
    parser.add_argument("--mode", choices=MODES, default=defaults.mode)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")
    return chaos(ChaosOptions(runs=args.runs, mode=args.mode, seed=args.seed, workers=args.workers))


def chaos(settings):
    """The whole chaos run, as `make chaos` runs it -> the exit code."""
    seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    offsets = [rng.uniform(0, KILL_WINDOW_S) for _ in range(settings.runs)]  # drawn before any run
    print(
        f"chaos: seed {seed} (replay: {replay_command(settings.runs, seed, settings.mode)}), "
        f"{settings.runs} {settings.mode} runs, "
        f"{settings.workers} at a time, each killed 0-{KILL_WINDOW_S * 1000:g} ms into its graph",
        file=sys.stderr,
        flush=True,
    )
    began = time.monotonic()
    try:
        # No lab fault: a kill from outside needs none (the drill turns lost-ack on for its row).
        with LocalBackend() as lab, ThreadPoolExecutor(settings.workers) as pool:
            lab.up()
            runs = list(
                pool.map(
                    lambda i: killed_run(lab, settings.mode, i, offsets[i]), range(settings.runs)
                )
            )
            per_run = count_tickets(lab, [r["name"] for r in runs])
    except (LabError, subprocess.TimeoutExpired) as error:
        print(f"chaos: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        print("chaos: stopped; nothing left behind", file=sys.stderr)
        return 130
    landed = Counter(r["landed"] for r in runs)
    print(f"chaos: last event before the kill: {dict(sorted(landed.items()))}", file=sys.stderr)
    for run in runs:
        if per_run[run["name"]] != 1 or not run["finished"]:
            print(f"chaos: {run['name']}: {per_run[run['name']]} tickets, {run}", file=sys.stderr)
    result = summary(runs, per_run, seed)
    print(sentence(result, settings.mode, time.monotonic() - began), file=sys.stderr, flush=True)
    print(json.dumps(result, sort_keys=True), flush=True)
    bad = result["duplicates"] or result["missing"] or result["unfinished"]
    return EXIT_FOUND if bad else EXIT_OK


def replay_command(runs, seed, mode):
    """The make command that draws the same kill offsets again."""
    return f"make chaos RUNS={runs} SEED={seed} MODE={mode}"


def sentence(result, mode, seconds):
    """The verdict in one plain sentence."""
    window = (
        f"{result['in_crash_window']} of {result['killed']} kills landed in the crash window "
        "(answered, not checkpointed)"
    )
    if result["killed"] < result["runs"]:  # its offset came after the process had exited
        first = result["runs"] - result["killed"]
        window += f", {first} {'run' if first == 1 else 'runs'} ended before the kill"
    if result["duplicates"] or result["missing"] or result["unfinished"]:
        found = (
            f"{result['duplicates']} duplicate tickets, {result['missing']} operations with "
            f"none, {result['unfinished']} runs unfinished"
        )
        return f"chaos: {mode} mode FAILED: {found}; {window} ({seconds:.1f} s)."
    return (
        f"chaos: {mode} mode held: every one of {result['runs']} runs has exactly one "
        f"ticket; {window} ({seconds:.1f} s)."
    )


if __name__ == "__main__":
    sys.exit(main())
