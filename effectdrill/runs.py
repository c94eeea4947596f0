"""Plan: what every run of one drill shares, and a run itself: the input, then a resume per
interrupt (or after a crash) until no task is left, streamed to see which tasks ran."""

import asyncio
import itertools
import sys
from collections.abc import Mapping
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass

from effectdrill.errors import DrillError, one_line, safe
from effectdrill.introspect import needs_async, probe, uses_store
from effectdrill.kill import HOLD_DEADLINE_S
from effectdrill.plan import (
    CleanRun,
    Recorder,
    describe_saved,
    in_step_order,
    name_calls,
    task_label,
)
from effectdrill.processes import NOT_REACHED
from effectdrill.report import Run
from effectdrill.restart import GAVE_UP, UNREACHED
from effectdrill.trace import Trace

THREAD_MARK = "{thread}"  # replaced by the run's thread id everywhere in the input


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
    world: object = None  # the declared world the snapshot engine restores (world.py)
    snapdir: str = ""  # where the snapshot engine keeps its images (snapshot.py)

    def __post_init__(self):
        self.is_async = needs_async(self.graph)
        self.saved = "?"  # what the current invoke found saved (set as it starts)

    def clean_run(self, db, mode, warm):
        """The clean run, each of its invokes in a process that never ran the graph (see
        restart.py): its counts, its saver calls, and what its nodes re-ran."""
        thread = f"drill-{self.run_id}-{mode}-clean"
        self.expect_nothing_yet(thread)
        warm.start("clean", mode, [(None, thread)])
        calls, names, invokes, tools = warm.next().result()
        trace = Trace(self, thread, Recorder())
        trace.names, trace.invokes = names, invokes
        name_calls(calls, names, tools)
        return CleanRun(self.counts(thread), in_step_order(calls), trace.reruns(), thread)

    def end_crash(self, ended, thread):
        """A crash run's end, read from its chain (restart.crash_chain: the kill, then the
        resume in a new process), and the thread observed. (Its thread is new: crash_all
        checked that the observer counts nothing on one.)"""
        result = ended.result()
        reached = result["reached"]
        if reached in (UNREACHED, GAVE_UP):  # the child died in a state of no row: no verdict
            saved = (
                NOT_REACHED
                if reached == UNREACHED
                else f"{NOT_REACHED} (held {HOLD_DEADLINE_S:.0f} s)"
            )
            return Run(False, saved, [], {}, None, thread, unreached=True)
        saved = result["saved"] if reached else NOT_REACHED
        counts = result["counts"] if "counts" in result else self.counts(thread)  # snapshot's
        return Run(reached, saved, result["ran"], counts, result["error"], thread)

    def one_invoke(self, db, recorder, thread, mode, fresh, trace=None):
        """One invoke of the thread on a saver of db (the input if fresh or nothing saved, else
        a resume): (what was saved when it started, the tasks that ran, whether a task is left
        after it). Async graphs through asyncio and the async saver."""
        if self.is_async:
            return asyncio.run(self.ainvoke_once(db, recorder, thread, mode, fresh, trace))
        with db.saver(recorder) as saver, self.store() as store:
            return self.invoke_once(saver, thread, mode, fresh, trace, store)

    def store(self):
        return self.stores.sync() if self.stores else nullcontext(None)

    def astore(self):
        return self.stores.asynchronous() if self.stores else nullcontext(None)

    def with_saver(self, saver, store):
        update = {"checkpointer": saver} | ({} if store is None else {"store": store})
        return self.graph.copy(update=update)

    def invoke_once(self, saver, thread, mode, fresh, trace=None, store=None):
        graph = self.with_saver(saver, store)
        config = {"configurable": {"thread_id": thread}}
        state = None
        if not fresh and saver.get_tuple(config) is not None:
            state = graph.get_state(config, subgraphs=True)
        self.saved = describe_saved(state)
        step = self.next_input(state, thread, fresh)
        if step is DONE:
            return self.saved, [], False
        if trace:
            trace.invoke_starts()
        ran = []
        with redirect_stdout(sys.stderr):  # the graph's own prints: stdout is the report's
            steps = {(): [first_step(state), False]}  # as LangGraph numbers them
            for chunk in self.stream(graph, step, config, mode, trace):
                self.seen(chunk, ran, state, trace, steps)
        return self.saved, in_steps(ran), bool(graph.get_state(config).tasks)

    async def ainvoke_once(self, db, recorder, thread, mode, fresh, trace=None):
        """invoke_once() for a graph of async nodes: astream, aget_state, an async saver."""
        async with db.asaver(recorder) as saver, self.astore() as store:
            graph = self.with_saver(saver, store)
            config = {"configurable": {"thread_id": thread}}
            state = None
            if not fresh and await saver.aget_tuple(config) is not None:
                state = await graph.aget_state(config, subgraphs=True)
            self.saved = describe_saved(state)
            step = self.next_input(state, thread, fresh)
            if step is DONE:
                return self.saved, [], False
            if trace:
                trace.invoke_starts()
            ran = []
            with redirect_stdout(sys.stderr):
                steps = {(): [first_step(state), False]}
                async for chunk in self.astream(graph, step, config, mode, trace):
                    self.seen(chunk, ran, state, trace, steps)
            return self.saved, in_steps(ran), bool((await graph.aget_state(config)).tasks)

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
            if trace:
                trace.task_starts(payload)
            if step[1]:
                step[:] = [step[0] + 1, False]
            return
        step[1] = True
        where = "/".join(part.split(":")[0] for part in namespace)
        if trace:
            trace.task_result(namespace, payload)
        name = task_label(payload["id"], payload["name"], state)
        ran.append((len(namespace), step[0], safe(f"{where}/{name}" if where else name)))

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
        return {safe(effect): count for effect, count in counts.items()}  # names a report shows

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
            and probe(self.graph, "store") is None
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
            and probe(self.graph, "context_schema") is not None
            and isinstance(error, AttributeError | TypeError | KeyError)
        ):
            name = probe(self.graph.context_schema, "__name__", "a context")
            return (
                f" (the graph takes a runtime context, {name}: give it with --context "
                "MODULE:FUNC, or context= in the library)"
            )
        return ""


DONE = object()  # next_input: nothing left to run


def with_thread(value, thread):
    if isinstance(value, str):
        return value.replace(THREAD_MARK, thread)
    if isinstance(value, dict):
        return {with_thread(k, thread): with_thread(v, thread) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(with_thread(v, thread) for v in value)
    return value


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
