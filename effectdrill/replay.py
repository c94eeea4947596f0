"""Before a deploy: resume a copy of the real checkpoints under the graph as it is now.

    python -m effectdrill replay [--checkpoint-db DB] MODULE:GRAPH [--context MODULE:FUNC]
        [--observe MODULE:FUNC|http] [--resume-with JSON] [--thread ID ...] [--json]

LangGraph resumes every saved thread with the graph deployed now, whatever graph saved it. This
copies the SQLite database (with its write-ahead log: the last commits may be only there) into
a temporary folder, never touching the original, and for each unfinished thread (a saved
checkpoint that still names nodes to run, or waits at an interrupt) forks a child that resumes
it there under MODULE:GRAPH. Per thread it reports what the checkpoint was to run next, what the
graph now finds to run, the nodes that ran, the requests they sent (the HTTP observer, see
outbound.py) and, with --observe, the effects counted before and after.

Verdicts: LOST (the saved next step names a node this graph does not have: its work never
runs, and the thread looks done), REPEATED (an effect counted before the resume grew), RESENT
WITHOUT A KEY (a POST or PATCH without Idempotency-Key from the resume: a repeat if the crashed
run had sent it), FAILED (the resume raised), waits (stopped at an interrupt with no
--resume-with), ok. Exit 0 when every thread is ok or waits, 1 otherwise, 2 for a usage
mistake, 130 on Ctrl-C. The resumed nodes run for real: point the graph at a sandbox.
"""

import json
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
from contextlib import contextmanager, redirect_stdout

from effectdrill import outbound
from effectdrill.api import compiled
from effectdrill.cli import (
    EXIT_CLEAN,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    DrillParser,
    json_option,
    load,
    make_context,
)
from effectdrill.errors import DrillError, one_line, require_posix, task_error
from effectdrill.processes import kill_and_reap, read_all, wait_child
from effectdrill.restart import MAX_INVOKES

BRANCH = "branch:to:"  # the channel an edge to a node writes (langgraph/graph/state.py)
START = "__start__"  # the channel of an input that was saved before any node ran
SEND = "__pregel_tasks"  # Send() packets waiting for their step
INTERRUPT = "__interrupt__"  # a pending write of a task stopped at interrupt()
SENT = "Send packets"  # how the report names SEND
MARKS = (START, SENT, INTERRUPT)  # pending work that is not a node's name
LOST, REPEATED, RESENT, FAILED, WAITS, OK = (
    "LOST",
    "REPEATED",
    "RESENT WITHOUT A KEY",
    "FAILED",
    "waits",
    "ok",
)


def replay(graph, checkpoint_db, observe=None, resume_with=None, context=None, threads=None):
    """Resume each unfinished thread of a copy of `checkpoint_db` under `graph`: [ThreadReplay]."""
    require_posix()
    graph = compiled(graph)
    if observe is not None and observe != "http" and not callable(observe):
        raise DrillError(f"the observer must be callable as observe(thread_id), not {observe!r}")
    with copied(checkpoint_db) as copy, outbound.recording_requests() as requests:
        saved = unfinished_threads(copy, threads)
        outcomes = []
        for thread, checkpoint in saved:
            count = requests.effects if observe == "http" else observe
            before = counts(count, thread) if count else {}
            result = resume_in_child(graph, copy, thread, resume_with, context)
            after = counts(count, thread) if count else {}
            outcome = ThreadReplay(thread, saved_work(checkpoint), **result)
            outcome.requests = requests.requests(thread)
            outcome.before, outcome.after = before, after
            outcome.judge(graph)
            outcomes.append(outcome)
    return outcomes


