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
from contextlib import closing, contextmanager, nullcontext

from effectdrill.errors import DrillError, task_error
from effectdrill.kill import within_subgraph
from effectdrill.plan import Recorder
from effectdrill.report import NO_WORLD
from effectdrill.restart import Failed, clean_chain, resume_chain
from effectdrill.savers import Sqlite, recording_saver
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
    if engine == "auto" and world is None:  # the drill as it always was: its table says nothing
        return "kill", NO_WORLD
    reason = kill_reason(plan, db, mode, http, world)
    if reason is None:
        why = "asked for" if engine == "snapshot" else "the world is declared and restorable"
        return "snapshot", f"{why}: the checkpoints and {world_name(world)} restored per point"
    if engine == "snapshot":
        raise DrillError(f"--engine snapshot cannot drill this graph: {reason}")
    return "kill", reason


def kill_reason(plan, db, mode, http, world):
    """Why a snapshot cannot stand for a real kill here, or None."""
    if mode == "async":
        return "durability async: its crash states come from timing, real kills sample them"
    if mode != "sync":  # exit
        return (
            f"durability {mode}: it saves only as the run ends, every save at once on "
            "LangGraph's background threads; real kills sample which of them finished"
        )
    if http:
        return "--observe http: the requests reach servers the drill cannot restore"
    if world is None:
        return NO_WORLD
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
        self.starts = []  # (calls made before it, task id) of each attempt started (SnapTrace)
        self.by_key = {}

    def extras(self):
        """What the clean run adds to restart.clean_chain's data: snapshots, rows, starts."""
        return (self.snaps, self.rows, self.starts)

    @property
    def carried(self):
        return self.seen, self.calls, self.snaps, self.rows, self.starts

    @carried.setter
    def carried(self, value):
        self.seen, self.calls, self.snaps, self.rows, self.starts = value

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
        self.recorder.starts.append((len(self.recorder.snaps), task))
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
    return clean_chain(plan, SnapDb(db), mode, thread, outward, recorder, trace)


def plan_items(clean, timed, snaps, rows, starts, states):
    """Per crash state: (checkpoint image, writes rows to add, world image), or None where a
    snapshot cannot stand for the kill. `timed`: the calls in the order they were made (the
    snapshots' order); clean.calls: in step order (in_step_order).

    A state saves the calls before its point in step order (a held state: and its step's
    unheld writes). Its checkpoints are the image taken before the first unsaved call, plus
    the rows of the saved writes made after it; its world the image taken when the last of its
    saved calls (and its point's task, or its step's tasks) had run. None when another task
    ran meanwhile (a task mid-effect at the snapshot, a task of the next step, a task that
    started after a held write began: an error handler waits for its node's error to be
    saved, so a real kill holding that write back may never reach the state), or when a
    saved call made after the image is a checkpoint."""
    time = {c.key: i for i, c in enumerate(timed)}
    order = [c.key for c in clean.calls]
    items = []
    for state in states:
        if state.key is not None:
            saved = set(order[: order.index(state.key)])
            ran = {state.key}
        else:  # and a subgraph's calls its step's tasks made meanwhile (Killer lets them go)
            at = sorted(order.index(k) for k in state.group)
            outer = clean.calls[at[0]].group[1]
            inner = {
                c.key
                for c in clean.calls[at[0] : at[-1]]
                if within_subgraph(c.group[1], outer) and c.key not in state.group
            }
            saved = set(order[: at[0]]) | (state.group - state.hold) | inner
            ran = set(state.group)
        items.append(made_of(state, saved, ran, time, timed, snaps, rows, starts))
    return items


def made_of(state, saved, ran, time, timed, snaps, rows, starts):
    """One state's item (see plan_items), or None."""
    t0 = min(time[k] for k in time if k not in saved)
    late = [k for k in saved if time[k] > t0]
    if any(timed[time[k]].kind == "put" for k in late):
        return None
    tw = max(time[k] for k in [*late, *ran])
    own = {timed[time[k]].task_id for k in [*late, *ran]}
    held = [time[k] for k in state.hold]
    for n, task in starts:
        if t0 < n <= tw and (task not in own or any(h < n for h in held)):
            return None
    if snaps[tw][2]:  # a task of another thread mid-effect then
        return None
    added = [r for k in sorted(late, key=time.get) for r in rows.get(k, ())]
    return snaps[t0][0], added, snaps[tw][1]


