"""The drill: crash a graph just before each saver call of a clean run, resume, count effects.

A clean run of the graph, through a saver that records each call, gives the crash points: each
distinct saver call (`put step N`, `put_writes NODE [channels]`). For each point a forked child
runs the graph on a new thread and SIGKILLs itself just before that call; the parent opens a
fresh saver on the same database, finishes the thread the way an operator would (resume it
when it has tasks, submit the input again when nothing was saved) and asks the observer how
many times each effect happened. A count above the clean run's is a duplicate, below a missing
effect. Checked on LangGraph 1.2.24 (see README.md).
"""

import os
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from effectdrill import outbound

DURABILITIES = ("sync", "async", "exit")  # LangGraph's durability modes, in the order drilled
THREAD_MARK = "{thread}"  # replaced by the run's thread id everywhere in the input
MAX_INVOKES = 50  # invokes one run may take (one per interrupt answered); more means a loop
CHILD_DEADLINE_S = 300.0  # seconds a crash child may run: a graph that hangs is an error
CHILD_POLL_S = 0.001  # seconds between checks on a running crash child
SETTLE_DEADLINE_S = 5.0  # seconds a sync kill waits for calls started before it (see Killer)
CHILD_FAILED = 3  # a crash child's exit code when the graph raised (the message is piped)
MEMORY_DATABASES = ("", ":memory:", "memory")  # names of an in-memory SQLite database
PULL_PREFIX = "~__pregel_pull, "  # LangGraph's task_path of a node's task (_algo.task_path_str)


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
    http_ignore=(),
):
    """Drill `graph` (compiled, or a no-argument callable returning one) and return a Report.

    input: the run's input; every "{thread}" in its strings becomes the run's thread id.
    observe: observe(thread_id) -> {effect: count} for that run, from the outside world; or
    "http": the POST and PATCH requests the run sends are the effects (effectdrill/outbound.py).
    durability: "sync", "async", "exit" or "all". repeat: runs per crash point (async varies).
    resume_with: the value of Command(resume=...) whenever a run stops at interrupt().
    context: LangGraph's runtime context, given to every invoke.
    checkpoint_db: a SQLite file or a postgresql:// URL; by default a temporary SQLite file.
    http_ignore: hosts or host/path prefixes the HTTP observer leaves out (a model API, say).
    """
    require_posix()
    modes = durability_modes(durability)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise DrillError(f"repeat must be a whole number of 1 or more, not {repeat!r}")
    graph = compiled(graph)
    if not callable(observe) and observe != "http":
        raise DrillError(f"the observer must be callable as observe(thread_id), not {observe!r}")
    # The HTTP observer records every run's requests (effectdrill/outbound.py).
    with database(checkpoint_db) as db, outbound.recording(http_ignore) as requests:
        observe = requests.observe if observe == "http" else observe
        plan = Plan(graph, input, observe, resume_with, context, uuid.uuid4().hex[:8])
        report, clean_threads = Report(), {}
        for mode in modes:
            clean = plan.clean_run(db, mode)
            report.clean[mode] = clean.counts
            clean_threads[mode] = clean.thread
            for index, point in enumerate(clean.points):
                row = Row(mode, point, clean.counts)
                for attempt in range(repeat):
                    thread = f"drill-{plan.run_id}-{mode}-{index}-{attempt}"
                    killer = Killer(point, mode == "sync", clean.writes_before(point))
                    row.runs.append(plan.crash_run(db, mode, point, thread, killer))
                report.rows.append(row)
        requests.annotate(report, clean_threads)
    return report


