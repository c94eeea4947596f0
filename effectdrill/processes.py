"""The processes: the warm parent (forked before the first run) forks a chain process per job
(restart.py: the clean run, or a crash run and its resume, each invoke in a new process), and
the drill reads how each ended."""

import gc
import json
import os
import pickle
import select
import signal
import sqlite3
import sys
import time
from collections import deque
from contextlib import contextmanager

from effectdrill.errors import DrillError, GraphFailed, task_error
from effectdrill.kill import CHILD_FAILED
from effectdrill.restart import fork_chain, run_chain, write_all

CHILDREN_AT_ONCE = 2  # crash children the warm parent keeps running side by side


CHILD_DEADLINE_S = 300.0  # seconds a crash child may run: a graph that hangs is an error


HERE = ("clean", "snapclean")  # jobs whose chain runs in the warm parent itself (a clean run)


NOT_REACHED = "point not reached"  # the saved cell of such a run


class Child:
    """A forked job's chain (restart.py), as the warm parent waits for it."""

    def __init__(self, pid, pipe, where):
        self.pid, self.pipe, self.where = pid, pipe, where

    def wait(self):
        """[wait status, what it wrote]; killed and reaped past CHILD_DEADLINE_S. Read to the
        end first: a long answer fills the pipe before the child can exit."""
        try:
            message = read_until_end(self.pipe, time.monotonic() + CHILD_DEADLINE_S)
            status = os.waitpid(self.pid, 0)[1]
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


def crash_all(plan, mode, jobs, warm):
    """Each (row, state, thread) job's crash run, appended to its row. The warm parent (forked
    before any run: the graph imported and built, nothing run yet) forks a chain per job,
    CHILDREN_AT_ONCE of them running side by side, and reports how each ended, in the jobs'
    order; this process observes each thread meanwhile. Each chain kills its crash run and
    resumes it, every invoke in a process of its own that never ran the graph
    (restart.py): no process holds what another run left in memory or a connection a client
    pooled in it."""
    if not jobs:
        return
    plan.expect_nothing_yet(jobs[0][2])  # after the clean run's effects: a new thread counts 0
    warm.start("crash", mode, [(state, thread) for _row, state, thread in jobs])
    for row, _state, thread in jobs:
        row.runs.append(plan.end_crash(warm.next(), thread))


class WarmParent:
    """A process forked from the drill before its first run. It reads a batch of jobs
    (pickled: the clean run, or a mode's crash runs), forks their chains (CHILDREN_AT_ONCE at
    a time, in the jobs' order) and writes each one's wait status and message back in that
    order, one JSON line each. It leads
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
                os.dup2(2, 1)  # the graph's prints go to stderr: stdout is the report's
                prime_langgraph(db)
                with os.fdopen(jobs_read, "rb") as incoming:
                    while batch := incoming.readline():
                        kind, mode, jobs = pickle.loads(bytes.fromhex(batch.decode()))
                        if kind in HERE:  # its chain never runs the graph: no fork for it
                            ((state, thread),) = jobs
                            end, code = run_chain(plan, db, kind, mode, state, thread)
                            line = json.dumps([code << 8, json.dumps(end)]) + "\n"
                            write_all(write_end, line.encode())
                            continue
                        live = deque()  # forked, not yet reaped: in the jobs' order
                        for state, thread in jobs:
                            if len(live) == CHILDREN_AT_ONCE:
                                report_end(live.popleft(), write_end)
                            pid, pipe = fork_chain(plan, db, kind, mode, state, thread)
                            live.append(Child(pid, pipe, thread))
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

    def start(self, kind, mode, jobs):
        """Hand it jobs of a kind ("clean", "crash"): [(CrashState or None, thread)], forked
        in that order."""
        self.where = iter([f"{state.label} ({mode})" if state else mode for state, _ in jobs])
        self.jobs.write(pickle.dumps((kind, mode, jobs)).hex().encode() + b"\n")
        self.jobs.flush()

    def next(self):
        """The next job's end: a ReapedJob whose result() says how it went."""
        where = next(self.where)
        line = self.lines.readline()
        if not line:
            raise DrillError(f"the drill's warm parent died before the crash run at {where}")
        status, message = json.loads(line)
        if status is None:
            raise DrillError(f"the crash run at {where} could not start: {message}")
        return ReapedJob(status, message, where)

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


def prime_langgraph(db):
    """Run a two-node graph of the drill's own once, on an in-memory saver: LangGraph's lazy
    imports and first-run set-up are then done in the warm parent, not again in each process it
    forks (about a third of a first invoke's CPU). Nothing of the user's graph runs. Skipped
    for Postgres (no connection is opened before the runs) and where it fails."""
    if type(db).__name__ != "Sqlite":
        return
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        n: int

    builder = StateGraph(State)
    builder.add_node("one", lambda state: {"n": 1})
    builder.add_node("two", lambda state: {"n": 2})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", END)
    config = {"configurable": {"thread_id": "warm-up"}}
    try:  # in memory: a warm parent killed meanwhile (stop()) leaves no file behind
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            graph = builder.compile(checkpointer=SqliteSaver(conn))
            options = dict(durability="sync", stream_mode="tasks", subgraphs=True)
            for _ in graph.stream({"n": 0}, config, **options):
                pass
            graph.get_state(config, subgraphs=True)
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


def report_end(child, pipe):
    """The warm parent's: wait for a job's chain and write its end to the drill."""
    write_all(pipe, (json.dumps(child.wait()) + "\n").encode())


@contextmanager
def warm_parent(plan, db):
    warm = WarmParent(plan, db)
    try:
        yield warm
    finally:
        warm.stop()


class ReapedJob:
    """A job's chain reaped by the warm parent: its wait status and the JSON it wrote."""

    def __init__(self, status, message, where):
        self.status, self.message, self.where = status, message, where

    def result(self):
        """The chain's end (restart.py): a crash run's {"reached", "saved", "ran", "error"},
        or the clean run's (calls, task names, per-invoke counts); DrillError or GraphFailed
        for a failure."""
        try:
            end = json.loads(self.message)
        except ValueError:
            raise DrillError(
                f"the run at {self.where} ended with status {self.status} and no answer"
            ) from None
        if "drill_error" in end:
            raise DrillError(end["drill_error"])
        if "graph_failed" in end:
            raise GraphFailed(end["graph_failed"], end["details"])
        if "crash_failed" in end:
            line = f"the graph failed in the crash run at {self.where}: {end['crash_failed']}"
            raise GraphFailed(line, end["details"])
        if "clean" in end:
            return pickle.loads(bytes.fromhex(end["clean"]))
        return end


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


def read_until_end(fd, deadline):
    """What fd carries up to its end of file, or DrillError past the deadline."""
    chunks = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DrillError(f"a crash run took more than {CHILD_DEADLINE_S:.0f} s")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(chunk)


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")