def snap_resume_chain(plan, db, mode, item, thread, outward):
    """A crash state made from its snapshots: the checkpoint image in a database of this chain's
    own, the world restored (in a folder of its own where it can be relocated, else in place
    and one resume at a time), the thread resumed as after a kill (restart.resume_chain, each
    invoke in a new process), then observed here, before another resume touches the world.
    Where the clean run took one invoke (item.inline), the checkpoints are an in-memory copy of
    the image (ImageDb): no file to write, none to sync."""
    folder = os.path.join(plan.snapdir, f"resume-{os.getpid()}")
    os.makedirs(folder)
    try:
        with open(item.ckpt, "rb") as incoming:
            checkpoints = ImageDb(incoming.read(), item.rows)
        with open(item.world, "rb") as incoming:
            image = pickle.load(incoming)
        world = plan.world
        own = getattr(world, "relocatable", False)
        if own:
            world.relocate(folder)
        lock = nullcontext() if own else world_lock(os.path.join(plan.snapdir, "world.lock"))
        with lock:
            world.restore(image)
            if item.inline:
                saved, ran, error = resume_here(plan, checkpoints, mode, thread, outward, folder)
            else:
                db = checkpoints.on_disk(os.path.join(folder, "checkpoints.sqlite"))
                saved, ran, error = resume_chain(plan, db, mode, thread, outward)
            counts = plan.counts(thread)
        return {"reached": True, "saved": saved, "ran": ran, "error": error, "counts": counts}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class ImageDb:
    """A checkpoint image as the drill's database (savers.Sqlite's saver()), in memory: each
    saver() deserializes it with the held state's writes rows added, and keeps what the run
    saved when it closes. One process's: on_disk() makes it a file a forked process can share."""

    def __init__(self, image, rows):
        self.image, self.rows = image, rows

    @contextmanager
    def saver(self, recorder=None):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            conn.deserialize(self.image)
            if self.rows:
                add_rows(conn, self.rows)
                self.rows = ()
            saver = recording_saver(SqliteSaver)(conn)
            saver.is_setup = True  # the image holds the tables
            saver.recorder = recorder
            yield saver
            with saver.lock:
                self.image = conn.serialize()
        finally:
            conn.close()

    def on_disk(self, path):
        """The image (and its rows) in a file at path: savers.Sqlite on it."""
        with open(path, "wb") as out:
            out.write(self.image)
        if self.rows:
            with closing(sqlite3.connect(path)) as conn:
                add_rows(conn, self.rows)
            self.rows = ()
        return Sqlite(path)


def add_rows(conn, rows):
    """A held state's saved writes rows, added to a checkpoint database."""
    with conn:
        marks = ", ".join("?" * len(rows[0]))
        conn.executemany(f"INSERT OR REPLACE INTO writes VALUES ({marks})", rows)


def resume_here(plan, db, mode, thread, outward, folder):
    """restart.resume_chain's resume with its first invoke in this process: forked from the warm
    parent, it never ran the graph, as a new process would not have (one fork fewer). Used when
    the clean run took one invoke (no interrupt), so one invoke finishes the resume; should a
    task be left, the rest goes on in new processes forked from this one, on a file."""
    try:
        saved, ran, more = plan.one_invoke(db, None, thread, mode, False)
    except DrillError as error:
        raise Failed({"drill_error": str(error)}) from None
    except Exception as error:  # the graph raised: the resume's finding
        return plan.saved, [], task_error(error)
    if not more:
        return saved, ran, None
    db = db.on_disk(os.path.join(folder, "checkpoints.sqlite"))
    _, later, error = resume_chain(plan, db, mode, thread, outward)
    return saved, ran + later, error
