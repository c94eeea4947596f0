"""The clean run's trace: which effects each task made, counted in the task as it starts and
ends (LangChain callbacks), so that a node re-run after an interrupt or by its RetryPolicy is
told from counts that are simply more than one."""

import importlib
import itertools
import threading


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
        self.tools = {}  # task id -> "tool NAME, call ID": a Send's tool call (its input)
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

    def task_starts(self, payload):
        """A task's start read off the stream: the tool call its input carries, if any (a
        prebuilt ToolNode's Send per tool call: ToolCallWithContext, or the call itself)."""
        given = payload.get("input")
        call = given.get("tool_call", given) if isinstance(given, dict) else None
        if isinstance(call, dict) and isinstance(call.get("name"), str) and "args" in call:
            self.tools[payload["id"]] = f"tool {call['name']}, call {call.get('id') or '?'}"

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