class ThreadReplay:
    """One thread's resume: what was saved to run, what ran, what it sent, the verdict."""

    def __init__(self, thread, saved, next_now=(), ran=(), waiting=(), error=None):
        self.thread, self.saved = thread, list(saved)
        self.next_now, self.ran, self.waiting = list(next_now), list(ran), list(waiting)
        self.error = error
        self.requests, self.before, self.after = [], {}, {}
        self.verdict, self.why = OK, ""

    def judge(self, graph):
        missing = [name for name in self.saved if name not in graph.nodes and name not in MARKS]
        grew = [
            e for e, n in self.after.items() if self.before.get(e, 0) > 0 and n > self.before[e]
        ]
        unkeyed = [r.endpoint for r in outbound.effect_requests(self.requests) if r.key is None]
        if self.error is not None:
            self.verdict, self.why = FAILED, self.error
        elif missing:
            self.verdict = LOST
            self.why = f"no node {', '.join(missing)} in this graph: its work never runs"
        elif grew:
            self.verdict, self.why = REPEATED, ", ".join(grew)
        elif unkeyed:
            self.verdict, self.why = RESENT, ", ".join(dict.fromkeys(unkeyed))
        elif self.waiting:
            self.verdict = WAITS
            self.why = f"at interrupt() in {', '.join(self.waiting)} (give --resume-with)"

    @property
    def ok(self):
        return self.verdict in (OK, WAITS)

    def sent(self):
        words = [
            f"{r.endpoint} ({'no key' if r.key is None else 'key'})"
            for r in outbound.effect_requests(self.requests)
        ]
        return ", ".join(words) or "-"

    def effects(self):
        names = dict.fromkeys([*self.before, *self.after])
        return ", ".join(f"{e} {self.before.get(e, 0)}->{self.after.get(e, 0)}" for e in names)

    def as_json(self):
        return {
            "thread": self.thread,
            "saved_next": self.saved,
            "next_now": self.next_now,
            "ran": self.ran,
            "waiting": self.waiting,
            "requests": [
                {"endpoint": r.endpoint, "host": r.host, "key": r.key}
                for r in outbound.effect_requests(self.requests)
            ],
            "before": self.before,
            "after": self.after,
            "error": self.error,
            "verdict": self.verdict,
            "why": self.why,
        }


def replay_table(outcomes, observed):
    header = ["thread", "saved next", "next now", "ran on resume", "requests"]
    header += ["effects before->after"] if observed else []
    lines = [header + ["verdict"]]
    for o in outcomes:
        cells = [o.thread, ", ".join(o.saved), ", ".join(o.next_now) or "-"]
        cells += [", ".join(o.ran) or "-", o.sent()] + ([o.effects() or "-"] if observed else [])
        lines.append(cells + [f"{o.verdict}: {o.why}" if o.why else o.verdict])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def summary_line(outcomes):
    verdicts = [o.verdict for o in outcomes]
    found = [f"{verdicts.count(v)} {v}" for v in (LOST, REPEATED, RESENT, FAILED) if v in verdicts]
    return f"summary: {len(outcomes)} unfinished thread{'' if len(outcomes) == 1 else 's'}, " + (
        ", ".join(found) or "every one resumes"
    )


