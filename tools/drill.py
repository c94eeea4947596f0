"""The crash drill: kill the workflow at every boundary, in every mode, and count the tickets.

Each cell is one run with its own thread, operation key and title. The drill starts it
with --crash-at BOUNDARY (rows named term-at:POINT: --term-at POINT, a SIGTERM the run
drains on, as in a deploy), recovers it the way an operator would (resume until it prints
`done`; start it again from its input when the crash left nothing to resume), resumes it
once more (a finished run must redo nothing), and counts the receiver's tickets with the
run's title. All of it runs as real processes against one fresh receiver of the drill's
own, with the lost-ack fault turned on (labs/lost-ack.compose.yaml). Each cell is printed on
stderr as it finishes; a cell that differs says which check failed, and its JSON line
carries the commands it ran with their exit codes and events.

The ticket count depends only on where the key comes from. The durability setting decides
how much of the run the recovery redoes, so after-ack is also run under "async" and "exit".

    python -m tools.drill [--backend local|docker] [--json] [--workers N] [--project P]

--backend docker runs every command through Compose, in a project of its own
(stateful-lab-drill, or --project), so the learner's lab and its volumes are never touched.
The matrix (MATRIX) is the one statement of what each cell should show.
Exit codes: 0 every cell as expected; 1 a cell differs; 2 bad arguments; 3 the lab could not run;
130 Ctrl-C.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from commandline import Parser
from exitcodes import EXIT_DRAINED, EXIT_NO_ANSWER, EXIT_THREAD
from labs.modes import MODES
from providers import TIMEOUT_S
from tools.backends import LOST_ACK, DockerBackend, LabError, LocalBackend
from tools.local import event_names, shell_exit_code

EXIT_OK, EXIT_DIFFERS, EXIT_NO_LAB = 0, 1, 3  # and EXIT_USAGE (2) for bad arguments
KILLED = shell_exit_code(-signal.SIGKILL)  # 137: the crash switch, as a shell reports it
MAX_RECOVERIES = 3  # resumes before a cell gives up; one is enough in every cell here
DOCKER_PROJECT = "stateful-lab-drill"
NODE_OF_EVENT = {  # workflow.py events -> the node that prints them
    "prepare": "prepare",
    "effect_unknown": "create_ticket",
    "reconcile": "create_ticket",
    "effect_ack": "create_ticket",
    "effect_receipt": "create_ticket",  # --mode ledger: the receipt, nothing sent
    "effect_adopted": "create_ticket",  # --mode ledger: found by key, nothing sent
}


@dataclass(frozen=True)
class DrillOptions:
    """What one drill runs, and where: main() builds them from the command line (the drill
    reads no environment variable; the CPU count gives the default number of workers)."""

    backend: str = "local"  # local: native processes; docker: Compose, in `project`
    project: str = DOCKER_PROJECT  # docker: a project of the drill's own, never the learner's
    boundaries: tuple = ()  # only these boundaries' rows; () for every row
    workers: int = field(default_factory=lambda: os.cpu_count() or 2)  # cells at once: per core
    json: bool = False  # one JSON line per cell on stdout, instead of the table


def each(value):
    """The same expectation for every mode."""
    return (value,) * len(MODES)


@dataclass(frozen=True)
class MatrixRow:
    """One row of the matrix: where the run dies, under which durability, and for each mode
    (in MODES order: naive, safe, node-uuid, ledger) what a learner sees."""

    boundary: str  # workflow.py --crash-at BOUNDARY, or term-at:POINT for --term-at POINT
    durability: str
    tickets: tuple  # tickets for the one operation after the crash and the recovery
    crash_exit: tuple = each(KILLED)  # the exit code of the run that crashed
    recovery: tuple | None = None  # how it was recovered and what reran; None: observed only

    @property
    def crash_args(self):
        if self.boundary.startswith("term-at:"):  # SIGTERM, as a deploy sends it (lab 09)
            return ["--term-at", self.boundary.removeprefix("term-at:")]
        return ["--crash-at", self.boundary]


RESUME_BOTH = each("resume: prepare, create_ticket")
RESUME_CREATE = each("resume: create_ticket")
MATRIX = (  # the one statement of what the drill expects; tests and docs read it from here
    MatrixRow("after-prepare", "sync", (1, 1, 1, 1), recovery=RESUME_BOTH),  # nothing was sent
    MatrixRow("before-request", "sync", (1, 1, 1, 1), recovery=RESUME_CREATE),
    MatrixRow(  # committed, answer lost: only a stable key can find it again
        "lost-ack",
        "sync",
        (2, 1, 1, 1),
        # a key settles it in the run itself: even node-uuid's, which the attempt still holds
        crash_exit=(EXIT_NO_ANSWER, 0, 0, 0),
        recovery=("resume: create_ticket", "none", "none", "none"),
    ),
    MatrixRow(  # lab 15: inside Effect.perform, answered, not yet recorded: only the ledger's run
        "after-send",  # passes it (the lessons' nodes record nothing); its resume adopts by key
        "sync",
        (1, 1, 1, 1),
        crash_exit=(0, 0, 0, KILLED),
        recovery=("none", "none", "none", "resume: create_ticket"),
    ),
    MatrixRow("after-ack", "sync", (2, 1, 2, 1), recovery=RESUME_CREATE),  # the rerun sends again
    # lab 08: the node returned, its result was not saved yet: the rerun sends again
    MatrixRow("step-boundary", "sync", (2, 1, 2, 1), recovery=RESUME_CREATE),
    MatrixRow("after-checkpoint", "sync", (1, 1, 1, 1), recovery=each("resume: nothing")),  # saved
    # lab 09: SIGTERM drains the run at the step boundary; nothing is redone in any mode
    MatrixRow(
        "term-at:after-prepare",
        "sync",
        (1, 1, 1, 1),
        crash_exit=each(EXIT_DRAINED),  # stopped after prepare, its result saved
        recovery=RESUME_CREATE,
    ),
    MatrixRow(  # create_ticket was the last node: the run finishes
        "term-at:after-ack", "sync", (1, 1, 1, 1), crash_exit=each(0), recovery=each("none")
    ),
    # The durability decides how much the recovery redoes, never the ticket count:
    MatrixRow(
        "after-ack", "async", (2, 1, 2, 1)
    ),  # what "async" had saved when the kill landed varies
    MatrixRow(
        "after-ack", "exit", (2, 1, 2, 1), recovery=each("start again: prepare, create_ticket")
    ),
)


@dataclass(frozen=True)
class Cell:
    row: MatrixRow
    mode: str

    @property
    def name(self):  # the run's thread, operation key and title
        return f"drill:{self.row.boundary}:{self.mode}:{self.row.durability}"

    def expected(self, field):
        return getattr(self.row, field)[MODES.index(self.mode)]


def cells(boundaries=None):
    """Every (row, mode) in matrix order; only the rows of these boundaries when given."""
    rows = [row for row in MATRIX if not boundaries or row.boundary in boundaries]
    return [Cell(row, mode) for row in rows for mode in MODES]


def describe_recovery(how, reran):
    return "none" if how == "none" else f"{how}: {', '.join(reran) or 'nothing'}"


def run_cell(lab, cell):
    """Crash the run, recover it as an operator would, resume once more, count its tickets."""
    log = []

    def workflow(args):
        result = lab.workflow(args)
        log.append(
            {"args": " ".join(args), "exit": result.exit_code, "events": event_names(result.stdout)}
        )
        return result

    name, durability = cell.name, cell.row.durability
    common = ["--thread", name, "--durability", durability]
    start = ["start", *common, "--operation", name, "--title", name, "--mode", cell.mode]
    crashed = workflow([*start, *cell.row.crash_args])
    result, how, reran = crashed, "none", []
    for _ in range(MAX_RECOVERIES):
        if "done" in event_names(result.stdout):
            break
        result, how = workflow(["resume", *common]), "resume"
        if result.exit_code == EXIT_THREAD:  # the crash left no checkpoint: start from the input
            result, how = workflow(start), "start again"
        reran += [NODE_OF_EVENT[e] for e in event_names(result.stdout) if e in NODE_OF_EVENT]
    finished = "done" in event_names(result.stdout)
    again = workflow(["resume", *common])
    redid_nothing = again.exit_code == 0 and event_names(again.stdout) == ["done"]
    tickets = [t for t in lab.tickets() if t["payload"] == {"title": name}]
    recovery = describe_recovery(how, list(dict.fromkeys(reran)))  # in order, each node once
    want = {f: cell.expected(f) for f in ("tickets", "crash_exit")}
    want_recovery = cell.expected("recovery") if cell.row.recovery else None
    why = []
    if len(tickets) != want["tickets"]:
        why.append(f"{len(tickets)} tickets, expected {want['tickets']}")
    if crashed.exit_code != want["crash_exit"]:
        why.append(f"the crash exited {crashed.exit_code}, expected {want['crash_exit']}")
    if not finished:
        why.append(f"not done after {MAX_RECOVERIES} recoveries")
    if not redid_nothing:
        why.append("a resume after `done` ran a node again or failed")
    if want_recovery is not None and recovery != want_recovery:
        why.append(f"recovery was {recovery!r}, expected {want_recovery!r}")
    lost = any("effect_unknown" in entry["events"] for entry in log)
    if why and lost and cell.row.boundary != "lost-ack":  # no fault asked for: a slow receiver
        why.append(
            "an answer was lost without the lost-ack fault: the receiver took longer than "
            f"the client's {TIMEOUT_S:g} s request timeout (a loaded machine?)"
        )
    result = {
        "boundary": cell.row.boundary,
        "mode": cell.mode,
        "durability": durability,
        "tickets": len(tickets),
        "expected": want["tickets"],
        "observed": want_recovery is None,
        "crash_exit": crashed.exit_code,
        "recovery": recovery,
        "finished": finished,
        "redid_nothing_after": redid_nothing,
        "ok": not why,
        "why": why,
    }
    if why:
        result["log"] = log  # the commands the cell ran, with their exits and events
    return result


def progress(done, total, cell):
    verdict = "as expected" if cell["ok"] else "DIFFERS: " + "; ".join(cell["why"])
    print(
        f"drill: [{done}/{total}] {cell['boundary']} {cell['durability']} {cell['mode']}: "
        f"{cell['tickets']} ticket{'' if cell['tickets'] == 1 else 's'}, {verdict}",
        file=sys.stderr,
        flush=True,
    )


def run_drill(lab, settings, on_cell=progress):
    """The cells, settings.workers at a time, against one fresh receiver; results in matrix
    order."""
    todo = cells(settings.boundaries)
    results = [None] * len(todo)
    pool = ThreadPoolExecutor(settings.workers)
    try:
        futures = {pool.submit(run_cell, lab, cell): i for i, cell in enumerate(todo)}
        for done, future in enumerate(as_completed(futures), 1):
            results[futures[future]] = future.result()
            on_cell(done, len(todo), results[futures[future]])
    finally:  # on Ctrl-C: drop the cells not started, wait for the few running
        pool.shutdown(cancel_futures=True)
    return results


def matrix_table(results):
    """The results as a text table: tickets per mode, and what the recovery redid."""
    lines = [f"{'boundary':<22}{'durability':<12}{'naive':<7}{'safe':<6}{'node-uuid':<11}recovery"]
    for i in range(0, len(results), len(MODES)):
        row = results[i : i + len(MODES)]
        counts = [
            str(c["tickets"]) if c["ok"] else f"{c['tickets']} X (want {c['expected']})"
            for c in row
        ]
        recoveries = {}
        for c in row:
            recoveries.setdefault(c["recovery"], []).append(c["mode"])
        if len(recoveries) == 1:
            recovery = next(iter(recoveries))
        else:
            recovery = "; ".join(f"{'/'.join(m)}: {r}" for r, m in recoveries.items())
        durability = row[0]["durability"] + ("*" if row[0]["observed"] else "")
        lines.append(
            f"{row[0]['boundary']:<22}{durability:<12}{counts[0]:<7}{counts[1]:<6}"
            f"{counts[2]:<11}{recovery}"
        )
    lines.append("tickets for one operation after the crash and the recovery")
    if any(c["observed"] for c in results):
        lines.append(
            '* observed, not promised: how much "async" had saved when the kill landed '
            "varies from run to run; the ticket count does not"
        )
    return "\n".join(lines)


def open_lab(settings, in_process=False):
    """A fresh lab of the drill's own with the lost-ack fault on (named explicitly).
    in_process (local): commands without a crash switch run in this process (the tests)."""
    if settings.backend == "local":
        lab = LocalBackend(in_process=in_process)
    else:
        lab = DockerBackend(settings.project)
    try:
        lab.down()  # docker: what an interrupted drill left behind
        up = lab.up([LOST_ACK])
        if up.exit_code:
            raise LabError(f"`up -d --build api` failed: {up.stderr.strip()[-300:]}")
    except BaseException:
        lab.close()
        raise
    return lab


def main(argv=None):
    defaults = DrillOptions()
    parser = Parser(
        prog="python -m tools.drill", description="Crash the workflow at every boundary."
    )
    parser.add_argument("--backend", choices=("local", "docker"), default=defaults.backend)
    parser.add_argument("--json", action="store_true", help="one JSON line per cell")
    parser.add_argument("--project", default=defaults.project, help="docker: the Compose project")
    parser.add_argument(
        "--boundary",
        action="append",
        choices=sorted({row.boundary for row in MATRIX}),
        help="only this boundary's rows (repeat for more; default: every row)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="cells run at once (default: one per CPU core)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    settings = DrillOptions(
        backend=args.backend,
        project=args.project,
        boundaries=tuple(args.boundary or ()),
        workers=args.workers,
        json=args.json,
    )
    return drill_and_print(settings)


def drill_and_print(settings):
    """The whole drill, as `make drill` runs it -> the exit code."""
    began = time.monotonic()
    print(
        f"drill: {len(cells(settings.boundaries))} cells, {settings.backend} backend, "
        f"{settings.workers} at a time",
        file=sys.stderr,
        flush=True,
    )
    try:
        with open_lab(settings) as lab:
            results = run_drill(lab, settings)
    except (LabError, subprocess.TimeoutExpired) as error:
        print(f"drill: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        print("drill: stopped; nothing left behind", file=sys.stderr)
        return 130
    wrong = [c for c in results if not c["ok"]]
    if settings.json:
        for cell in results:
            print(json.dumps(cell, sort_keys=True))
    else:
        print(matrix_table(results))
    verdict = f"{len(wrong)} cells differ" if wrong else f"all {len(results)} cells as expected"
    print(f"drill: {verdict} ({time.monotonic() - began:.1f} s)", file=sys.stderr)
    return EXIT_DIFFERS if wrong else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