@dataclass
class Run:
    """One crash run: was the point reached, what was saved, what the recovery ran, the counts."""

    reached: bool
    saved: str
    ran: list
    counts: dict
    error: str | None = None
    thread: str = ""


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

    def counts(self, effect):
        return [run.counts.get(effect, 0) for run in self.runs]

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
        return "+".join(words) or "ok"

    def as_json(self):
        return {
            "durability": self.durability,
            "point": self.point,
            "runs": len(self.runs),
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

    def __init__(self):
        self.rows = []
        self.clean = {}  # durability -> the clean run's counts
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

    @property
    def repeated_in_clean_run(self):
        repeated = {e: None for counts in self.clean.values() for e, n in counts.items() if n > 1}
        return list(repeated)

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
            "requests": self.requests,
        }

    def table(self):
        """One table per durability mode, then a summary line."""
        blocks = []
        for mode, clean in self.clean.items():
            rows = [row for row in self.rows if row.durability == mode]
            effects = list(clean)
            for row in rows:
                effects += [e for e in row.effects() if e not in effects]
            header = ["point", "saved", "ran on recovery"]
            header += [f"{e} (clean {clean.get(e, 0)})" for e in effects] + ["verdict"]
            lines = [header]
            for row in rows:
                lines.append(
                    [
                        row.point,
                        distinct(run.saved for run in row.runs),
                        distinct(", ".join(run.ran) or "-" for run in row.runs),
                        *(" ".join(map(str, row.counts(e))) or "-" for e in effects),
                        verdict_cell(row),
                    ]
                )
            runs = f", {len(rows[0].runs)} runs each" if rows and len(rows[0].runs) > 1 else ""
            blocks.append(f"durability {mode}: {plural(len(rows), 'crash point')}{runs}\n")
            blocks[-1] += columns(lines)
        requests = outbound.table(self)
        return "\n\n".join(blocks + ([requests] if requests else []) + [self.summary_line()])

    def summary_line(self):
        parts = [plural(len(self.rows), "crash point")]
        for name, found in (("duplicate", self.duplicates), ("missing", self.missing)):
            effects = ", ".join(sorted({f["effect"] for f in found}))
            parts.append(f"{len(found)} {name}" + (f" ({effects})" if found else ""))
        parts.append(f"{len(self.failed)} failed resume" + ("" if len(self.failed) == 1 else "s"))
        repeated = self.repeated_in_clean_run
        parts.append(
            f"the clean run repeated {', '.join(repeated)}" if repeated else "clean run ok"
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


@dataclass
class CleanRun:
    counts: dict
    points: list
    writes_before: object  # point -> put_writes calls of the step it closes
    thread: str = ""


@dataclass
class Plan:
    """What every run of one drill shares: the graph, its input, observer and answers."""

    graph: object
    input: object
    observe: object
    resume_with: object
    context: object
    run_id: str

    def clean_run(self, db, mode):
        thread = f"drill-{self.run_id}-{mode}-clean"
        self.expect_nothing_yet(thread)
        recorder = Recorder()
        try:
            with db.saver(recorder) as saver:
                self.finish(saver, thread, mode, fresh=True)
        except DrillError:
            raise
        except Exception as error:
            raise DrillError(f"the graph failed in its clean run: {task_error(error)}") from None
        return CleanRun(self.counts(thread), recorder.points, recorder.writes_before, thread)

    def crash_run(self, db, mode, point, thread, killer):
        self.expect_nothing_yet(thread)
        reached = self.run_child(db, mode, point, thread, killer)
        saved, ran, error = "?", [], None
        try:
            with db.saver() as saver:
                saved = describe_saved(self.graph.copy(update={"checkpointer": saver}), thread)
                ran = self.finish(saver, thread, mode, fresh=False)
        except DrillError:
            raise
        except Exception as failure:  # the resume itself failed: a finding, not a usage error
            error = task_error(failure)
        if not reached:
            saved = "point not reached"
        return Run(reached, saved, ran, self.counts(thread), error, thread)

    def run_child(self, db, mode, point, thread, killer):
        """Fork a child that runs the graph and SIGKILLs itself before `point`: was it reached?"""
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
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read_end)
                os.dup2(2, 1)  # the graph's prints go to stderr: stdout is the report's
                with db.saver(killer) as saver:
                    self.finish(saver, thread, mode, fresh=True)
            except BaseException as error:
                os.write(write_end, task_error(error).encode()[:4000])
                code = CHILD_FAILED
            finally:
                os._exit(code)
        try:
            try:  # a Ctrl-C held back lands here, where the child is killed and reaped with it
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(write_end)
                status = wait_child(pid)
            except BaseException:
                kill_and_reap(pid)
                raise
            message = read_all(read_end)
        finally:
            os.close(read_end)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            return True
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return False  # the run ended without that call (async saves vary)
        raise DrillError(f"the graph failed in the crash run before {point} ({mode}): {message}")

    def finish(self, saver, thread, mode, fresh):
        """Run the thread to its end: the input first if fresh, else resume it; the nodes run."""
        from langgraph.types import Command

        graph = self.graph.copy(update={"checkpointer": saver})
        config = {"configurable": {"thread_id": thread}}
        ran = []
        for _ in range(MAX_INVOKES):
            if fresh:
                step, fresh = with_thread(self.input, thread), False
            elif saver.get_tuple(config) is None:  # nothing saved: submit the input again
                step = with_thread(self.input, thread)
            else:
                tasks = graph.get_state(config).tasks  # tasks, not next: see README.md
                if not tasks:
                    return ran
                waiting = [t.name for t in tasks if t.interrupts]
                if waiting and self.resume_with is None:
                    raise DrillError(
                        f"the graph stopped at interrupt() in {', '.join(waiting)}: give the "
                        "answer to resume with (--resume-with JSON, or resume_with=)"
                    )
                step = Command(resume=self.resume_with) if waiting else None
            with redirect_stdout(sys.stderr):  # the graph's own prints: stdout is the report's
                for chunk in graph.stream(
                    step, config, durability=mode, context=self.context, stream_mode="tasks"
                ):
                    # A task's result, sent only for a task that ran: one whose writes were saved
                    # before is replayed without it (PregelLoop.output_writes, cached=True).
                    if "input" not in chunk:
                        ran.append(chunk["name"])
        raise DrillError(f"the graph did not finish in {MAX_INVOKES} invokes (a loop?)")

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
            raise DrillError(
                f"the observer counted effects for thread {thread} before it ran ({counts}): it "
                "must count only the effects of the thread it is given (put {thread} in the input)"
            )


