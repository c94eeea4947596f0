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
(see README.md).
"""

import asyncio
import gc
import importlib
import itertools
import json
import linecache
import os
import pickle
import re
import select
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from contextlib import asynccontextmanager, contextmanager, nullcontext, redirect_stdout
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from effectdrill import outbound

DURABILITIES = ("sync", "async", "exit")  # LangGraph's durability modes, in the order drilled
THREAD_MARK = "{thread}"  # replaced by the run's thread id everywhere in the input
CHILDREN_AT_ONCE = 2  # crash children the warm parent keeps running side by side
MAX_INVOKES = 50  # invokes one run may take (one per interrupt answered); more means a loop
CHILD_DEADLINE_S = 300.0  # seconds a crash child may run: a graph that hangs is an error
SETTLE_DEADLINE_S = 30.0  # seconds a sync kill waits for the calls it lets finish (Killer)
HOLD_DEADLINE_S = 30.0  # seconds a child holding writes waits for the rest of their step
WATCH_EVERY_S = 0.005  # how often a child holding a call checks that LangGraph does not wait on it
WATCH_LOOKS = 3  # looks in a row that find every thread blocked before the child gives up
CHILD_FAILED = 3  # a crash child's exit code when the graph raised (the message is piped)
CHILD_UNREACHED = 4  # a crash child's exit code when LangGraph waited on a held write
CHILD_GAVE_UP = 5  # ... when it held writes for HOLD_DEADLINE_S and the state never came
MAX_HELD = 4  # steps with more writes than this get fewer unsaved sets (see CleanRun.states)
MEMORY_DATABASES = ("", ":memory:", "memory")  # names of an in-memory SQLite database
PULL_PREFIX = "~__pregel_pull, "  # LangGraph's task_path of a node's task (_algo.task_path_str)
PUSH_PREFIX = "~__pregel_push, "  # of a Send's task or an @task call (_algo.task_path_str)


HTTP_SAW_NOTHING = (
    "--observe http: the clean run sent no POST or PATCH the observer sees (http.client, "
    "httpx, httpx2, aiohttp; not gRPC or a database), or --http-ignore left them all out: "
    "no repeat could show; count the effects with --observe MODULE:FUNC"
)


class DrillError(Exception):
    """The graph, its input, observer or database cannot be drilled: the message is one line."""


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
    # The HTTP observer records every run's requests (effectdrill/outbound.py).
    with (
        database(checkpoint_db) as db,
        outbound.recording(http_ignore) as requests,
        store_maker(store) as stores,
    ):
        observe = requests.observe if observe == "http" else observe
        plan = Plan(graph, input, observe, resume_with, context, uuid.uuid4().hex[:8], stores)
        report, clean_threads = Report(expect), {}
        with warm_parent(plan, db) as warm, plan.event_loop():
            drill_modes(plan, db, modes, repeat, report, clean_threads, warm, http)
        requests.annotate(report, clean_threads)
    return report


def drill_modes(plan, db, modes, repeat, report, clean_threads, warm, http=False):
    """The clean run of each mode, then its crash runs (see drill)."""
    for mode in modes:
        clean = plan.clean_run(db, mode)
        if http and not any(clean.counts.values()):  # nothing to repeat: not a green drill
            raise DrillError(HTTP_SAW_NOTHING)
        report.clean[mode] = clean.counts
        report.reruns[mode] = clean.reruns
        clean_threads[mode] = clean.thread
        jobs = []
        for index, state in enumerate(clean.states(mode)):
            row = Row(mode, state.label, clean.counts)
            report.rows.append(row)
            for attempt in range(repeat):
                jobs.append((row, state, f"drill-{plan.run_id}-{mode}-{index}-{attempt}"))
        crash_all(plan, db, mode, jobs, warm)


@dataclass
class Run:
    """One crash run: was the point reached, what was saved, what the recovery ran, the counts."""

    reached: bool
    saved: str
    ran: list
    counts: dict
    error: str | None = None
    thread: str = ""
    unreached: bool = False  # LangGraph waited on a call the kill held: no counts, no verdict


@dataclass
class Row:
    """One crash point in one durability mode, with its runs (several with repeat)."""

    durability: str
    point: str
    clean: dict
    runs: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # sent again: effectdrill/outbound.py

    def effects(self):
        names = dict.fromkeys(self.clean)
        for run in self.runs:
            names.update(dict.fromkeys(run.counts))
        return list(names)

    def judged(self):
        """The runs that reached a state of this row: only they can back a verdict."""
        return [run for run in self.runs if not run.unreached]

    def counts(self, effect):
        return [run.counts.get(effect, 0) for run in self.judged()]

    def duplicates(self):
        return [e for e in self.effects() if any(c > self.clean.get(e, 0) for c in self.counts(e))]

    def missing(self):
        return [e for e in self.effects() if any(c < self.clean.get(e, 0) for c in self.counts(e))]

    def failures(self):
        return [run.error for run in self.runs if run.error is not None]

    @property
    def verdict(self):
        words = [
            word
            for word, found in (
                ("DUPLICATE", self.duplicates()),
                ("MISSING", self.missing()),
                ("FAILED", self.failures()),
            )
            if found
        ]
        if not words and self.runs and not self.judged():
            return "not reached"
        return "+".join(words) or "ok"

    def as_json(self):
        return {
            "durability": self.durability,
            "point": self.point,
            "runs": len(self.runs),
            "threads": [run.thread for run in self.runs],
            "reached": [run.reached for run in self.runs],
            "saved": [run.saved for run in self.runs],
            "ran_on_recovery": [run.ran for run in self.runs],
            "counts": {effect: self.counts(effect) for effect in self.effects()},
            "clean": self.clean,
            "errors": self.failures(),
            "verdict": self.verdict,
            "requests": self.requests,
        }


class Report:
    """The drill's findings: rows, duplicates, missing effects, a table, assert_clean()."""

    def __init__(self, expect=None):
        self.rows = []
        self.clean = {}  # durability -> the clean run's counts
        self.reruns = {}  # durability -> {effect: (times, node, why)} a node's re-run repeated
        self.expect = expect or {}
        self.requests = None  # the HTTP observer's totals (effectdrill/outbound.py)

    @property
    def duplicates(self):
        return [self._finding(row, e, max) for row in self.rows for e in row.duplicates()]

    @property
    def missing(self):
        return [self._finding(row, e, min) for row in self.rows for e in row.missing()]

    @property
    def failed(self):
        return [
            {"durability": row.durability, "point": row.point, "error": error}
            for row in self.rows
            for error in row.failures()
        ]

    def clean_findings(self):
        """{effect: why} for each effect the clean run itself got wrong."""
        found = {}
        for mode, counts in self.clean.items():
            for effect, expected in self.expect.items():
                if counts.get(effect, 0) != expected and effect not in found:
                    found[effect] = f"counted {counts.get(effect, 0)}, expected {expected}"
            for effect, (_, node, why) in self.reruns.get(mode, {}).items():
                if effect not in self.expect and effect not in found:
                    found[effect] = f"{node} re-ran it {why}"
        return found

    @property
    def unreached(self):
        """The points no run reached (LangGraph waited on the save the kill held back)."""
        return [
            {"durability": row.durability, "point": row.point}
            for row in self.rows
            if row.verdict == "not reached"
        ]

    @property
    def repeated_in_clean_run(self):
        return list(self.clean_findings())

    @property
    def ok(self):
        uncounted = bool(self.requests and self.requests["not counted"])
        return (
            not (self.duplicates or self.missing or self.failed or self.repeated_in_clean_run)
            and not uncounted
        )

    def summary(self):
        return {
            "summary": True,
            "points": len(self.rows),
            "clean": next(iter(self.clean.values()), {}),
            "duplicates": self.duplicates,
            "missing": self.missing,
            "repeated_in_clean_run": self.repeated_in_clean_run,
            "failed": self.failed,
            "unreached": self.unreached,
            "requests": self.requests,
        }

    def table(self, width=None):
        """One table per durability mode, then a summary line; lines fit `width` (120) where
        the columns allow (long cells are cut with '…')."""
        blocks = []
        for mode, clean in self.clean.items():
            rows = [row for row in self.rows if row.durability == mode]
            effects = list(clean)
            for row in rows:
                effects += [e for e in row.effects() if e not in effects]
            header = ["point", "saved", "ran on recovery"]
            header += [f"{e}\n(clean {clean.get(e, 0)})" for e in effects] + ["verdict"]
            lines = [header]
            for row in rows:
                lines.append(
                    [
                        row.point,
                        distinct(run.saved for run in row.runs),
                        distinct(ran_cell(run.ran) for run in row.runs),
                        *(counts_cell(row.counts(e)) for e in effects),
                        verdict_cell(row),
                    ]
                )
            runs = f", {len(rows[0].runs)} runs each" if rows and len(rows[0].runs) > 1 else ""
            blocks.append(f"durability {mode}: {plural(len(rows), 'crash point')}{runs}\n")
            blocks[-1] += columns(lines, width or TABLE_WIDTH)
        requests = outbound.table(self, lambda lines: columns(lines, width or TABLE_WIDTH))
        return "\n\n".join(blocks + ([requests] if requests else []) + [self.summary_line()])

    def summary_line(self):
        parts = [plural(len(self.rows), "crash point")]
        for name, found in (("duplicate", self.duplicates), ("missing", self.missing)):
            effects = ", ".join(sorted({f["effect"] for f in found}))
            parts.append(f"{len(found)} {name}" + (f" ({effects})" if found else ""))
        parts.append(f"{len(self.failed)} failed resume" + ("" if len(self.failed) == 1 else "s"))
        if self.unreached:
            parts.append(f"{len(self.unreached)} not reached")
        wrong = self.clean_findings()
        parts.append(
            "the clean run repeated "
            + ", ".join(f"{effect} ({why})" for effect, why in wrong.items())
            if wrong
            else "clean run ok"
        )
        return "summary: " + ", ".join(parts) + outbound.summary_words(self.requests)

    def assert_clean(self):
        """Raise AssertionError with the table when an effect repeated or went missing."""
        if not self.ok:
            raise AssertionError("an effect repeated or went missing:\n" + self.table())
        return self

    @staticmethod
    def _finding(row, effect, pick):
        counts = row.counts(effect)
        clean = row.clean.get(effect, 0)
        differs = [c for c in counts if c != clean]
        return {
            "durability": row.durability,
            "point": row.point,
            "effect": effect,
            "count": pick(differs),
            "clean": clean,
            "runs": len(counts),
            "times": len([c for c in differs if (c > clean) == (pick is max)]),
        }


