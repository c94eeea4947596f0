"""The drill: crash a graph just before each saver call of a clean run, resume, count effects.

A clean run of the graph, through a saver that records each call, gives the crash points: each
distinct saver call (`put step N`, `put_writes NODE [channels]`). For each point a forked child
runs the graph on a new thread and SIGKILLs itself just before that call; the parent opens a
fresh saver on the same database, finishes the thread the way an operator would (resume it
when it has tasks, submit the input again when nothing was saved) and asks the observer how
many times each effect happened. The clean run is the baseline: a count above it is a
duplicate, below it a missing effect. Under sync, a step whose writes are saved side by side
also gets a row for each other set of them a kill can leave unsaved. Graphs of `async def`
nodes are drilled through LangGraph's async API and async savers. Checked on LangGraph 1.2.24
(see README.md). The snapshot engine (engine="snapshot", or "auto" where a world is declared)
makes the same crash states from snapshots of one clean run instead (snapshot.py, engines.py).
"""

import uuid
from collections.abc import Mapping

from effectdrill import outbound
from effectdrill.engines import snapshot_clean_run, snapshot_rows, verify
from effectdrill.errors import DrillError, one_line, require_posix, safe
from effectdrill.processes import crash_all, warm_parent
from effectdrill.report import Report, Row
from effectdrill.runs import Plan
from effectdrill.savers import database, store_maker, temporary_folder
from effectdrill.snapshot import choose
from effectdrill.world import SqliteWorld, declared_world

DURABILITIES = ("sync", "async", "exit")  # LangGraph's durability modes, in the order drilled


HTTP_SAW_NOTHING = (
    "--observe http: the clean run sent no POST or PATCH the observer sees (http.client, "
    "httpx, httpx2, aiohttp; not gRPC or a database), or --http-ignore left them all out: "
    "no repeat could show; count the effects with --observe MODULE:FUNC"
)
NOTHING_COUNTED = (
    "the clean run made no effect the observer counts ({counts}): no crash could repeat one, "
    "so the drill would test nothing. The graph may act only on some answers or inputs: give "
    "a --resume-with or --input that makes it act, or --allow-no-effects if this run is meant "
    "to make none"
)


def drill(
    graph,
    input,
    observe,
    durability="sync",
    repeat=1,
    resume_with=None,
    context=None,
    checkpoint_db=None,
    expect=None,
    http_ignore=(),
    store=None,
    allow_no_effects=False,
    engine="auto",
    verify=0,
    world=None,
):
    """Drill `graph` (compiled, or a no-argument callable returning one) and return a Report.

    input: the run's input; every "{thread}" in its strings becomes the run's thread id.
    observe: observe(thread_id) -> {effect: count} for that run, from the outside world; or
    "http": the POST and PATCH requests the run sends are the effects (effectdrill/outbound.py).
    durability: "sync", "async", "exit" or "all". repeat: runs per crash point (async varies).
    resume_with: the value of Command(resume=...) whenever a run stops at interrupt(), or a
      function called with the pending interrupts that returns it (or {interrupt id: value}).
    context: LangGraph's runtime context, given to every invoke.
    checkpoint_db: a SQLite file or a postgresql:// URL; by default a temporary SQLite file.
    expect: {effect: count} the clean run must count (by default its own counts are the
      baseline, and only a repeat of a node re-run after an interrupt is flagged).
    http_ignore: hosts or host/path prefixes the HTTP observer leaves out (a model API, say).
    store: the store LangGraph's platform would give the graph (get_store(), a node's `store`
      argument): "sqlite" for a SqliteStore on a temporary file every run shares (it outlives
      the kill), or a function with no arguments returning a store of yours.
    allow_no_effects: drill a clean run that counts no effect (by default a DrillError: a
      drill of a run that makes nothing tests nothing, and would read as all clear).
    engine: "snapshot" (resume each crash state from the snapshots of one clean run), "kill"
      (a real kill per crash state) or "auto": snapshot where the drill can restore all a
      resume can touch, else kill (report.engines says which, and why).
    verify: also run this many randomly chosen snapshot points by real kill, and compare
      (report.verified; report.ok is false when a row differs).
    world: what a resume can touch outside the checkpoints, for the snapshot engine: an object
      with snapshot() and restore(image), or a SQLite file or folder (world.SqliteWorld); by
      default the `drill_world` attribute of the observer or of the context, if any.
    """
    require_posix()
    modes = durability_modes(durability)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise DrillError(f"repeat must be a whole number of 1 or more, not {repeat!r}")
    expect = expected_counts(expect)
    graph = compiled(graph)
    if not callable(observe) and observe != "http":
        raise DrillError(f"the observer must be callable as observe(thread_id), not {observe!r}")
    http = observe == "http"
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise DrillError(f"verify must be a whole number of 0 or more, not {verify!r}")
    declared = None if http else declared_world(world, observe, context)
    if isinstance(declared, SqliteWorld):
        declared.files()  # a $NAME not set: said now, not from inside a saver call
    for mode in modes:  # before any run: a usage mistake is said at once
        choose(engine, None, None, mode, http, declared, early=True)
    if verify and engine == "kill":
        raise DrillError(
            f"--verify {verify} runs snapshot rows again by real kill, and --engine kill makes "
            "none: drop --verify, or use --engine auto or snapshot"
        )
    # The HTTP observer records every run's requests (effectdrill/outbound.py).
    with (
        database(checkpoint_db) as db,
        outbound.recording_requests(http_ignore) as requests,
        store_maker(store) as stores,
        temporary_folder("effectdrill-snap-") as snapdir,
    ):
        observe = requests.observe if observe == "http" else observe
        plan = Plan(graph, input, observe, resume_with, context, uuid.uuid4().hex[:8], stores)
        plan.world, plan.snapdir = declared, snapdir
        report, clean_threads = Report(expect), {}
        with warm_parent(plan, db) as warm:
            options = (allow_no_effects, engine, verify)
            drill_modes(plan, db, modes, repeat, report, clean_threads, warm, http, options)
        requests.annotate(report, clean_threads)
    return report