# helpers


class Recording:
    """Saver mixin: tells its recorder about each put and put_writes, before and after it."""

    recorder = None

    def put(self, config, checkpoint, metadata, new_versions):
        if self.recorder is None:
            return super().put(config, checkpoint, metadata, new_versions)
        self.recorder.before(put_label(config, metadata), "put", parent(config))
        saved = super().put(config, checkpoint, metadata, new_versions)
        self.recorder.after_put((parent(config)[0], checkpoint["id"]))
        return saved

    def put_writes(self, config, writes, task_id, task_path=""):
        if self.recorder is None:
            return super().put_writes(config, writes, task_id, task_path)
        self.recorder.before(writes_label(config, writes, task_path), "put_writes", parent(config))
        super().put_writes(config, writes, task_id, task_path)
        self.recorder.after_writes(parent(config))


class Recorder:
    """Collects the distinct saver calls of a clean run: a label, numbered when it recurs.

    It also counts, for each `put`, the run's put_writes calls on the same parent checkpoint:
    the writes of the step that checkpoint closes (see Killer).
    """

    def __init__(self):
        self.points = []
        self.seen = {}
        self.parent_of = {}  # put point -> (namespace, checkpoint id) it builds on
        self.writes_on = {}  # (namespace, checkpoint id) -> put_writes calls on it
        self.lock = threading.Lock()  # async durability saves from LangGraph's worker threads

    def before(self, label, kind, parent):
        with self.lock:
            self.seen[label] = self.seen.get(label, 0) + 1
            point = numbered(label, self.seen[label])
            self.points.append(point)
            if kind == "put":
                self.parent_of[point] = parent
            else:
                self.writes_on[parent] = self.writes_on.get(parent, 0) + 1

    def after_put(self, checkpoint):
        pass

    def after_writes(self, parent):
        pass

    def writes_before(self, point):
        """How many put_writes calls the step closed by `point` made (0 for put_writes)."""
        return self.writes_on.get(self.parent_of.get(point), 0)