@dataclass(frozen=True)
class CrashState:
    """Where a crash child dies: just before the call `key`, after the calls in `wait` are
    saved; or, with `hold`, once every call of `group` started, those in `hold` unsaved."""

    label: str
    key: str | None
    wait: frozenset = frozenset()
    hold: frozenset = frozenset()
    group: frozenset = frozenset()
    parent_put: bool = False  # a put_writes: its checkpoint's put must be saved first


@dataclass
class Call:
    """One saver call of the clean run."""

    key: str  # the recorded label, numbered when it recurs: what a crash child matches
    kind: str  # "put" or "put_writes"
    group: tuple  # (invoke, namespace, checkpoint id it builds on): the calls saved side by side
    task_id: str = ""
    path: str = ""
    channels: str = ""
    ns: str = ""
    label: str = ""  # what the table shows (set once the clean run's task names are known)


@dataclass
class CleanRun:
    counts: dict
    calls: list
    reruns: dict  # {effect: (times, node, why)}: repeats of a node re-run (interrupt, retry)
    thread: str = ""

    def states(self, mode):
        """The crash states of this run: one per call, killed just before it. Under sync, a
        step that saves several put_writes side by side (a Send's tasks, parallel nodes, an
        entrypoint's @task calls) gets instead one state per set of them a kill can leave
        unsaved, all its tasks having run and the rest of its writes saved: every set for
        MAX_HELD writes or fewer, else each one alone and all of them."""
        states = []
        for call in self.calls:
            step = [c for c in self.calls if same_step(c, call)]
            if mode == "sync" and len(step) > 1:
                if call is step[-1]:  # in the order of their names: the same every run
                    step.sort(key=lambda c: c.label)
                    states += [held_state(unsaved, step) for unsaved in unsaved_sets(step)]
                continue
            earlier = self.calls[: self.calls.index(call)]  # a put: the writes of its step
            wait = frozenset(
                c.key for c in earlier if c.kind == "put_writes" and c.group == call.group
            )
            states.append(
                CrashState(call.label, call.key, wait, parent_put=call.kind == "put_writes")
            )
        seen = {}  # a label two states share (two held sets of like names): numbered
        for i, state in enumerate(states):
            seen[state.label] = seen.get(state.label, 0) + 1
            if seen[state.label] > 1:
                states[i] = replace(state, label=numbered(state.label, seen[state.label]))
        return states


