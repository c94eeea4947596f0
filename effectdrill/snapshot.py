"""The snapshot engine: run the graph once, and just before each saver call keep the durable
state (the checkpoint database's pages, the declared world's); each crash state is then that
state restored and resumed (README.md, "Two engines"). Its chains run in the warm parent's
children as the kill engine's do (restart.py): the clean run's invokes each in a new process,
and each resume's."""

import os
import pickle
import shutil
import sqlite3
import threading
from contextlib import contextmanager, nullcontext

from effectdrill.errors import DrillError, task_error, traceback_of
from effectdrill.plan import Recorder
from effectdrill.restart import MAX_INVOKES, Failed, answer_of, cold, resume_chain, too_many_invokes
from effectdrill.savers import Sqlite
from effectdrill.trace import Trace
from effectdrill.world import as_rollback, world_lock

ENGINES = ("auto", "snapshot", "kill")


def choose(engine, plan, db, mode, http, world, early=False):
    """(engine, why) for this mode: "snapshot" where the drill can restore everything a resume
    can touch, else "kill". A DrillError when --engine snapshot was asked and cannot be.
    early: before the graph is known (plan and db None), the reasons that need neither."""
    if engine not in ENGINES:
        raise DrillError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "kill":
        return "kill", "asked for"
    reason = kill_reason(plan, db, mode, http, world)
    if reason is None:
        why = "asked for" if engine == "snapshot" else "the world is declared and restorable"
        return "snapshot", f"{why}: the checkpoints and {world_name(world)} restored per point"
    if engine == "snapshot":
        raise DrillError(f"--engine snapshot cannot drill this graph: {reason}")
    return "kill", reason


def kill_reason(plan, db, mode, http, world):
    """Why a snapshot cannot stand for a real kill here, or None."""
    if mode != "sync":
        return f"durability {mode}: its crash states come from timing, real kills sample them"
    if http:
        return "--observe http: the requests reach servers the drill cannot restore"
    if world is None:
        return (
            "no world declared (--world, or drill_world beside the observer): the drill "
            "cannot restore what the resume touches"
        )
    if plan is None:
        return None
    if plan.is_async:
        return "async nodes: their saver lives on aiosqlite's thread, not snapshotted"
    if not isinstance(db, Sqlite):
        return "a Postgres checkpoint database: not snapshotted"
    if plan.stores is not None:
        return "a store: not part of the declared world"
    return None


def world_name(world):
    return "the declared world" if not getattr(world, "relocatable", False) else "its world"


class SnapRecorder(Recorder):
    """The Recorder of a clean run (its calls, numbered as a crash child sees them), with the
    saver calls made one at a time and, just before each, the checkpoint database's pages and
    the world kept in files of `folder`; after each put_writes, the rows it saved."""

    def __init__(self, folder, world, thread):
        super().__init__()
        self.folder, self.world, self.thread = folder, world, thread
        self.serial = threading.Lock()
        self.saver = None
        self.snaps = []  # per call: (checkpoint image path, world image path, tasks busy)
        self.rows = {}  # put_writes key -> the writes rows it saved (for held states)
        self.running = {}  # task id -> attempts running (SnapTrace)
        self.by_key = {}

    @property
    def carried(self):
        return self.seen, self.calls, self.snaps, self.rows

    @carried.setter
    def carried(self, value):
        self.seen, self.calls, self.snaps, self.rows = value

    def before(self, call):
        self.serial.acquire()  # released in after(): one saver call at a time
        try:
            key = super().before(call)
            self.by_key[key] = call
            n = len(self.snaps)
            with self.saver.lock:
                image = as_rollback(self.saver.conn.serialize())
            ckpt = os.path.join(self.folder, f"{n}.sqlite")
            with open(ckpt, "wb") as out:
                out.write(image)
            world = os.path.join(self.folder, f"{n}.world")
            with open(world, "wb") as out:
                pickle.dump(self.world.snapshot(), out)
            outer = {part.split(":", 1)[-1] for part in call.group[1].split("|") if part}
            busy = sorted(t for t, n in self.running.items() if n and t not in outer)
            self.snaps.append((ckpt, world, busy))
        except BaseException:
            self.serial.release()
            raise
        return key

    def failed(self, key):
        """The saver call raised: the next one may go (after() is not called)."""
        self.serial.release()

    def after(self, key, checkpoint=None):
        try:
            call = self.by_key[key]
            if call.kind == "put_writes":
                _, namespace, checkpoint_id = call.group
                with self.saver.lock:
                    self.rows[key] = self.saver.conn.execute(
                        "SELECT * FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND "
                        "checkpoint_id = ? AND task_id = ?",
                        (self.thread, namespace, checkpoint_id, call.task_id),
                    ).fetchall()
        finally:
            self.serial.release()