class Killer:
    """In a crash child: SIGKILL this process just before the saver call named `point`.

    Under sync (settle=True) it first lets the calls finish that LangGraph started earlier
    on other threads and does not wait for (PregelLoop.put_writes and _put_checkpoint submit
    them to the run's background executor, langgraph/pregel/_loop.py): before a `put`, the
    `writes` put_writes calls of the step it closes; before a put_writes, the put of the
    checkpoint it is for. Otherwise the kill would land before or after them at random, and
    the state it left would be the one a neighbouring point already shows.
    """

    def __init__(self, point, settle=False, writes=0):
        self.point = point
        self.settle = settle
        self.writes = writes
        self.seen = {}
        self.puts = set()  # (namespace, checkpoint id) of every put finished
        self.stored = {}  # (namespace, checkpoint id) -> put_writes calls finished on it
        self.changed = threading.Condition()

    def before(self, label, kind, parent):
        with self.changed:
            self.seen[label] = self.seen.get(label, 0) + 1
            if numbered(label, self.seen[label]) != self.point:
                return
            self.changed.wait_for(lambda: self.settled(kind, parent), SETTLE_DEADLINE_S)
            os.kill(os.getpid(), signal.SIGKILL)

    def settled(self, kind, parent):
        if not self.settle:
            return True
        if kind == "put":
            return self.stored.get(parent, 0) >= self.writes
        return parent[1] is None or parent in self.puts

    def after_put(self, checkpoint):
        with self.changed:
            self.puts.add(checkpoint)
            self.changed.notify_all()

    def after_writes(self, parent):
        with self.changed:
            self.stored[parent] = self.stored.get(parent, 0) + 1
            self.changed.notify_all()


def numbered(label, occurrence):
    return label if occurrence == 1 else f"{label} #{occurrence}"


def parent(config):
    """The checkpoint a call builds on: a put's previous one, the one a task's writes are for."""
    configurable = config.get("configurable", {})
    return configurable.get("checkpoint_ns", ""), configurable.get("checkpoint_id")


def put_label(config, metadata):
    return f"put step {metadata.get('step')}{namespace(config)}"


def writes_label(config, writes, task_path):
    node = task_path.removeprefix(PULL_PREFIX)
    channels = ", ".join(sorted({channel for channel, _ in writes}))
    return f"put_writes {node} [{channels}]".replace("  ", " ") + namespace(config)


def namespace(config):
    """' in SUBGRAPH' for a subgraph's saves, without the task ids (they differ run to run)."""
    ns = config.get("configurable", {}).get("checkpoint_ns", "")
    return f" in {'/'.join(part.split(':')[0] for part in ns.split('|'))}" if ns else ""


def describe_saved(graph, thread):
    config = {"configurable": {"thread_id": thread}}
    if graph.checkpointer.get_tuple(config) is None:
        return "nothing"
    state = graph.get_state(config)
    tasks = [f"{t.name} (writes saved)" if t.result is not None else t.name for t in state.tasks]
    return f"step {state.metadata.get('step')}: " + (", ".join(tasks) or "done")


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


def wait_child(pid):
    """The child's wait status, or DrillError past the deadline (the caller kills it then)."""
    deadline = time.monotonic() + CHILD_DEADLINE_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            raise DrillError(f"a crash run took more than {CHILD_DEADLINE_S:.0f} s")
        time.sleep(CHILD_POLL_S)


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
    """LangGraph's SqliteSaver on a file: each saver() is a new connection."""

    def __init__(self, path):
        self.path = path

    def check(self):
        try:
            with self.saver() as saver:
                saver.setup()
        except sqlite3.Error as error:
            raise DrillError(f"cannot open the SQLite database {self.path}: {error}") from None

    @contextmanager
    def saver(self, recorder=None):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self.path, check_same_thread=False)
        # No fsync: the drill's crash is a killed process, and SQLite keeps a committed
        # transaction through that with synchronous=OFF (only an OS crash or power loss can
        # lose it: sqlite.org/pragma.html#pragma_synchronous).
        conn.execute("PRAGMA synchronous=OFF")
        try:
            saver = recording(SqliteSaver)(conn)
            saver.recorder = recorder
            yield saver
        finally:
            conn.close()


class Postgres:
    """LangGraph's PostgresSaver: each saver() is a new connection."""

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


def columns(lines):
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def distinct(values):
    """The different values of a row's runs, in order: 'a | b' when the runs differ."""
    return " | ".join(dict.fromkeys(values))


def plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def verdict_cell(row):
    if row.verdict == "ok":
        return "ok"
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