@dataclass
class Plan:
    """What every run of one drill shares: the graph, its input, observer and answers."""

    graph: object
    input: object
    observe: object
    resume_with: object
    context: object
    run_id: str
    stores: object = None  # store_maker's: each run's store, or None (the graph's own)

    def __post_init__(self):
        self.is_async = needs_async(self.graph)
        self.loop = None  # event_loop(): the drill's one loop; a crash child makes its own

    def clean_run(self, db, mode):
        thread = f"drill-{self.run_id}-{mode}-clean"
        self.expect_nothing_yet(thread)
        recorder = Recorder()
        trace = Trace(self, thread, recorder)
        try:
            self.run(db, recorder, thread, mode, fresh=True, trace=trace)
        except DrillError:
            raise
        except Exception as error:
            raise DrillError(
                f"the graph failed in its clean run: {task_error(error)}{self.hint(error)}"
            ) from None
        name_calls(recorder.calls, trace.names)
        return CleanRun(self.counts(thread), recorder.calls, trace.reruns(), thread)

    def end_crash(self, db, mode, child, thread):
        """A crash run's second half: the child's end read, the thread resumed and observed.
        (Its thread is new: crash_all checked that the observer counts nothing on one.)"""
        reached = child.reached()
        if reached in (UNREACHED, GAVE_UP):  # the child died in a state of no row: no verdict
            saved = (
                NOT_REACHED
                if reached is UNREACHED
                else f"{NOT_REACHED} (held {HOLD_DEADLINE_S:.0f} s)"
            )
            return Run(False, saved, [], {}, None, thread, unreached=True)
        saved, ran, error = "?", [], None
        self.saved = "?"
        try:
            saved, ran = self.run(db, None, thread, mode, fresh=False)
        except DrillError:
            raise
        except Exception as failure:  # the resume itself failed: a finding, not a usage error
            saved, error = self.saved, task_error(failure)
        if not reached:
            saved = NOT_REACHED
        return Run(reached, saved, ran, self.counts(thread), error, thread)

    def run(self, db, recorder, thread, mode, fresh, trace=None):
        """Finish the thread on a saver of db; returns (what was saved at the start, the tasks
        that ran). Async graphs through asyncio and the async saver."""
        if self.is_async:  # on this process's one loop: a client's pooled connections stay
            run = self.afinish(db, recorder, thread, mode, fresh, trace)  # on it between runs
            return self.loop.run_until_complete(run) if self.loop else asyncio.run(run)
        with db.saver(recorder) as saver, self.store() as store:
            return self.finish(saver, thread, mode, fresh, trace, store)

    @contextmanager
    def event_loop(self):
        """One event loop for every async run of this process (the clean run, the resumes),
        as an application has: an httpx.AsyncClient made at import keeps its connections on
        the loop of its first request ("Event loop is closed" on the next asyncio.run)."""
        if not self.is_async:
            yield
            return
        self.loop = asyncio.new_event_loop()
        try:
            yield
        finally:
            loop, self.loop = self.loop, None
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def store(self):
        return self.stores.sync() if self.stores else nullcontext(None)

    def astore(self):
        return self.stores.asynchronous() if self.stores else nullcontext(None)

    def with_saver(self, saver, store):
        update = {"checkpointer": saver} | ({} if store is None else {"store": store})
        return self.graph.copy(update=update)

    def run_child(self, db, mode, state, thread, killer):
        """Fork a child that runs the graph and SIGKILLs itself at `state`: was it reached?"""
        return self.fork_child(db, mode, state, thread, killer).reached()

    def fork_child(self, db, mode, state, thread, killer):
        """Fork a child that runs the graph and SIGKILLs itself at `state`: its Child."""
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        # A Ctrl-C during fork() would land in an at-fork hook (logging's), which swallows it:
        # held back across the fork, it is delivered just after, in the code that handles it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 0
            try:
                gc.disable()  # it lives for one run: no collection touching the parent's pages
                self.loop = None  # not the drill's (its selector is the drill's): its own
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read_end)
                os.dup2(2, 1)  # the graph's prints go to stderr: stdout is the report's
                self.run(db, killer, thread, mode, fresh=True)
                code = CHILD_UNREACHED if killer.holding else 0
            except BaseException as error:
                os.write(write_end, task_error(error).encode()[:4000])
                code = CHILD_FAILED
            finally:
                os._exit(code)
        child = Child(pid, read_end, f"{state.label} ({mode})")
        try:  # a Ctrl-C held back lands here, where the child is killed and reaped with it
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(write_end)
        except BaseException:
            child.kill()
            raise
        return child

    def finish(self, saver, thread, mode, fresh, trace=None, store=None):
        """Run the thread to its end: the input first if fresh, else resume it. Returns what
        was saved when it started and the tasks that ran."""
        graph = self.with_saver(saver, store)
        config = {"configurable": {"thread_id": thread}}
        ran, saved = [], None
        for _ in range(MAX_INVOKES):
            if fresh or saver.get_tuple(config) is None:
                state = None
            else:
                state = graph.get_state(config, subgraphs=True)
            saved = self.saved = describe_saved(state) if saved is None else saved
            step = self.next_input(state, thread, fresh)
            if step is DONE:
                return saved, in_steps(ran)
            fresh = False
            if trace:
                trace.invoke_starts()
            with redirect_stdout(sys.stderr):  # the graph's own prints: stdout is the report's
                steps = {(): [first_step(state), False]}  # as LangGraph numbers them
                for chunk in self.stream(graph, step, config, mode, trace):
                    self.seen(chunk, ran, state, trace, steps)
        raise DrillError(f"the graph did not finish in {MAX_INVOKES} invokes (a loop?)")

    async def afinish(self, db, recorder, thread, mode, fresh, trace=None):
        """finish() for a graph of async nodes: astream, aget_state, an async saver."""
        async with db.asaver(recorder) as saver, self.astore() as store:
            graph = self.with_saver(saver, store)
            config = {"configurable": {"thread_id": thread}}
            ran, saved = [], None
            for _ in range(MAX_INVOKES):
                if fresh or await saver.aget_tuple(config) is None:
                    state = None
                else:
                    state = await graph.aget_state(config, subgraphs=True)
                saved = self.saved = describe_saved(state) if saved is None else saved
                step = self.next_input(state, thread, fresh)
                if step is DONE:
                    return saved, in_steps(ran)
                fresh = False
                if trace:
                    trace.invoke_starts()
                with redirect_stdout(sys.stderr):
                    steps = {(): [first_step(state), False]}
                    async for chunk in self.astream(graph, step, config, mode, trace):
                        self.seen(chunk, ran, state, trace, steps)
            raise DrillError(f"the graph did not finish in {MAX_INVOKES} invokes (a loop?)")

    def stream(self, graph, step, config, mode, trace=None):
        """One invoke's stream of task events (the clean run's counts taken in each task)."""
        config = trace.config(config) if trace else config
        return graph.stream(step, config, **self.stream_options(mode))

    def astream(self, graph, step, config, mode, trace=None):
        config = trace.config(config) if trace else config
        return graph.astream(step, config, **self.stream_options(mode))

    def stream_options(self, mode):
        # tasks: each task's start and result, with its id (a task whose writes were saved
        # before is replayed without a result: PregelLoop.output_writes, cached=True). Not
        # debug, which also sends every checkpoint's values: a cost per step, nothing we use.
        return dict(durability=mode, context=self.context, stream_mode="tasks", subgraphs=True)

    def seen(self, chunk, ran, state, trace, steps):
        """A task's start or result ("tasks" stream mode). A step's tasks all start before
        any of them ends (PregelLoop.tick emits them together), so a start after a result
        begins the next step of its namespace."""
        namespace, payload = chunk
        step = steps.setdefault(namespace, [0, False])
        if "result" not in payload and "error" not in payload:  # a start
            if step[1]:
                step[:] = [step[0] + 1, False]
            return
        step[1] = True
        where = "/".join(part.split(":")[0] for part in namespace)
        if trace:
            trace.task_result(namespace, payload)
        name = task_label(payload["id"], payload["name"], state)
        ran.append((len(namespace), step[0], f"{where}/{name}" if where else name))

    def next_input(self, state, thread, fresh):
        """The input of the next invoke: the input (fresh, or nothing saved), None to resume,
        Command(resume=...) at an interrupt, or DONE when no task is left."""
        from langgraph.types import Command

        if fresh or state is None:
            return with_thread(self.input, thread)
        tasks = state.tasks  # tasks, not next: see README.md
        if not tasks:
            return DONE
        waiting = [t for t in tasks if t.interrupts]
        if not waiting:
            return None
        if self.resume_with is None:
            raise DrillError(
                f"the graph stopped at interrupt() in {', '.join(t.name for t in waiting)}: "
                "give the answer to resume with (--resume-with JSON or MODULE:FUNC, or "
                "resume_with=)"
            )
        interrupts = [i for t in waiting for i in t.interrupts]
        return Command(resume=self.answer(interrupts))

    def answer(self, interrupts):
        if not callable(self.resume_with):
            if len(interrupts) > 1:
                raise DrillError(
                    f"{len(interrupts)} interrupts are pending at once and --resume-with is one "
                    "value: give MODULE:FUNC, called with the interrupts, returning "
                    "{interrupt id: answer}"
                )
            return self.resume_with
        try:
            answer = self.resume_with(interrupts)
        except Exception as error:
            raise DrillError(f"--resume-with raised {one_line(error)}") from None
        ids = {i.id for i in interrupts}
        if isinstance(answer, Mapping) and answer and set(answer) <= ids:
            return dict(answer)
        if len(interrupts) > 1:
            raise DrillError(
                f"--resume-with must answer {len(interrupts)} pending interrupts with "
                f"{{interrupt id: answer}} (ids {', '.join(sorted(ids))}), not {answer!r:.100}"
            )
        return answer

    def counts(self, thread):
        try:
            counts = self.observe(thread)
        except Exception as error:
            raise DrillError(f"the observer raised {one_line(error)}") from None
        if not isinstance(counts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in counts.items()
        ):
            raise DrillError(
                f"the observer must return a dict of effect name -> count, not {counts!r:.200}"
            )
        return dict(counts)

    def expect_nothing_yet(self, thread):
        counts = self.counts(thread)
        if any(counts.values()):
            fix = (
                "fix the observer: count only the effects tagged with the thread id it is given"
                if THREAD_MARK in repr(self.input)
                else "put {thread} in the input where the effects take their id from, and "
                "count by it in the observer"
            )
            raise DrillError(
                f"the observer counted effects for thread {thread} before it ran ({counts}): " + fix
            )

    def hint(self, error):
        """What to do about a clean run that failed, where the drill can tell."""
        if (
            self.stores is None
            and getattr(self.graph, "store", None) is None
            and isinstance(error, AttributeError | TypeError | KeyError)
            and uses_store(self.graph)
        ):
            return (
                " (the graph reads a store, which LangGraph's platform gives it and this run "
                "had none: give one with --store sqlite or --store MODULE:FUNC, store= in the "
                "library)"
            )
        if (
            self.context is None
            and getattr(self.graph, "context_schema", None) is not None
            and isinstance(error, AttributeError | TypeError | KeyError)
        ):
            name = getattr(self.graph.context_schema, "__name__", "a context")
            return (
                f" (the graph takes a runtime context, {name}: give it with --context "
                "MODULE:FUNC, or context= in the library)"
            )
        return ""