def drill_modes(plan, db, modes, repeat, report, clean_threads, warm, http, options):
    """The clean run of each mode, then its crash runs (see drill), by the engine chosen."""
    empty_ok, engine, verify_count = options
    for mode in modes:
        used, why = choose(engine, plan, db, mode, http, plan.world)
        report.engines[mode] = (used, why)
        if used == "snapshot":
            clean, kept = snapshot_clean_run(plan, db, mode, warm)
        else:
            clean = plan.clean_run(db, mode, warm)
        if not any(clean.counts.values()) and not empty_ok:  # nothing to repeat: not green
            counts = ", ".join(f"{e} 0" for e in clean.counts) or "none"
            raise DrillError(HTTP_SAW_NOTHING if http else NOTHING_COUNTED.format(counts=counts))
        report.clean[mode] = clean.counts
        report.reruns[mode] = clean.reruns
        clean_threads[mode] = clean.thread
        if used == "snapshot":
            made = snapshot_rows(plan, mode, clean, kept, report, repeat, warm)
            verify(plan, mode, made, verify_count, report, warm)
            continue
        jobs = []
        for index, state in enumerate(clean.states(mode)):
            row = Row(mode, state.label, clean.counts, tools=list(state.tools))
            report.rows.append(row)
            for attempt in range(repeat):
                jobs.append((row, state, f"drill-{plan.run_id}-{mode}-{index}-{attempt}"))
        crash_all(plan, mode, jobs, warm)


def durability_modes(durability):
    if durability == "all":
        return DURABILITIES
    if durability not in DURABILITIES:
        raise DrillError(f"durability must be one of sync, async, exit, all, not {durability!r}")
    return (durability,)


def expected_counts(expect):
    if expect is None:
        return {}
    if not isinstance(expect, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in expect.items()
    ):
        raise DrillError(f"expect must be a dict of effect name -> count, not {expect!r:.200}")
    return {safe(effect): count for effect, count in expect.items()}  # as Plan.counts


def compiled(graph):
    from langgraph.pregel import Pregel

    if not isinstance(graph, Pregel) and callable(graph):
        try:
            graph = graph()
        except Exception as error:
            raise DrillError(f"building the graph raised {one_line(error)}") from None
    if not isinstance(graph, Pregel):
        raise DrillError(
            f"not a compiled LangGraph graph: {type(graph).__name__} (give graph.compile()'s "
            "result, or a function with no arguments that returns it)"
        )
    return graph
