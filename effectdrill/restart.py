"""A resume is a restart: every invoke of the graph runs in a process that imported the user's
code and never ran the graph, as a process restarted after a crash (or a worker answering an
interrupt after a deploy) would. Nothing a run left in memory (a module-level cache, a pooled
client, an "already sent" set) reaches a later invoke.

The warm parent (processes.py, forked before the drill's first run) forks one chain process
per job; the chain never runs the graph itself: it forks a new process for each invoke (cold()),
carries what the drill needs from one to the next (the Killer's and the Recorder's numbering,
the trace), and writes the job's end as one JSON object:

- crash_chain: the invokes of a crash run until its Killer SIGKILLs one, then the resume
  (resume_chain), each invoke again a new process; {"reached", "saved", "ran", "error"}.
- clean_chain: the clean run's invokes with the Recorder and the Trace; {"clean": ...}.

A failure is {"graph_failed": line, "details": traceback} (the graph raised in its clean run),
{"crash_failed": ...} (in a crash run, before its point) or {"drill_error": line} (a
DrillError: the graph cannot be drilled as asked).
"""

import gc
import json
import os
import pickle
import select
import signal
import sys
import time

from effectdrill.errors import DrillError, task_error, traceback_of
from effectdrill.kill import CHILD_FAILED, CHILD_GAVE_UP, CHILD_UNREACHED, Killer
from effectdrill.plan import Recorder
from effectdrill.trace import Trace

KILLED, UNREACHED, GAVE_UP = True, "unreached", "gave up"  # how a crash run's kill went
MAX_INVOKES = 50  # invokes one run may take (one per interrupt answered); more means a loop


class Failed(Exception):
    """An invoke's process raised: `payload` is what the chain writes for it."""

    def __init__(self, payload):
        super().__init__(payload)
        self.payload = payload


def fork_chain(plan, db, kind, mode, state, thread):
    """Fork the chain process of one job (kind "crash" or "clean"): its (pid, pipe), the pipe
    carrying its JSON end. Called in the warm parent, which never ran the graph."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    # A Ctrl-C during fork() would land in an at-fork hook (logging's), which swallows it:
    # held back across the fork, it is delivered just after, in the code that handles it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the chain: never returns into the caller's code
        end, code = {"drill_error": "a crash run could not start"}, CHILD_FAILED
        try:
            gc.disable()  # it lives for one job: no collection touching the parent's pages
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(read_end)
            os.dup2(2, 1)  # the graph's prints go to stderr: stdout is the report's
            end, code = run_chain(plan, db, kind, mode, state, thread, write_end)
        finally:
            try:
                write_all(write_end, json.dumps(end).encode())
            finally:
                os._exit(code)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_end)
    except BaseException:
        os.close(read_end)
        raise
    return pid, read_end


def run_chain(plan, db, kind, mode, state, thread, outward=None):
    """One job's chain, here: (its JSON end, the exit code its process would have). `outward`:
    the pipe to the drill, closed in every process the chain forks."""
    try:
        if kind == "clean":
            return clean_chain(plan, db, mode, thread, outward), 0
        if kind == "snapclean":  # the snapshot engine's (snapshot.py)
            from effectdrill.snapshot import snap_clean_chain

            return snap_clean_chain(plan, db, mode, thread, outward), 0
        if kind == "resume":
            from effectdrill.snapshot import snap_resume_chain

            return snap_resume_chain(plan, db, mode, state, thread, outward), 0
        return crash_chain(plan, db, mode, state, thread, outward), 0
    except Failed as failed:
        return failed.payload, 0
    except BaseException as error:  # noqa: BLE001 - said to the drill, never lost
        return {"drill_error": f"a crash run could not run: {task_error(error)}"}, CHILD_FAILED


def crash_chain(plan, db, mode, state, thread, outward):
    """A crash run, then its resume, each invoke in a new process."""
    reached = crash(plan, db, mode, state, thread, outward)
    if reached in (UNREACHED, GAVE_UP):
        return {"reached": reached}
    saved, ran, error = resume_chain(plan, db, mode, thread, outward)
    return {"reached": reached, "saved": saved, "ran": ran, "error": error}


def crash(plan, db, mode, state, thread, outward=None):
    """A crash run's invokes until the Killer's SIGKILL: KILLED; False when the run ended
    without reaching its point; UNREACHED or GAVE_UP when LangGraph waited on a held save."""
    killer = Killer(state, mode == "sync")
    fresh = True
    for _ in range(MAX_INVOKES):
        invoke = lambda f=fresh: crash_invoke(plan, db, killer, thread, mode, f)  # noqa: E731
        status, answer = cold(plan, invoke, outward)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            return KILLED
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        if code == CHILD_UNREACHED:
            return UNREACHED
        if code == CHILD_GAVE_UP:
            return GAVE_UP
        more, killer.carried = answer_of(status, answer, "the crash run")
        if not more:
            return False
        fresh = False
    raise Failed({"drill_error": too_many_invokes()})


def crash_invoke(plan, db, killer, thread, mode, fresh):
    """In an invoke's process: one invoke with the Killer armed; its numbering carried on."""
    _, _, more = plan.one_invoke(db, killer, thread, mode, fresh)
    if killer.holding:  # the run ended while a held call waited: the state cannot come
        os._exit(CHILD_UNREACHED)
    return more, killer.carried