DONE = object()  # next_input: nothing left to run
UNREACHED = "unreached"  # Child.reached(): LangGraph waits on a held call (seen at once)
GAVE_UP = "gave up"  # Child.reached(): the held state did not come by HOLD_DEADLINE_S
NOT_REACHED = "point not reached"  # the saved cell of such a run


class Child:
    """A forked crash child: reached() waits for it (True when it died by its SIGKILL)."""

    def __init__(self, pid, pipe, where):
        self.pid, self.pipe, self.where = pid, pipe, where

    def reached(self):
        return judge_child(*self.wait(), self.where)

    def wait(self):
        """[wait status, what it wrote]; killed and reaped past CHILD_DEADLINE_S."""
        try:
            status = wait_child(self.pid, self.pipe)
            message = read_all(self.pipe)
        except BaseException:
            self.kill()
            raise
        self.close()
        return [status, message]

    def kill(self):
        kill_and_reap(self.pid)
        self.close()

    def close(self):
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None


def crash_all(plan, db, mode, jobs, warm):
    """Each (row, state, thread) job's crash run, appended to its row. The warm parent (forked
    before any run: the graph imported and built, nothing run yet) forks the crash children,
    CHILDREN_AT_ONCE of them running side by side, and reports how each ended, in the jobs'
    order; this process resumes each thread meanwhile. So two children run while the last
    one's thread resumes (a crash run's CPU is mostly the child's), its fork is not on this
    process's path, this process copies the pages it shares with a live child (copy-on-write)
    once, not at each run, and a child holds no connection a client pooled in this process's
    runs (a keep-alive socket, an async client's connections on this process's event loop)."""
    if not jobs:
        return
    plan.expect_nothing_yet(jobs[0][2])  # after the clean run's effects: a new thread counts 0
    warm.start(mode, [(state, thread) for _row, state, thread in jobs])
    for row, _state, thread in jobs:
        row.runs.append(plan.end_crash(db, mode, warm.next(), thread))


class WarmParent:
    """A process forked from the drill before its first run. It reads a mode's crash jobs
    (pickled), forks their children (CHILDREN_AT_ONCE at a time, in the jobs' order) and
    writes each one's wait status and message back in that order, one JSON line each. It leads
    a process group of its own, with its children: stop() kills them all at once (a Ctrl-C, an
    error)."""

    def __init__(self, plan, db):
        sys.stdout.flush()
        sys.stderr.flush()
        jobs_read, jobs_write = os.pipe()
        read_end, write_end = os.pipe()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # see fork_child
        pid = os.fork()
        if pid == 0:  # the warm parent: never returns into the caller's code
            code = 0
            try:
                os.setpgid(0, 0)  # its own group: a terminal's Ctrl-C reaches the drill only
                os.close(read_end)
                os.close(jobs_write)
                gc.disable()
                with os.fdopen(jobs_read, "rb") as incoming:
                    while batch := incoming.readline():
                        mode, jobs = pickle.loads(bytes.fromhex(batch.decode()))
                        live = deque()  # forked, not yet reaped: in the jobs' order
                        for state, thread in jobs:
                            if len(live) == CHILDREN_AT_ONCE:
                                report_end(live.popleft(), write_end)
                            killer = Killer(state, mode == "sync")
                            live.append(plan.fork_child(db, mode, state, thread, killer))
                        while live:
                            report_end(live.popleft(), write_end)
            except BaseException as error:
                os.write(write_end, (json.dumps([None, task_error(error)]) + "\n").encode())
                code = CHILD_FAILED
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)  # also here: stop() may come before the child's own call
        except (PermissionError, ProcessLookupError):
            pass  # it did it first (and may have run already)
        self.pid, self.where = pid, iter(())
        self.lines = os.fdopen(read_end, "rb")
        self.jobs = os.fdopen(jobs_write, "wb")
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(write_end)
            os.close(jobs_read)
        except BaseException:
            self.stop()
            raise

    def start(self, mode, jobs):
        """Hand it a mode's jobs: [(CrashState, thread)], forked in that order."""
        self.where = iter([f"{state.label} ({mode})" for state, _ in jobs])
        self.jobs.write(pickle.dumps((mode, jobs)).hex().encode() + b"\n")
        self.jobs.flush()

    def next(self):
        """The next crash child's ending: an Ended whose reached() says how it died."""
        where = next(self.where)
        line = self.lines.readline()
        if not line:
            raise DrillError(f"the drill's warm parent died before the crash run at {where}")
        status, message = json.loads(line)
        if status is None:
            raise DrillError(f"the crash run at {where} could not start: {message}")
        return Ended(status, message, where)

    def stop(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_and_reap(self.pid)
        for pipe in (self.lines, self.jobs):
            try:
                pipe.close()
            except OSError:
                pass


def report_end(child, pipe):
    """The warm parent's: wait for a crash child and write its end to the drill."""
    os.write(pipe, (json.dumps(child.wait()) + "\n").encode())


@contextmanager
def warm_parent(plan, db):
    warm = WarmParent(plan, db)
    try:
        yield warm
    finally:
        warm.stop()


class Ended:
    """A crash child reaped by the warm parent: its wait status and what it wrote."""

    def __init__(self, status, message, where):
        self.status, self.message, self.where = status, message, where

    def reached(self):
        return judge_child(self.status, self.message, self.where)


class Trace:
    """The clean run's tasks: their names by id, and which effects each made, so that a
    repeat made by a node re-run (after an interrupt, or by its RetryPolicy) can be told from
    counts that are simply more than one. The counts are taken in the task itself, as it
    starts and as it ends (TaskClock, LangChain's callbacks that LangGraph runs around each
    task), not when the stream's events are read: a subgraph's events can be read after the
    next task ran. What was counted since the last task ended is the ending task's; a
    subgraph's task ends before its parent's task holding it, so its effects are its own
    (`child/send`), not its parent node's."""

    def __init__(self, plan, thread, recorder):
        self.plan = plan
        self.thread = thread
        self.recorder = recorder
        self.names = {}  # task id -> name
        self.invokes = []  # per invoke: {task id: {effect: count}}, attempts, interrupted ids
        self.last = {}
        self.lock = threading.Lock()  # tasks side by side end on their own threads

    def invoke_starts(self):
        self.last = self.plan.counts(self.thread)
        self.recorder.invoke = len(self.invokes)
        self.invokes.append({"own": {}, "interrupted": set(), "names": {}, "attempts": {}})

    def config(self, config):
        """The invoke's config, with the TaskClock that counts in each task."""
        return config | {"callbacks": [task_clock(self)]}

    def attempt_starts(self, task):
        """Task `task` (an id) starts an attempt (a retry by its RetryPolicy is another)."""
        with self.lock:
            self.invokes[-1]["attempts"].setdefault(task, []).append(
                [self.plan.counts(self.thread), None]
            )

    def attempt_ends(self, task):
        """It returned or raised (an interrupt, a failure its RetryPolicy retries)."""
        with self.lock:
            invoke = self.invokes[-1]
            now = self.plan.counts(self.thread)
            own = invoke["own"].setdefault(task, {})
            for effect, count in now.items():
                if count > self.last.get(effect, 0):
                    own[effect] = own.get(effect, 0) + count - self.last.get(effect, 0)
            self.last = now
            attempts = invoke["attempts"].get(task)
            if attempts:
                attempts[-1][1] = now

    def task_result(self, namespace, payload):
        """A task's result read off the stream: its name and whether it was interrupted."""
        self.names[payload["id"]] = payload["name"]
        invoke = self.invokes[-1]
        where = "/".join(part.split(":")[0] for part in namespace)
        name = f"{where}/{payload['name']}" if where else payload["name"]
        invoke["names"][payload["id"]] = name
        if payload.get("interrupts"):
            invoke["interrupted"].add(payload["id"])

    def reruns(self):
        """{effect: (times, node, why)}: what a task made before its interrupt and again when
        the resume re-ran it from its first line, or in an attempt that failed and again in a
        later attempt of the same task (its RetryPolicy's)."""
        found = {}
        for before, after in itertools.pairwise(self.invokes):
            for task in before["interrupted"]:
                if task not in after["own"]:
                    continue
                for effect, count in before["own"].get(task, {}).items():
                    again = min(count, after["own"][task].get(effect, 0))
                    if again:
                        times = found.get(effect, (0,))[0] + again
                        found[effect] = (times, before["names"][task], "after an interrupt")
        for effect, (times, node) in self.retry_repeats().items():
            if effect not in found:
                found[effect] = (times, node, "on a retry, by its RetryPolicy")
        return found

    def retry_repeats(self):
        """{effect: (times, node)}: made by an attempt that failed and again by a later one."""
        found = {}
        for invoke in self.invokes:
            for task, attempts in invoke["attempts"].items():
                made = [
                    {e: n - start.get(e, 0) for e, n in end.items() if n > start.get(e, 0)}
                    for start, end in attempts
                    if end is not None
                ]
                for i, failed in enumerate(made[:-1]):
                    for effect, count in failed.items():
                        again = min(count, sum(later.get(effect, 0) for later in made[i + 1 :]))
                        if again:
                            times = found.get(effect, (0, ""))[0] + again
                            found[effect] = (times, invoke["names"].get(task, "?"))
        return found


def task_of(metadata):
    """The id of the task a LangChain run belongs to, from the metadata LangGraph gives each
    task's config (`langgraph_checkpoint_ns`, "NODE:TASK_ID", a subgraph's task's
    "PARENT:ID|NODE:TASK_ID": prepare_single_task in langgraph/pregel/_algo.py), or None."""
    namespace = (metadata or {}).get("langgraph_checkpoint_ns") or ""
    last = namespace.split("|")[-1]
    return last.split(":", 1)[1] if ":" in last else None


def task_clock(trace):
    """A TaskClock for `trace` (its class made here: LangChain comes with LangGraph, imported
    when a graph is drilled, not with this module)."""
    callbacks = importlib.import_module("langchain_core.callbacks")  # langgraph depends on it

    class TaskClock(callbacks.BaseCallbackHandler):
        """LangChain callbacks that LangGraph runs in each task, in the task's own thread (or
        coroutine) as it starts and ends: a task's outermost run (RunnableSeq._start in
        langgraph/_internal/_runnable.py) is an attempt of it; the runs inside it are not."""

        run_inline = True  # in the task's coroutine too, not on an executor thread
        raise_error = True  # an observer that raised stops the drill (DrillError)

        def __init__(self):
            self.runs, self.attempts = {}, set()

        def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, **kw):
            task = task_of(kw.get("metadata"))
            if task is None:
                return
            self.runs[run_id] = task
            if self.runs.get(parent_run_id) != task:  # the task's outermost run: an attempt
                self.attempts.add(run_id)
                trace.attempt_starts(task)

        def on_chain_end(self, outputs, *, run_id, **kw):
            self.ended(run_id)

        def on_chain_error(self, error, *, run_id, **kw):
            self.ended(run_id)

        def ended(self, run_id):
            if run_id in self.attempts:
                self.attempts.discard(run_id)
                trace.attempt_ends(self.runs[run_id])

    return TaskClock()