def main(argv):

    try:
        args = build_replay_parser().parse_args(argv)
    except SystemExit as stop:
        return stop.code
    try:
        require_posix()
        database = args.checkpoint_db or os.environ.get("CHECKPOINT_DB")
        if not database:
            raise DrillError(
                "name the checkpoint database: --checkpoint-db PATH (or CHECKPOINT_DB)"
            )
        observe = args.observe
        outcomes = replay(
            load(args.graph, "MODULE:GRAPH"),
            database,
            observe=observe if observe in (None, "http") else load(observe, "--observe"),
            resume_with=None
            if args.resume_with is None
            else json_option(args.resume_with, "--resume-with"),
            context=None if args.context is None else make_context(args.context),
            threads=args.thread or None,
        )
    except DrillError as error:
        print(f"effectdrill: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("effectdrill: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        for outcome in outcomes:
            print(json.dumps(outcome.as_json()))
        print(json.dumps({"summary": True, "threads": len(outcomes), "ok": all_ok(outcomes)}))
    elif outcomes:
        print(replay_table(outcomes, args.observe is not None) + "\n\n" + summary_line(outcomes))
    else:
        print("summary: no unfinished thread")
    return EXIT_CLEAN if all_ok(outcomes) else EXIT_FOUND


# helpers


def all_ok(outcomes):
    return all(o.ok for o in outcomes)


def build_replay_parser():

    parser = DrillParser(
        prog="python -m effectdrill replay",
        description="Resume the unfinished threads of a copy of a checkpoint database under "
        "the graph as it is now, and report what runs and what it sends.",
    )
    parser.add_argument("graph", help="MODULE:NAME of a compiled graph or a function returning one")
    parser.add_argument("--checkpoint-db", help="the SQLite file (default: $CHECKPOINT_DB)")
    parser.add_argument("--observe", help="MODULE:FUNC, FUNC(thread_id) -> {effect: count}; http")
    parser.add_argument("--resume-with", help="JSON value for Command(resume=...) at interrupt()")
    parser.add_argument("--context", help="MODULE:FUNC returning the runtime context")
    parser.add_argument("--thread", action="append", help="only this thread (repeatable)")
    parser.add_argument("--json", action="store_true", help="JSON lines, then a summary object")
    return parser


@contextmanager
def copied(database):
    """A copy of the SQLite file and its -wal in a temporary folder, removed after."""
    database = os.fspath(database)
    if database.startswith(("postgresql://", "postgres://")):
        raise DrillError(
            "replay copies a SQLite checkpoint file before it resumes anything; a postgresql:// "
            "database it cannot copy: give a SQLite file"
        )
    if not os.path.isfile(database):
        raise DrillError(f"no checkpoint database at {database}")
    folder = tempfile.mkdtemp(prefix="effectdrill-replay-")
    try:
        copy = os.path.join(folder, "checkpoints.sqlite")
        shutil.copyfile(database, copy)
        if os.path.exists(database + "-wal"):  # commits not yet checkpointed into the file
            shutil.copyfile(database + "-wal", copy + "-wal")
        try:
            with closing_saver(copy) as saver:
                saver.setup()
        except sqlite3.Error as error:
            raise DrillError(f"cannot read the SQLite database {database}: {error}") from None
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def closing_saver(path):
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def unfinished_threads(copy, threads):
    """(thread, latest checkpoint) of each thread whose checkpoint has work left, oldest first."""
    latest = {}
    with closing_saver(copy) as saver:
        for saved in saver.list(None):  # newest first
            configurable = saved.config["configurable"]
            if configurable.get("checkpoint_ns", ""):
                continue  # a subgraph's: its parent's checkpoint says whether the thread is done
            latest.setdefault(configurable["thread_id"], saved)
    chosen = [t for t in reversed(latest) if threads is None or t in threads]
    if threads is not None and (unknown := sorted(set(threads) - set(latest))):
        raise DrillError(f"no thread {', '.join(unknown)} in the checkpoint database")
    return [(t, latest[t]) for t in chosen if saved_work(latest[t])]


def saved_work(saved):
    """What the saved checkpoint was to run, by the names of the graph that saved it: nodes
    (its branch:to: channels), the input, Send packets, a task stopped at interrupt()."""
    channels = saved.checkpoint["channel_values"]
    names = [c[len(BRANCH) :] for c in channels if c.startswith(BRANCH)]
    names += [START] if START in channels else []
    names += [SENT] if channels.get(SEND) else []
    names += [INTERRUPT] if any(w[1] == INTERRUPT for w in saved.pending_writes or []) else []
    return names


def counts(observe, thread):
    try:
        found = observe(thread)
    except Exception as error:
        raise DrillError(f"the observer raised {one_line(error)}") from None
    if not isinstance(found, dict):
        raise DrillError(f"the observer must return a dict of effect name -> count: {found!r:.200}")
    return dict(found)


def resume_in_child(graph, copy, thread, resume_with, context):
    """Fork a child that resumes `thread` on the copy; what it found and ran, or its error."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as runs.Plan.fork_child
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(read_end)
            os.dup2(2, 1)  # the graph's prints go to stderr: stdout is the report's
            result = resume_to_the_end(graph, copy, thread, resume_with, context)
        except BaseException as error:
            result, code = {"error": task_error(error)}, 1
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(code)
    try:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(write_end)
            status = wait_child(pid, read_end)
        except BaseException:
            kill_and_reap(pid)
            raise
        message = read_all(read_end)
    finally:
        os.close(read_end)
    try:
        return json.loads(message)
    except ValueError:
        return {"error": f"the resume died (wait status {status}) without a word"}


def resume_to_the_end(graph, copy, thread, resume_with, context):
    """In the child: resume the thread to its end, or to an interrupt with no answer."""
    from langgraph.types import Command

    config = {"configurable": {"thread_id": thread}}
    with closing_saver(copy) as saver:
        graph = graph.copy(update={"checkpointer": saver})
        next_now = [t.name for t in graph.get_state(config).tasks]
        ran = []
        for _ in range(MAX_INVOKES):
            tasks = graph.get_state(config).tasks
            waiting = [t.name for t in tasks if t.interrupts]
            if not tasks or (waiting and resume_with is None):
                return {"next_now": next_now, "ran": ran, "waiting": waiting}
            step = Command(resume=resume_with) if waiting else None
            with redirect_stdout(sys.stderr):
                for chunk in graph.stream(step, config, context=context, stream_mode="tasks"):
                    if "input" not in chunk:  # a task's result: it ran (see runs.Plan.finish)
                        ran.append(chunk["name"])
        return {"next_now": next_now, "ran": ran, "error": f"not done in {MAX_INVOKES} invokes"}
