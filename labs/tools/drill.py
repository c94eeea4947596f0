"""The crash drill: kill the workflow at every boundary, in every mode, and count the tickets.

Each cell is one run with its own thread, operation key and title. The drill starts it
with --crash-at BOUNDARY, recovers it the way an operator would (resume until it prints
`done`; start it again from its input when the crash left nothing to resume), resumes it
once more (a finished run must redo nothing), and counts the receiver's tickets with the
run's title. All of it runs as real processes against one fresh receiver.

The ticket count depends only on where the key comes from. The durability setting decides
how much of the run the recovery redoes, so after-ack is also run under "async" and "exit".

    python -m labs.tools.drill [--backend local|docker] [--json] [--workers N]

--backend docker runs every command through Compose, in a project of its own
(stateful-lab-drill), so the learner's lab and its volumes are never touched.
Exit codes: 0 every cell as expected; 1 a cell differs; 2 bad arguments; 3 the lab could not run.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labs.tools.local import (
    ROOT,
    ReceiverProcess,
    free_port,
    lab_env,
    run_workflow,
    shell_exit_code,
)
from labs.tools.runner import COMMAND_TIMEOUT_S, compose_command, docker_engine_answers

MODES = ("naive", "safe", "node-uuid")
EXPECTED = {  # tickets per mode (naive, safe, node-uuid) after the crash and the recovery
    "after-prepare": (1, 1, 1),  # nothing was sent before the crash
    "before-request": (1, 1, 1),
    "lost-ack": (2, 1, 2),  # committed, answer lost: only a stable key can find it again
    "after-ack": (2, 1, 2),  # committed, node not returned: the rerun sends again
    "after-checkpoint": (1, 1, 1),  # the result was saved: nothing is redone
}
OTHER_DURABILITIES = ("async", "exit")  # extra rows for after-ack
OBSERVED = {"async"}  # what "async" has saved when the kill lands varies: recovery not checked
EXIT_OK, EXIT_DIFFERS, EXIT_USAGE, EXIT_NO_LAB = 0, 1, 2, 3
EXIT_KILLED, EXIT_NO_ANSWER, EXIT_NO_THREAD = 137, 3, 4  # workflow.py's exit codes
MAX_RECOVERIES = 3  # resumes before a cell gives up; one is enough in every cell here
WORKFLOW_TIMEOUT_S = 120  # seconds for one workflow command (docker: container start included)
DOCKER_PROJECT = "stateful-lab-drill"
NODE_OF_EVENT = {  # workflow.py events -> the node that prints them
    "prepare": "prepare",
    "effect_unknown": "create_ticket",
    "reconcile": "create_ticket",
    "effect_ack": "create_ticket",
}


class LabError(Exception):
    """The lab itself could not run (no engine, a receiver that does not start)."""


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line and exit 2, not a usage dump (also used by labs.tools.chaos)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


class LocalLab:
    """A fresh receiver in a temporary folder, with the lost-ack fault on (as compose.yaml)."""

    name = "local"

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="stateful-lab-drill-")
        self.env = lab_env(Path(self.dir), free_port(), RECEIVER_LAB_FAULTS="lost-ack")
        self.receiver = ReceiverProcess(self.env, Path(self.dir) / "receiver.log")
        try:
            self.receiver.start()
        except (RuntimeError, TimeoutError) as error:
            self.__exit__()
            raise LabError(f"the receiver did not start: {error}") from error
        return self

    def workflow(self, args):
        done = run_workflow(args, self.env, timeout=WORKFLOW_TIMEOUT_S)
        return done.stdout, shell_exit_code(done.returncode)

    def __exit__(self, *exc):
        self.receiver.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class DockerLab:
    """The same commands through Compose: `run --rm workflow ARGS` for each."""

    name = "docker"

    def __enter__(self):
        compose = compose_command()
        if compose is None or not docker_engine_answers():
            raise LabError("no Docker engine with Compose answers; try --backend local")
        self.compose = [*compose, "-p", DOCKER_PROJECT]
        self.call("down", "-v")  # a fresh receiver: leftovers of an interrupted drill go
        done = self.call("up", "-d", "--build", "api", timeout=COMMAND_TIMEOUT_S)
        if done.returncode != 0:
            raise LabError(f"`up -d --build api` failed: {done.stderr.strip()[-300:]}")
        return self

    def call(self, *args, timeout=WORKFLOW_TIMEOUT_S):
        return subprocess.run(
            [*self.compose, *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def workflow(self, args):
        done = self.call("run", "--rm", "workflow", *args)
        return done.stdout, shell_exit_code(done.returncode)

    def __exit__(self, *exc):
        self.call("down", "-v")


def cells():
    """(boundary, mode, durability) in matrix order: every boundary under sync, then durability."""
    rows = [(boundary, "sync") for boundary in EXPECTED]
    rows += [("after-ack", durability) for durability in OTHER_DURABILITIES]
    return [(boundary, mode, durability) for boundary, durability in rows for mode in MODES]


def expected_crash_exit(boundary, mode):
    if boundary != "lost-ack":
        return EXIT_KILLED
    return 0 if mode == "safe" else EXIT_NO_ANSWER  # safe settles it in the run itself


def expected_recovery(boundary, mode, durability):
    """(how the run was recovered, the nodes the recovery ran), or None where it varies."""
    if durability in OBSERVED:
        return None
    if durability == "exit":  # nothing is saved before the graph exits, and SIGKILL is no exit
        return "start again", ["prepare", "create_ticket"]
    if boundary == "lost-ack" and mode == "safe":
        return "none", []
    reran = {"after-prepare": ["prepare", "create_ticket"], "after-checkpoint": []}
    return "resume", reran.get(boundary, ["create_ticket"])


def events(stdout):
    return [json.loads(line)["event"] for line in stdout.splitlines() if line.startswith("{")]


def run_cell(lab, boundary, mode, durability):
    name = f"drill:{boundary}:{mode}:{durability}"  # thread, operation key and title
    common = ["--thread", name, "--durability", durability]
    start = ["start", *common, "--operation", name, "--title", name, "--mode", mode]
    stdout, crash_exit = lab.workflow([*start, "--crash-at", boundary])
    recovery, reran = "none", []
    for _ in range(MAX_RECOVERIES):
        if "done" in events(stdout):
            break
        stdout, code = lab.workflow(["resume", *common])
        recovery = "resume"
        if code == EXIT_NO_THREAD:  # the crash left no checkpoint: all we have is the input
            stdout, code = lab.workflow(start)
            recovery = "start again"
        reran += [NODE_OF_EVENT[e] for e in events(stdout) if e in NODE_OF_EVENT]
    finished = "done" in events(stdout)
    stdout, code = lab.workflow(["resume", *common])
    redid_nothing = code == 0 and events(stdout) == ["done"]
    stdout, code = lab.workflow(["tickets"])
    if code != 0:
        raise LabError(f"`tickets` failed with exit {code}")
    tickets = [t for t in json.loads(stdout)["tickets"] if t["payload"] == {"title": name}]
    want_recovery = expected_recovery(boundary, mode, durability)
    cell = {
        "boundary": boundary,
        "mode": mode,
        "durability": durability,
        "tickets": len(tickets),
        "expected": EXPECTED[boundary][MODES.index(mode)],
        "observed": want_recovery is None,
        "crash_exit": crash_exit,
        "recovery": recovery,
        "reran": list(dict.fromkeys(reran)),  # in order, each node once
        "finished": finished,
        "redid_nothing_after": redid_nothing,
    }
    cell["ok"] = (
        cell["tickets"] == cell["expected"]
        and crash_exit == expected_crash_exit(boundary, mode)
        and finished
        and redid_nothing
        and want_recovery in (None, (recovery, cell["reran"]))
    )
    return cell


def run_drill(lab, workers):
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(run_cell, lab, *cell) for cell in cells()]
        return [future.result() for future in futures]


def describe_recovery(cell):
    if cell["recovery"] == "none":
        return "none needed (settled in the run)"
    return f"{cell['recovery']}: {', '.join(cell['reran']) or 'nothing to redo'}"


def matrix(results):
    """The results as a text table: tickets per mode, and what the recovery redid."""
    lines = [f"{'boundary':<18}{'durability':<12}{'naive':<7}{'safe':<6}{'node-uuid':<11}recovery"]
    for i in range(0, len(results), len(MODES)):
        row = results[i : i + len(MODES)]
        counts = [
            str(c["tickets"]) if c["ok"] else f"{c['tickets']} X (want {c['expected']})"
            for c in row
        ]
        recoveries = {}
        for c in row:
            recoveries.setdefault(describe_recovery(c), []).append(c["mode"])
        if len(recoveries) == 1:
            recovery = next(iter(recoveries))
        else:
            recovery = "; ".join(f"{'/'.join(m)}: {r}" for r, m in recoveries.items())
        durability = row[0]["durability"] + ("*" if row[0]["observed"] else "")
        lines.append(
            f"{row[0]['boundary']:<18}{durability:<12}{counts[0]:<7}{counts[1]:<6}"
            f"{counts[2]:<11}{recovery}"
        )
    lines.append("tickets for one operation after the crash and the recovery")
    if any(c["observed"] for c in results):
        lines.append(
            '* observed, not promised: how much "async" had saved when the kill landed '
            "varies from run to run; the ticket count does not"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = Parser(
        prog="python -m labs.tools.drill", description="Crash the workflow at every boundary."
    )
    parser.add_argument("--backend", choices=("local", "docker"), default="local")
    parser.add_argument("--json", action="store_true", help="one JSON line per cell")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 2,
        help="cells run at once (default: one per CPU core)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    lab = LocalLab() if args.backend == "local" else DockerLab()
    began = time.monotonic()
    print(
        f"drill: {len(cells())} cells, {lab.name} backend, {args.workers} at a time",
        file=sys.stderr,
    )
    try:
        with lab:
            results = run_drill(lab, args.workers)
    except (LabError, subprocess.TimeoutExpired) as error:
        print(f"drill: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        return 130
    wrong = [c for c in results if not c["ok"]]
    if args.json:
        for cell in results:
            print(json.dumps(cell, sort_keys=True))
    else:
        print(matrix(results))
    verdict = f"{len(wrong)} cells differ" if wrong else f"all {len(results)} cells as expected"
    print(f"drill: {verdict} ({time.monotonic() - began:.1f} s)", file=sys.stderr)
    return EXIT_DIFFERS if wrong else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