# helpers


class Recording:
    """Saver mixin: tells its recorder about each put and put_writes, before and after it."""

    recorder = None

    def put(self, config, checkpoint, metadata, new_versions):
        if self.recorder is None:
            return super().put(config, checkpoint, metadata, new_versions)
        key = self.recorder.before(put_call(config, metadata))
        saved = super().put(config, checkpoint, metadata, new_versions)
        self.recorder.after(key, (parent(config)[0], checkpoint["id"]))
        return saved

    def put_writes(self, config, writes, task_id, task_path=""):
        if self.recorder is None:
            return super().put_writes(config, writes, task_id, task_path)
        key = self.recorder.before(writes_call(config, writes, task_id, task_path))
        super().put_writes(config, writes, task_id, task_path)
        self.recorder.after(key)

    async def aput(self, config, checkpoint, metadata, new_versions):
        if self.recorder is None:
            return await super().aput(config, checkpoint, metadata, new_versions)
        key = await self.recorder.abefore(put_call(config, metadata))
        saved = await super().aput(config, checkpoint, metadata, new_versions)
        self.recorder.after(key, (parent(config)[0], checkpoint["id"]))
        return saved

    async def aput_writes(self, config, writes, task_id, task_path=""):
        if self.recorder is None:
            return await super().aput_writes(config, writes, task_id, task_path)
        key = await self.recorder.abefore(writes_call(config, writes, task_id, task_path))
        await super().aput_writes(config, writes, task_id, task_path)
        self.recorder.after(key)


class Counter:
    """Numbers a recurring label: `put step 2`, then `put step 2 #2` (a loop)."""

    def __init__(self):
        self.seen = {}

    def number(self, call):
        self.seen[call.key] = self.seen.get(call.key, 0) + 1
        call.key = numbered(call.key, self.seen[call.key])
        return call.key


