"""The plan of crash states: the saver calls of a clean run (Call, recorded by the Recorder),
their labels, and the states a kill can leave (CrashState: one per call, and under sync one
per set of a step's writes left unsaved). See README.md, "How it crashes"."""

import itertools
import threading
from dataclasses import dataclass, replace

from effectdrill.errors import safe

MAX_HELD = 4  # steps with more writes than this get fewer unsaved sets (see CleanRun.states)


PULL_PREFIX = "~__pregel_pull, "  # LangGraph's task_path of a node's task (_algo.task_path_str)


PUSH_PREFIX = "~__pregel_push, "  # of a Send's task or an @task call (_algo.task_path_str)


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
    closing_put: str = ""  # a put_writes: its step's next checkpoint, saved after it
    tools: tuple = ()  # the tool calls of the tasks whose writes it leaves unsaved


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
    tool: str = ""  # "tool NAME, call ID" when the task ran a tool call (a Send's)


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
            closing = [c.key for c in self.calls if c.kind == "put" and c.group == call.group]
            states.append(
                CrashState(
                    call.label,
                    call.key,
                    wait,
                    parent_put=call.kind == "put_writes",
                    closing_put=closing[0] if call.kind == "put_writes" and closing else "",
                    tools=(call.tool,) if call.tool else (),
                )
            )
        seen = {}  # a label two states share (two held sets of like names): numbered
        for i, state in enumerate(states):
            seen[state.label] = seen.get(state.label, 0) + 1
            if seen[state.label] > 1:
                states[i] = replace(state, label=numbered(state.label, seen[state.label]))
        return states


class Counter:
    """Numbers a recurring label: `put step 2`, then `put step 2 #2` (a loop)."""

    def __init__(self):
        self.seen = {}

    @property
    def carried(self):
        """What the next invoke's process needs of this one's (restart.py): the numbering."""
        return self.seen

    @carried.setter
    def carried(self, value):
        self.seen = value

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

    @property
    def carried(self):
        return self.seen, self.calls

    @carried.setter
    def carried(self, value):
        self.seen, self.calls = value

    def after(self, key, checkpoint=None):
        pass


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


def in_step_order(calls):
    """The calls with each checkpoint after the writes of its step, as LangGraph submits them.
    A put can start before a write of the step it closes (langgraph#8039: both are saved in
    the background), so the order a run records varies from run to run; in step order the
    states are the same every run (CleanRun.states, and the Killer holds the put back)."""
    ordered = list(calls)
    for call in calls:
        if call.kind != "put":
            continue
        mine = [
            i for i, c in enumerate(ordered) if c.kind == "put_writes" and c.group == call.group
        ]
        at = ordered.index(call)
        if mine and mine[-1] > at:
            ordered.insert(mine[-1], ordered.pop(at))
    return ordered


def same_step(a, b):
    """put_writes calls of one step of one invoke: LangGraph saves them side by side."""
    return a.kind == b.kind == "put_writes" and a.group == b.group


def held_state(unsaved, step):
    return CrashState(
        held_label(unsaved, step),
        None,
        hold=frozenset(c.key for c in unsaved),
        group=frozenset(c.key for c in step),
        tools=tuple(c.tool for c in unsaved if c.tool),
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


def name_calls(calls, names, tools=None):
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
        label = safe(label)  # a node's name, as a report shows it
        call.tool = safe((tools or {}).get(call.task_id, ""))
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
    return safe(f"step {state.metadata.get('step')}: " + (describe_tasks(state) or "done"))


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