def resume_chain(plan, db, mode, thread, outward):
    """The crashed thread finished as an operator would (resumed, or its input submitted again
    when nothing was saved), each invoke in a new process: (what was saved at the start, the
    tasks that ran, the resume's error or None)."""
    saved, ran = None, []
    for _ in range(MAX_INVOKES):
        status, answer = cold(plan, lambda: plan.one_invoke(db, None, thread, mode, False), outward)
        try:
            was, tasks, more = answer_of(status, answer, "the resume")
        except Failed as failed:
            if "resume_failed" not in failed.payload:
                raise
            return saved or failed.payload["saved"], ran, failed.payload["resume_failed"]
        saved = was if saved is None else saved
        ran += tasks
        if not more:
            return saved, ran, None
    raise Failed({"drill_error": too_many_invokes()})


def clean_chain(plan, db, mode, thread, outward, recorder=None, trace=None):
    """The clean run: each invoke in a new process, the Recorder's calls and the Trace's counts
    carried from one to the next; {"clean": (calls, task names, per-invoke counts)} pickled,
    then what recorder.extras() adds (the snapshot engine's SnapRecorder: its snapshots)."""
    recorder = recorder or Recorder()
    trace = trace or Trace(plan, thread, recorder)
    fresh = True
    for _ in range(MAX_INVOKES):

        def invoke(fresh=fresh):
            try:
                _, _, more = plan.one_invoke(db, recorder, thread, mode, fresh, trace)
            except DrillError:
                raise
            except Exception as error:
                line = f"the graph failed in its clean run: {task_error(error)}{plan.hint(error)}"
                raise Failed({"graph_failed": line, "details": traceback_of(error)}) from None
            return more, (recorder.carried, trace.names, trace.invokes, trace.tools)

        status, answer = cold(plan, invoke, outward)
        more, carried = answer_of(status, answer, "")
        recorder.carried, trace.names, trace.invokes, trace.tools = carried
        if not more:
            data = (recorder.calls, trace.names, trace.invokes, trace.tools)
            data += getattr(recorder, "extras", tuple)()
            return {"clean": pickle.dumps(data).hex()}
        fresh = False
    raise Failed({"drill_error": too_many_invokes()})


def cold(plan, function, outward=None):
    """Run function() in a new process forked from this one (which never ran the graph): its
    wait status and what it answered (pickled ("ok", value) or ("failed", payload))."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_end)
            if outward is not None:  # the chain's own pipe: its end of file is the chain's end
                os.close(outward)
            try:
                answer = ("ok", function())
            except Failed as failed:
                answer, code = ("failed", failed.payload), CHILD_FAILED
            except DrillError as error:
                answer, code = ("failed", {"drill_error": str(error)}), CHILD_FAILED
            except Exception as error:  # the graph raised: a resume's finding
                failed = {"resume_failed": task_error(error), "saved": plan.saved}
                answer, code = ("failed", failed | {"details": traceback_of(error)}), CHILD_FAILED
            write_all(write_end, pickle.dumps(answer))
        except BaseException:  # noqa: BLE001 - the chain sees the exit code
            code = CHILD_FAILED
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        answer = read_bytes(read_end, pid)  # first: a large answer fills the pipe before the exit
    finally:
        os.close(read_end)
    return os.waitpid(pid, 0)[1], answer


def answer_of(status, answer, what):
    """The value an invoke's process answered, or Failed with what it said."""
    try:
        kind, value = pickle.loads(answer)
    except Exception:
        kind, value = None, None
    if kind == "ok" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return value
    if kind == "failed":
        if what == "the crash run" and "resume_failed" in value:  # the graph, before its point
            raise Failed({"crash_failed": value["resume_failed"], "details": value["details"]})
        raise Failed(value)
    raise Failed({"drill_error": f"{what or 'the clean run'}'s process ended with status {status}"})


def too_many_invokes():
    return f"the graph did not finish in {MAX_INVOKES} invokes (a loop?)"


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_bytes(fd, pid):
    """What fd carries up to its end of file. Past processes.CHILD_DEADLINE_S the process `pid`
    is killed, and Failed says so: a graph that hangs is an error."""
    from effectdrill.processes import CHILD_DEADLINE_S, kill_and_reap

    deadline = time.monotonic() + CHILD_DEADLINE_S
    chunks = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            kill_and_reap(pid)
            raise Failed({"drill_error": f"a run took more than {CHILD_DEADLINE_S:.0f} s"})
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
