"""A durability mode's rows by the snapshot engine (snapshot.py), with real kills where a
snapshot cannot stand for one, and --verify: some of its points again by real kill, compared."""

import random
from dataclasses import dataclass

from effectdrill.plan import CleanRun, Recorder, in_step_order, name_calls
from effectdrill.processes import crash_all
from effectdrill.report import Row
from effectdrill.snapshot import plan_items
from effectdrill.trace import Trace


@dataclass(frozen=True)
class SnapState:
    """A crash state made from snapshots: the checkpoint image (a SQLite file), the writes rows
    to add (a held state's saved ones), the world's image (a pickle file)."""

    label: str
    ckpt: str
    rows: tuple
    world: str
    inline: bool = False  # the clean run took one invoke: resume in the chain (resume_here)


def snapshot_clean_run(plan, db, mode, warm):
    """The clean run through the snapshot engine's recorder: (CleanRun, (snaps, rows))."""
    thread = f"drill-{plan.run_id}-{mode}-clean"
    plan.expect_nothing_yet(thread)
    warm.start("snapclean", mode, [(None, thread)])
    calls, names, invokes, tools, snaps, rows, starts = warm.next().result()
    trace = Trace(plan, thread, Recorder())
    trace.names, trace.invokes = names, invokes
    name_calls(calls, names, tools)
    clean = CleanRun(plan.counts(thread), in_step_order(calls), trace.reruns(), thread)
    return clean, ((calls, snaps, rows, starts), len(invokes) == 1)


def snapshot_rows(plan, mode, clean, kept, report, repeat, warm):
    """Each crash state's row: resumed from its snapshots where they stand for a kill, else by
    real kill (the row says which). A world restored in place is put back as the clean run
    left it afterwards."""
    kept, inline = kept
    states = clean.states(mode)
    items = plan_items(clean, *kept, states)
    after_clean = None if getattr(plan.world, "relocatable", False) else plan.world.snapshot()
    snap_jobs, kill_jobs = [], []
    for index, (state, item) in enumerate(zip(states, items, strict=True)):
        row = Row(mode, state.label, clean.counts, tools=list(state.tools))
        report.rows.append(row)
        for attempt in range(repeat):
            if item is None:
                row.engine = "kill"
                kill_jobs.append((row, state, f"drill-{plan.run_id}-{mode}-{index}-{attempt}"))
            else:
                row.engine = "snapshot"
                made = SnapState(state.label, *item, inline=inline)
                snap_jobs.append((row, made, clean.thread))
    try:
        if snap_jobs:
            warm.start("resume", mode, [(state, thread) for _, state, thread in snap_jobs])
            for row, _state, thread in snap_jobs:
                row.runs.append(plan.end_crash(warm.next(), thread))
    finally:
        if after_clean is not None:
            plan.world.restore(after_clean)
    crash_all(plan, mode, kill_jobs, warm)
    return [(row, state) for row, state in zip(report.rows[-len(states) :], states, strict=True)]


def verify(plan, mode, rows, count, report, warm, rng=None):
    """Run `count` randomly chosen snapshot rows again by real kill and record, per row, whether
    the two engines agree (report.verified)."""
    made = [(row, state) for row, state in rows if row.engine == "snapshot"]
    if not made or count < 1:
        return
    chosen = sorted((rng or random.SystemRandom()).sample(range(len(made)), min(count, len(made))))
    jobs = []
    for n in chosen:
        row, state = made[n]
        twin = Row(mode, row.point, row.clean, tools=row.tools)
        jobs.append((twin, state, f"drill-{plan.run_id}-{mode}-verify-{n}"))
    crash_all(plan, mode, jobs, warm)
    for (twin, _state, _thread), n in zip(jobs, chosen, strict=True):
        row = made[n][0]
        mine, theirs = seen(row), seen(twin)
        report.verified.append(
            {
                "durability": mode,
                "point": row.point,
                "same": mine == theirs,
                "snapshot": mine,
                "kill": theirs,
            }
        )


def seen(row):
    """What a row's runs found, as the engines must agree on it (not the thread ids)."""
    return {
        "reached": [run.reached for run in row.runs[:1]],
        "saved": [run.saved for run in row.runs[:1]],
        "ran": [run.ran for run in row.runs[:1]],
        "counts": {effect: row.counts(effect)[:1] for effect in row.effects()},
        "failed": [run.error is not None for run in row.runs[:1]],
        "verdict": row.verdict,
    }