class Recorder(Counter):
    """Collects the saver calls of a clean run, in order, each with its invoke (Trace)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.invoke = 0
        self.lock = threading.Lock()  # async durability saves from LangGraph's worker threads

    def before(self, call):
        with self.lock:
            key = self.number(call)
            call.group = (self.invoke, *call.group[1:])
            self.calls.append(call)
            return key

    async def abefore(self, call):
        return self.before(call)

    def after(self, key, checkpoint=None):
        pass


class Killer(Counter):
    """In a crash child: SIGKILL this process at its CrashState.

    Under sync (settle=True) it first lets the calls finish that LangGraph started earlier
    on other threads and does not wait for (PregelLoop.put_writes and _put_checkpoint submit
    them to the run's BackgroundExecutor, langgraph/pregel/_loop.py and _executor.py): the
    put_writes calls of the same step, and before a put_writes, the put of the checkpoint it
    is for. Any other call that starts meanwhile is held: it never finishes. A held state
    (CrashState.hold) holds those calls and dies once the rest of their step is saved.
    """

    def __init__(self, state, settle=False):
        super().__init__()
        self.state = state
        self.settle = settle
        self.armed = False  # about to kill: calls it does not wait for are held
        self.holding = False
        self.step_of = None  # (namespace, checkpoint id) the held step's writes are for
        self.done = set()  # keys of the calls finished
        self.started = set()
        self.puts = set()  # (namespace, checkpoint id) of every put finished
        self.changed = threading.Condition()
        self.async_changed = None
        self.held_keys = set()
        self.ours = set()  # idents of the Killer's own threads (the watchdog's is its own)
        self.watching = False

    def before(self, call):
        with self.changed:
            key, action = self.decide(call)
            if action == "go":
                return key
            if action == "kill":
                self.changed.wait_for(lambda: self.settled(call), SETTLE_DEADLINE_S)
                die()
            self.held_keys.add(key)
            self.watch()
        threading.Event().wait()  # held: this call never finishes (the process dies first)

    async def abefore(self, call):
        with self.changed:
            key, action = self.decide(call)
        if action == "go":
            return key
        if action == "kill":
            deadline = time.monotonic() + SETTLE_DEADLINE_S
            self.async_changed = self.async_changed or asyncio.Event()
            while not self.settled(call) and time.monotonic() < deadline:
                self.async_changed.clear()
                try:
                    await asyncio.wait_for(self.async_changed.wait(), SETTLE_DEADLINE_S)
                except TimeoutError:
                    break
            die()
        with self.changed:
            self.held_keys.add(key)
            self.watch()
        await asyncio.Event().wait()  # held: this call never finishes

    def decide(self, call):
        """ "go", "kill" (once settled) or "hold" for this call; kills at once unsettled."""
        key = self.number(call)
        self.started.add(key)
        state = self.state
        if key == state.key:
            self.armed = True
            if not self.settle:
                die()
            self.parent = call.group[1:]
            return key, "kill"
        if self.armed and key not in state.wait and not self.parent_pending(call):
            return key, "hold"
        if key in state.hold:
            self.step_of = call.group[1:]
            self.start_holding()
            return key, "hold"
        if (
            self.holding
            and key not in state.group
            and self.step_of in self.puts
            and not inside(call.group[1], self.step_of[0])
        ):
            return key, "hold"  # a later call: the state is the step's, nothing after it
        return key, "go"

    def watch(self):
        """Start the watchdog (once): it ends the child at once, as unreached, when LangGraph
        waits for a held call, which can never finish (see waits_for_held)."""
        if not self.watching:
            self.watching = True
            threading.Thread(target=self.watchdog, daemon=True).start()

    def watchdog(self):
        """WATCH_LOOKS looks in a row, no saver call started or finished between them, every
        call started either finished or held, and every other thread blocked: LangGraph waits
        on a held save (an error handler's input, schedule_error_handler in langgraph/pregel/
        _loop.py; a subgraph's checkpoint, which its parent's stream waits for; every save at
        BackgroundExecutor.__exit__, langgraph/pregel/_executor.py), which never finishes."""
        looks, last = 0, None
        while True:
            with self.changed:
                progress = (len(self.started), len(self.done))
                in_flight = self.started - self.done - self.held_keys
            stuck = not in_flight and all_blocked(self.ours)
            looks = looks + 1 if stuck and progress == last else 0
            if looks >= WATCH_LOOKS:
                os._exit(CHILD_UNREACHED)
            last = progress
            time.sleep(WATCH_EVERY_S)

    def parent_pending(self, call):
        """A put while the put_writes about to be killed waits for its checkpoint's put."""
        return call.kind == "put" and self.state.parent_put and self.parent not in self.puts

    def start_holding(self):
        if not self.holding:
            self.holding = True
            timer = threading.Timer(HOLD_DEADLINE_S, os._exit, (CHILD_GAVE_UP,))
            timer.daemon = True
            timer.start()
            self.ours.add(timer.ident)
        self.check_step()

    def check_step(self):
        """A held state dies once every call of its step started, the unheld ones and the
        step's checkpoint saved."""
        state = self.state
        if (
            state.group <= self.started
            and state.group - state.hold <= self.done
            and (self.step_of[1] is None or self.step_of in self.puts)
        ):
            die()

    def settled(self, call):
        if not self.state.wait <= self.done:
            return False
        _, namespace, checkpoint = call.group
        if not self.state.parent_put or checkpoint is None:
            return True
        return (namespace, checkpoint) in self.puts

    def after(self, key, checkpoint=None):
        with self.changed:
            self.done.add(key)
            if checkpoint is not None:
                self.puts.add(checkpoint)
            self.changed.notify_all()
            if self.holding:
                self.check_step()
        if self.async_changed is not None:
            self.async_changed.set()


def judge_child(status, message, where):
    """How a crash child ended: True (killed at its point), False (the run ended without it),
    UNREACHED / GAVE_UP (held saves LangGraph waited on), or a DrillError (the graph raised)."""
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == CHILD_UNREACHED:
        return UNREACHED  # LangGraph waited on a held call: the state cannot be made
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == CHILD_GAVE_UP:
        return GAVE_UP  # the same, seen only by the deadline (an async graph, say)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return False  # the run ended without that call (async saves vary)
    raise DrillError(f"the graph failed in the crash run at {where}: {message}")


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def inside(namespace, outer):
    """Whether a saver call's namespace is a subgraph's within `outer`: a task of the held
    step runs it, so the step's own writes wait for it (it is not a later call)."""
    return len(namespace) > len(outer) and namespace.startswith(outer)


def all_blocked(ours=()):
    """Whether every other thread of this process waits in a blocking primitive with no
    timeout: a lock, a condition or an event of threading.py (a held save waits in one;
    LangGraph waits for a save in Future.result or concurrent.futures.wait, and for its stream
    queue, which wait in one), or an idle pool worker. Then nothing can go on: no node runs (a
    node that sleeps, sends or computes is in its own code, or in a socket's, not in these), no
    save is made. Read from the threads' frames: the innermost Python frame of each."""
    if threading._limbo:  # a thread started and not yet running (threading.py's own table)
        return False
    ours = {threading.get_ident(), *ours}  # the watchdog, the hold's deadline timer
    for ident, frame in sys._current_frames().items():
        if ident not in ours and not blocked(frame):
            return False
    return True


THREADING = os.sep + "threading.py"
IDLE_WORKER = os.path.join("concurrent", "futures", "thread.py")
SELECTORS = os.sep + "selectors.py"
AIOSQLITE = os.path.join("aiosqlite", "core.py")


def blocked(frame):
    """A thread's innermost frame waits with no end of its own: a threading.py wait or acquire
    with no timeout (a timed one ends by itself: a poll), an idle pool worker, an idle event
    loop, or an idle aiosqlite connection's worker."""
    code, local = frame.f_code, frame.f_locals
    if code.co_filename.endswith(IDLE_WORKER):  # and nothing queued it has yet to take
        return code.co_name == "_worker" and getattr(local.get("work_queue"), "empty", bool)()
    if code.co_filename.endswith(SELECTORS):
        return idle_loop(code, local)
    if code.co_filename.endswith(AIOSQLITE):  # waits in tx.get() for a call, none queued
        return (
            code.co_name == "_connection_worker_thread"
            and "tx.get()" in linecache.getline(code.co_filename, frame.f_lineno)
            and getattr(local.get("tx"), "empty", bool)()
        )
    if not code.co_filename.endswith(THREADING):
        return False
    if code.co_name not in ("wait", "wait_for", "acquire", "_wait_for_tstate_lock"):
        return False
    waiter = local.get("waiter")  # Condition.wait's: released when notified (it will run)
    if waiter is not None and not waiter.locked():
        return False
    timeout = local.get("timeout")
    return timeout is None or (code.co_name == "_wait_for_tstate_lock" and timeout == -1)


def idle_loop(code, local):
    """An asyncio event loop in its selector's select() with nothing to wait for: no timeout
    (BaseEventLoop._run_once passes None when no callback is ready and no timer is scheduled;
    EpollSelector.select makes it -1) and no socket but the loop's own wake-up pipe
    (_UnixSelectorEventLoop's self-pipe, registered first): only another thread can wake it."""
    if code.co_name != "select" or local.get("timeout") not in (None, -1):
        return False
    selector = local.get("self")
    return selector is not None and len(selector.get_map()) <= 1


def numbered(label, occurrence):
    return label if occurrence == 1 else f"{label} #{occurrence}"


def parent(config):
    """The checkpoint a call builds on: a put's previous one, the one a task's writes are for."""
    configurable = config.get("configurable", {})
    return configurable.get("checkpoint_ns", ""), configurable.get("checkpoint_id")


def put_call(config, metadata):
    key = f"put step {metadata.get('step')}{namespace(config)}"
    return Call(key, "put", (0, *parent(config)), ns=namespace(config))


def writes_call(config, writes, task_id, task_path):
    channels = ", ".join(sorted({channel for channel, _ in writes}))
    node = task_path.removeprefix(PULL_PREFIX)
    if ", node_error_handler" in node:  # the handler of a node that failed: its own task
        node = node.split(", ")[0] + " (error handler)"
    key = f"put_writes {node} [{channels}]".replace("  ", " ") + namespace(config)
    group = (0, *parent(config))
    return Call(key, "put_writes", group, task_id, task_path, channels, namespace(config))


def same_step(a, b):
    """put_writes calls of one step of one invoke: LangGraph saves them side by side."""
    return a.kind == b.kind == "put_writes" and a.group == b.group


def held_state(unsaved, step):
    return CrashState(
        held_label(unsaved, step),
        None,
        hold=frozenset(c.key for c in unsaved),
        group=frozenset(c.key for c in step),
    )


def unsaved_sets(step):
    """The sets of a step's writes a kill can leave unsaved with the others saved: each
    non-empty set (MAX_HELD writes or fewer), else each one alone and all of them."""
    if len(step) <= MAX_HELD:
        sets = [s for n in range(1, len(step) + 1) for s in itertools.combinations(step, n)]
    else:
        sets = [(c,) for c in step] + [tuple(step)]
    return sets


def held_label(unsaved, step):
    if len(unsaved) == 1:
        names = unsaved[0].label.removeprefix("put_writes ")
    else:
        names = " + ".join(c.label.removeprefix("put_writes ").split(" [")[0] for c in unsaved)
    if len(unsaved) == len(step):
        return f"put_writes {names} (none saved)"
    return f"put_writes {names} (others saved)"


def name_calls(calls, names):
    """Each call's label: `put_writes NODE [channels]`, or for a Send's task or an @task call
    `put_writes NAME (Send 2 of 3) [channels]` / `(call 1 of 2)`, numbered when it recurs."""
    kinds = {}
    for call in calls:
        if call.kind == "put_writes" and call.path.startswith(PUSH_PREFIX):
            parts = call.path.split(", ")
            kind = "call" if parts[1].startswith("~") else "Send"
            index = int(parts[-2] if kind == "call" else parts[1])
            name = names.get(call.task_id, "?")
            kinds[call.key] = (kind, index, name)
    seen = {}
    for call in calls:
        label = call.key.split(" #")[0]
        if call.key in kinds:
            kind, index, name = kinds[call.key]
            siblings = sorted(
                kinds[c.key][1]
                for c in calls
                if c.key in kinds and c.group == call.group and kinds[c.key][::2] == (kind, name)
            )
            nth = (
                kind
                if len(siblings) == 1
                else f"{kind} {siblings.index(index) + 1} of {len(siblings)}"
            )
            nth = "@task" if nth == "call" else nth
            label = f"put_writes {name} ({nth}) [{call.channels}]{call.ns}"
        seen[label] = seen.get(label, 0) + 1
        call.label = numbered(label, seen[label])


def task_label(task_id, name, state):
    """A task's name, with its Send's index among its node's Sends in `state` when known."""
    tasks = [t for t in (state.tasks if state else ()) if t.name == name]
    sends = sorted(t.path[1] for t in tasks if len(t.path) >= 2 and isinstance(t.path[1], int))
    mine = [t for t in tasks if t.id == task_id and len(t.path) >= 2 and isinstance(t.path[1], int)]
    if not mine or len(sends) < 2:
        return name
    return f"{name} (Send {sends.index(mine[0].path[1]) + 1} of {len(sends)})"


def namespace(config):
    """' in SUBGRAPH' for a subgraph's saves, without the task ids (they differ run to run)."""
    ns = config.get("configurable", {}).get("checkpoint_ns", "")
    return f" in {'/'.join(part.split(':')[0] for part in ns.split('|'))}" if ns else ""


def describe_saved(state):
    """'nothing', or 'step N: TASK, ...', a subgraph's own saved step in brackets."""
    if state is None:
        return "nothing"
    return f"step {state.metadata.get('step')}: " + (describe_tasks(state) or "done")


def describe_tasks(state):
    cells = []
    for task in state.tasks:
        cell = task_label(task.id, task.name, state)
        if task.result is not None:
            cell += " (writes saved)"
        inner = getattr(task, "state", None)
        if inner is not None and hasattr(inner, "metadata") and inner.metadata:
            cell += f" [{describe_saved(inner)}]"
        cells.append(cell)
    return ", ".join(cells)


def with_thread(value, thread):
    if isinstance(value, str):
        return value.replace(THREAD_MARK, thread)
    if isinstance(value, dict):
        return {with_thread(k, thread): with_thread(v, thread) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(with_thread(v, thread) for v in value)
    return value


def task_error(error):
    """'node NAME: Type: message' from LangGraph's note on a task's exception."""
    notes = " ".join(getattr(error, "__notes__", []))
    node = re.search(r"During task with name '([^']*)'", notes)
    return (f"node {node.group(1)}: " if node else "") + one_line(error)


def one_line(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def require_posix():
    if os.name != "posix" or not hasattr(os, "fork"):
        raise DrillError(
            "effectdrill needs POSIX fork() and SIGKILL: on Windows run it under WSL or in a "
            "Linux container"
        )


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
    return dict(expect)


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


def uses_store(graph):
    """Whether a node of the graph (or a subgraph's) takes a `store` argument or calls
    get_store(): LangGraph injects the graph's store into either (None without one)."""
    import inspect

    for runnable in runnables(graph):
        for function in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
            if function is None:
                continue
            try:
                if "store" in inspect.signature(function).parameters:
                    return True
                if "get_store" in inspect.getsource(function):
                    return True
            except (TypeError, ValueError, OSError):
                continue
    return False


def runnables(graph):
    """Every runnable a graph runs, its subgraphs' and sequences' steps included, once each."""
    from langgraph.pregel import Pregel

    pending, seen = [graph], set()
    while pending:
        runnable = pending.pop()
        if id(runnable) in seen:
            continue
        seen.add(id(runnable))
        if isinstance(runnable, Pregel):
            pending += [node.bound for node in runnable.nodes.values()]
            continue
        yield runnable
        pending += [s for s in getattr(runnable, "steps", ()) if s is not None]


class StoreMaker:
    """Each run's store: "sqlite" (a SqliteStore, or AsyncSqliteStore for async graphs, on one
    file every run shares) or a function of the user's returning a store."""

    def __init__(self, spec, folder):
        self.spec, self.path = spec, os.path.join(folder, "store.sqlite") if folder else None

    @contextmanager
    def sync(self):
        if callable(self.spec):
            yield self.made()
            return
        from langgraph.store.sqlite import SqliteStore

        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            store = SqliteStore(conn)
            store.setup()
            yield store
        finally:
            conn.close()

    @asynccontextmanager
    async def asynchronous(self):
        if callable(self.spec):
            yield self.made()
            return
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        async with AsyncSqliteStore.from_conn_string(self.path) as store:
            await store.setup()
            yield store

    def made(self):
        try:
            return self.spec()
        except Exception as error:
            raise DrillError(f"--store raised {one_line(error)}") from None


@contextmanager
def store_maker(spec):
    """drill(store=...): None, "sqlite" (a temporary file, removed after) or a function."""
    if spec is None:
        yield None
        return
    if spec != "sqlite" and not callable(spec):
        raise DrillError(f"store must be 'sqlite' or a function returning a store, not {spec!r}")
    folder = tempfile.mkdtemp(prefix="effectdrill-store-") if spec == "sqlite" else None
    try:
        yield StoreMaker(spec, folder)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def needs_async(graph):
    """Whether a node (or a subgraph's) is `async def` only: LangGraph's RunnableCallable
    then has no func, and invoke() raises 'No synchronous function provided'."""
    return any(
        hasattr(runnable, "afunc") and getattr(runnable, "func", True) is None
        for runnable in runnables(graph)
    )


def wait_child(pid, pipe):
    """The child's wait status, or DrillError past the deadline (the caller kills it then).
    The child holds the pipe's other end: its end of file is the child's end."""
    deadline = time.monotonic() + CHILD_DEADLINE_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DrillError(f"a crash run took more than {CHILD_DEADLINE_S:.0f} s")
        ready, _, _ = select.select([pipe], [], [], remaining)
        if ready:
            return os.waitpid(pid, 0)[1]


def kill_and_reap(pid):
    """SIGKILL the child and wait for it, unless it is gone already."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@contextmanager
def database(target):
    """The drill's checkpoint database: a temporary SQLite file (removed after) or the target."""
    if target is not None and type(target).__name__ == "InMemorySaver":
        target = ":memory:"
    if target is not None and not isinstance(target, str | os.PathLike):
        raise DrillError(f"checkpoint_db must be a SQLite path or a postgresql:// URL: {target!r}")
    target = None if target is None else os.fspath(target)
    if target is not None and target.strip() in MEMORY_DATABASES:
        raise DrillError(
            "an in-memory checkpoint database dies with the killed process, so nothing could be "
            "resumed: give a SQLite file path or a postgresql:// URL, or none for a temporary file"
        )
    folder = None
    try:
        if target is None:
            folder = tempfile.mkdtemp(prefix="effectdrill-")
            target = os.path.join(folder, "checkpoints.sqlite")
        db = (
            Postgres(target)
            if target.startswith(("postgresql://", "postgres://"))
            else Sqlite(target)
        )
        db.check()
        yield db
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class Sqlite:
    """LangGraph's SqliteSaver (AsyncSqliteSaver) on a file: each saver() is a new connection."""

    def __init__(self, path):
        self.path = path

    def check(self):
        try:
            with self.saver(setup_done=False) as saver:
                saver.setup()
        except sqlite3.Error as error:
            raise DrillError(f"cannot open the SQLite database {self.path}: {error}") from None

    @contextmanager
    def saver(self, recorder=None, setup_done=True):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self.path, check_same_thread=False)
        # No fsync: the drill's crash is a killed process, and SQLite keeps a committed
        # transaction through that with synchronous=OFF (only an OS crash or power loss can
        # lose it: sqlite.org/pragma.html#pragma_synchronous).
        conn.execute("PRAGMA synchronous=OFF")
        try:
            saver = recording(SqliteSaver)(conn)
            saver.is_setup = setup_done  # check() made the tables: once is enough
            saver.recorder = recorder
            yield saver
        finally:
            conn.close()

    @asynccontextmanager
    async def asaver(self, recorder=None):
        try:  # on aiosqlite, a dependency of langgraph-checkpoint-sqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError:
            raise DrillError(
                "a graph of async nodes needs aiosqlite for its SQLite checkpoints: "
                "pip install aiosqlite"
            ) from None
        async with recording(AsyncSqliteSaver).from_conn_string(self.path) as saver:
            await saver.conn.execute("PRAGMA synchronous=OFF")  # as saver() above
            saver.is_setup = True
            saver.recorder = recorder
            yield saver


class Postgres:
    """LangGraph's PostgresSaver (AsyncPostgresSaver): each saver() is a new connection."""

    def __init__(self, url):
        self.url = url

    def check(self):
        saver_class()  # first: it says what to install
        import psycopg  # a dependency of langgraph-checkpoint-postgres

        try:
            with self.saver() as saver:
                saver.setup()  # PostgresSaver's docstring: setup() is the caller's to call
        except psycopg.Error as error:
            shown = hide_password(self.url)
            raise DrillError(f"cannot open the database {shown}: {one_line(error)}") from None

    @contextmanager
    def saver(self, recorder=None):
        with recording(saver_class()).from_conn_string(self.url) as saver:
            saver.recorder = recorder
            yield saver

    @asynccontextmanager
    async def asaver(self, recorder=None):
        saver_class()
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with recording(AsyncPostgresSaver).from_conn_string(self.url) as saver:
            saver.recorder = recorder
            yield saver


def saver_class():
    """LangGraph's PostgresSaver, or a DrillError that says what to install."""
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise DrillError(
            "a postgresql:// checkpoint database needs langgraph-checkpoint-postgres: "
            "pip install 'effectdrill[postgres]'"
        ) from None
    return PostgresSaver


_RECORDING = {}


def recording(saver_class):
    """saver_class with the Recording mixin (made once per class)."""
    if saver_class not in _RECORDING:
        _RECORDING[saver_class] = type(f"Drill{saver_class.__name__}", (Recording, saver_class), {})
    return _RECORDING[saver_class]


def hide_password(url):
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


TABLE_WIDTH = 120  # columns a table fits in, where its effect columns leave space
SHRINKABLE = (0, 1, 2)  # point, saved, ran on recovery: wrapped first, the widest first
MIN_CELLS = (28, 18, 18)  # a wrapped point, saved, ran column keeps at least this many
MIN_VERDICT = 20  # and the verdict


def columns(lines, width=TABLE_WIDTH):
    """Align the cells; a row too wide wraps its longest text cells onto more lines."""
    widths = [
        max(len(part) for line in lines for part in line[i].split("\n"))
        for i in range(len(lines[0]))
    ]
    least = dict(zip(SHRINKABLE, MIN_CELLS, strict=True)) | {len(widths) - 1: MIN_VERDICT}
    for i in least:  # never narrower than a column's longest word on a continuation line (its
        #   two spaces' indent before it): no cell breaks mid-word
        words = [len(w) + 2 for line in lines for w in line[i].split()]
        least[i] = min(widths[i], max([least[i], *words]))
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i in least if widths[i] > least[i]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i] - least[i])] -= 1
    out = []
    for line in lines:
        cells = [wrap(cell, w) for cell, w in zip(line, widths, strict=True)]
        for parts in itertools.zip_longest(*cells, fillvalue=""):
            out.append("  ".join(p.ljust(w) for p, w in zip(parts, widths, strict=True)).rstrip())
    return "\n".join(out)