class SnapTrace(Trace):
    """The clean run's Trace, telling the recorder which tasks are running (a snapshot taken
    while another task is mid-effect cannot stand for a kill)."""

    def attempt_starts(self, task):
        running = self.recorder.running
        running[task] = running.get(task, 0) + 1
        super().attempt_starts(task)

    def attempt_ends(self, task):
        super().attempt_ends(task)
        self.recorder.running[task] -= 1


class SnapDb:
    """The drill's SQLite database, whose saver() tells the recorder which saver to snapshot."""

    def __init__(self, db):
        self.db = db

    @contextmanager
    def saver(self, recorder=None):
        with self.db.saver(recorder) as saver:
            if recorder is not None:
                recorder.saver = saver
            yield saver


def snap_clean_chain(plan, db, mode, thread, outward):
    """The clean run as restart.clean_chain makes it, each invoke in a new process, with the
    SnapRecorder: {"clean": (calls, names, invokes, tools, snaps, rows)} pickled."""
    folder = os.path.join(plan.snapdir, "clean")
    os.makedirs(folder, exist_ok=True)
    recorder = SnapRecorder(folder, plan.world, thread)
    trace = SnapTrace(plan, thread, recorder)
    snapdb, fresh = SnapDb(db), True
    for _ in range(MAX_INVOKES):

        def invoke(fresh=fresh):
            try:
                _, _, more = plan.one_invoke(snapdb, recorder, thread, mode, fresh, trace)
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
            data += (recorder.snaps, recorder.rows)
            return {"clean": pickle.dumps(data).hex()}
        fresh = False
    raise Failed({"drill_error": too_many_invokes()})


def plan_items(calls, snaps, rows, states):
    """Per crash state: (checkpoint image, writes rows to add, world image), or None where a
    snapshot cannot stand for the kill (a task of another thread mid-effect at it; a held
    step whose writes other calls interleave)."""
    index = {c.key: i for i, c in enumerate(calls)}
    items = []
    for state in states:
        if state.key is not None:  # killed just before this call: everything earlier saved
            i = index[state.key]
            ckpt, world, busy = snaps[i]
            items.append(None if busy else (ckpt, (), world))
            continue
        group = sorted(index[k] for k in state.group)  # a held set: the step's others saved
        first, last = group[0], group[-1]
        between = [i for i in range(first, last + 1) if calls[i].key not in state.group]
        if between or snaps[last][2]:
            items.append(None)
            continue
        saved = [r for k in sorted(state.group - state.hold) for r in rows.get(k, ())]
        items.append((snaps[first][0], saved, snaps[last][1]))
    return items


def snap_resume_chain(plan, db, mode, item, thread, outward):
    """A crash state made from its snapshot: the checkpoint image in a database of this chain's
    own, the world restored (in a folder of its own where it can be relocated, else in place
    and one resume at a time), the thread resumed as after a kill (restart.resume_chain, each
    invoke in a new process), then observed here, before another resume touches the world."""
    ckpt, rows, world_image = item.ckpt, item.rows, item.world
    folder = os.path.join(plan.snapdir, f"resume-{os.getpid()}")
    os.makedirs(folder)
    try:
        path = os.path.join(folder, "checkpoints.sqlite")
        shutil.copyfile(ckpt, path)
        if rows:
            with sqlite3.connect(path) as conn:
                marks = ", ".join("?" * len(rows[0]))
                conn.executemany(f"INSERT OR REPLACE INTO writes VALUES ({marks})", rows)
        with open(world_image, "rb") as incoming:
            image = pickle.load(incoming)
        world = plan.world
        own = getattr(world, "relocatable", False)
        if own:
            world.relocate(folder)
        lock = nullcontext() if own else world_lock(os.path.join(plan.snapdir, "world.lock"))
        with lock:
            world.restore(image)
            saved, ran, error = resume_chain(plan, Sqlite(path), mode, thread, outward)
            counts = plan.counts(thread)
        return {"reached": True, "saved": saved, "ran": ran, "error": error, "counts": counts}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
