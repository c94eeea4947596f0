"""The processes: the warm parent (forked before the first run) forks the crash children, and
the drill reads how each ended."""

import gc
import json
import os
import pickle
import select
import signal
import sys
import time
from collections import deque
from contextlib import contextmanager

from effectdrill.errors import DrillError, GraphFailed, task_error
from effectdrill.kill import CHILD_FAILED, CHILD_GAVE_UP, CHILD_UNREACHED, Killer

CHILDREN_AT_ONCE = 2  # crash children the warm parent keeps running side by side


CHILD_DEADLINE_S = 300.0  # seconds a crash child may run: a graph that hangs is an error


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
    line, _, details = message.partition("\n")
    raise GraphFailed(f"the graph failed in the crash run at {where}: {line}", details)


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