def wrap(cell, width):
    """The cell in lines of `width` or fewer, broken after a space where it can be."""
    if "\n" in cell:
        return [part for piece in cell.split("\n") for part in wrap(piece, width)]
    lines = []
    while len(cell) > width:
        start = len(cell) - len(cell.lstrip())  # a continuation's indent is no place to break
        cut_at = cell.rfind(" ", start + 1, width + 1)
        if cut_at <= start:
            cut_at = width
        lines.append(cell[:cut_at].rstrip())
        cell = "  " + cell[cut_at:].lstrip()  # a continuation, indented
    return [*lines, cell]


def distinct(values):
    """The different values of a row's runs, in order: 'a | b' when the runs differ."""
    return " | ".join(dict.fromkeys(values))


def first_step(state):
    """The step an invoke's first tasks run as: the saved checkpoint's plus one (0 fresh)."""
    step = state.metadata.get("step") if state is not None and state.metadata else None
    return 0 if step is None else step + 1


def in_steps(ran):
    """The names of (depth, step, name) in order of steps, by name within one (the tasks of a
    step finish in any order)."""
    return [
        name
        for _, group in itertools.groupby(ran, key=lambda r: r[:2])
        for name in sorted(r[2] for r in group)
    ]


def ran_cell(ran):
    """'a, b ×3, c': the tasks a recovery ran, a run of one name counted."""
    if not ran:
        return "-"
    cells = []
    for name, group in itertools.groupby(ran):
        times = len(list(group))
        cells.append(name if times == 1 else f"{name} ×{times}")
    return ", ".join(cells)


def counts_cell(counts):
    """'1 2 1' for a few runs; '1×3 2×2' when that is shorter."""
    if not counts:
        return "-"
    plain = " ".join(map(str, counts))
    tallied = " ".join(f"{c}×{counts.count(c)}" for c in dict.fromkeys(counts))
    return plain if len(plain) <= len(tallied) else tallied


def plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def verdict_cell(row):
    if row.verdict in ("ok", "not reached"):
        return row.verdict
    details = []
    for word, effects in (("DUPLICATE", row.duplicates()), ("MISSING", row.missing())):
        for effect in effects:
            clean = row.clean.get(effect, 0)
            counts = row.counts(effect)
            hits = [c for c in counts if (c > clean if word == "DUPLICATE" else c < clean)]
            times = f" in {len(hits)} of {len(counts)}" if len(counts) > 1 else ""
            details.append(f"{word} {effect}{times}")
    details += [f"FAILED: {error}" for error in row.failures()[:1]]
    return "; ".join(details)
