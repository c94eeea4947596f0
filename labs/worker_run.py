"""`python -m labs.workers run`: a worker. It takes a job from the queue (labs/worker_queue.py)
and runs its thread to the end through the ledger, drains on SIGTERM, and survives the database
and the receiver going away (labs/workers.py's docstring)."""

import asyncio
import contextlib
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
from datetime import timedelta

import checkpoints
import effects
import exitcodes
import failpoints
import tracing
import workflow
from exitcodes import EXIT_NO_ANSWER, EXIT_THREAD, EXIT_USAGE, UserError, emit
from labs.threads import WORKER_JOB
from labs.worker_holds import LabHold, lab_hold_scope
from labs.worker_queue import (
    CONNECT_TIMEOUT_S,
    DRAINED,
    ENTRYPOINT,
    JOB_ATTEMPTS,
    JOBS_PER_WORKER,
    NO_WORKER_NOTICE_S,
    POLL_S,
    RECONNECT_FIRST_S,
    RECONNECT_MAX_S,
    connect_to_queue_db,
    first_line_of,
    jittered,
    job_ledger,
    job_unfinished,
    jobs,
    lost_connection,
    open_queue,
    print_worker_line,
)

GRAPH = "labs.lab_graph:build_lab_graph"  # WORKER_GRAPH's default: the lab's, with --mode


class LineStdout:
    """sys.stdout for a worker running jobs in threads: print() writes a line and its newline in
    two calls, so two threads' events could interleave; this writes whole lines, one at a time."""

    def __init__(self, stream):
        self.stream, self.lock, self.local = stream, threading.Lock(), threading.local()

    def write(self, text):
        pending = getattr(self.local, "pending", "") + text
        *lines, self.local.pending = pending.split("\n")
        if lines:
            with self.lock:
                self.stream.write("".join(line + "\n" for line in lines))
        return len(text)

    def flush(self):
        with self.lock:
            self.stream.flush()


# --- the worker ------------------------------------------------------------------------------


async def work(args):
    """Serve the queue until SIGTERM or Ctrl-C; a lost database is waited for, never fatal."""
    worker = Worker(args)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop, signum)
    sys.stdout = LineStdout(sys.stdout)
    await open_queue(args.checkpoint_db, time.monotonic() + args.db_wait_s)  # installs the queue
    with open_checkpoints(args.checkpoint_db) as (saver, pool):
        worker.saver, worker.pool = saver, pool
        # before the first job: LangGraph's import would stop its heartbeat
        warm_up(saver, args.build_graph)
        emit("worker", heartbeat_s=args.heartbeat_s, drain=args.drain)  # ready: jobs from here
        while not worker.stopping:
            try:
                await worker.serve()
                break
            except Exception as error:
                if not lost_connection(error):
                    raise
                lost = time.monotonic()
                print_worker_line(f"lost the database ({first_line_of(error)}); reconnecting")
                if await worker.reconnect():
                    print_worker_line(f"the database is back after {time.monotonic() - lost:.1f} s")
    if worker.stopping == signal.SIGINT:
        print_worker_line("interrupted; running graphs drained")
        return exitcodes.EXIT_INTERRUPTED
    return 0


class Worker:
    """One worker process: its running jobs (each with a RunControl), its stop, its reconnects."""

    def __init__(self, args):
        self.args, self.client = (
            args,
            ticket_client(args),
        )
        self.running = {}  # job id -> the RunControl of its graph
        self.stopping = None  # the first SIGTERM or SIGINT
        self.pgq = self.saver = self.pool = None

    def stop(self, signum):
        if self.stopping:  # the second Ctrl-C or SIGTERM: stop now, as a crash would
            print_worker_line(
                f"stopped with {len(self.running)} job(s) running; each goes to another "
                f"worker once its heartbeat is {self.args.heartbeat_s:g} s old"
            )
            os._exit(130 if signum == signal.SIGINT else 143)
        self.stopping = signum
        if self.pgq:
            self.pgq.shutdown.set()  # no new jobs; serve() returns once the running ones end
        for control in self.running.values():
            control.request_drain(signal.Signals(signum).name)
        if self.running:
            print_worker_line(
                f"draining {len(self.running)} running job(s) at their next step; each goes "
                "back to the queue (Ctrl-C again: stop now)"
            )

    async def serve(self):
        """Run jobs on a new queue connection until stopped; raises when the connection breaks."""
        from pgqueuer import PgQueuer

        conn = await connect_to_queue_db(self.args.checkpoint_db)
        self.pgq = PgQueuer.from_asyncpg_connection(conn)
        await conn.execute(
            "DELETE FROM worker_sessions s WHERE NOT EXISTS "
            "(SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.backend_pid)"
        )
        await conn.execute(
            "INSERT INTO worker_sessions VALUES ($1, $2, pg_backend_pid())",
            self.pgq.qm.queue_manager_id,
            f"{socket.gethostname()}:{os.getpid()}",
        )
        self.args.queue_manager_id = self.pgq.qm.queue_manager_id  # lab-only
        self.args.queue_table = self.pgq.qm.queries.qbe.qualified.queue_table  # lab-only
        if self.stopping:
            return
        self.pgq.entrypoint(ENTRYPOINT, on_failure="hold")(self.handle)  # hold: dead, visible
        drainer = asyncio.create_task(self.drain_when_idle()) if self.args.drain else None
        try:
            await self.pgq.run(
                dequeue_timeout=timedelta(
                    seconds=1
                ),  # how often an idle worker looks for stale jobs
                batch_size=1,
                max_concurrent_tasks=JOBS_PER_WORKER,
                heartbeat_timeout=timedelta(seconds=self.args.heartbeat_s),
            )
        finally:
            if drainer:
                drainer.cancel()

    async def handle(self, job):
        """One job. A retryable failure sends it back to the queue for later, a drain at once
        (both with pgqueuer's RetryRequested); any other failure, or the last attempt, is dead."""
        from langgraph.runtime import RunControl
        from pgqueuer.errors import RetryRequested

        operation = json.loads(job.payload)
        control = self.running[job.id] = RunControl()
        if self.stopping:
            control.request_drain(signal.Signals(self.stopping).name)
        try:
            # A thread, not the event loop: the loop must keep the job's heartbeat going.
            final = await asyncio.to_thread(self.run_job, operation, job.id, control)
        except Exception as error:
            why = retryable(error)
            failures = await asyncio.to_thread(self.record_failure, job.id, error)
            attempts = operation.get("attempts", JOB_ATTEMPTS)
            if why and failures < attempts:
                delay = retry_delay(failures, self.args.retry_s, self.args.retry_max_s)
                emit(
                    "job_retry", attempt=failures + 1, attempts=attempts, error=str(error),
                    job=job.id, next_try_s=round(delay, 1), thread=operation["thread"],
                )  # fmt: skip
                raise RetryRequested(delay=timedelta(seconds=delay), reason=why) from error
            emit("job_dead", attempts=failures, error=str(error), job=job.id,
                 thread=operation["thread"])  # fmt: skip
            raise JobDead(str(error)) from error
        finally:
            self.running.pop(job.id, None)
        if final is None:  # drained: its checkpoint is saved; any worker resumes it now
            await asyncio.to_thread(
                self.note, job.id, "last_error = %s, drains = drains + 1", DRAINED
            )
            emit("job_drained", job=job.id, thread=operation["thread"])
            raise RetryRequested(delay=timedelta(0), reason=DRAINED)
        await asyncio.to_thread(
            self.note, job.id, "done = now(), ticket_id = %s", final.get("ticket_id")
        )

    def run_job(self, operation, job_id, control):
        hold = LabHold(operation, job_id, self.args) if operation.get("lab_hold") else None
        final = None
        try:
            with job_ledger(self.args.checkpoint_db) as ledger:
                graph = self.args.build_graph(self.saver)
                final = run_job_thread(graph, self.client, ledger, operation, job_id, control, hold)
        finally:
            if hold:  # lab-only
                hold.finished(final)  # lab-only
        return final

    def record_failure(self, job_id, error):
        """Count one failed run of the job; how many it has had (its own table, not pgqueuer's
        attempts, which a drain increments too)."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "UPDATE worker_jobs SET failures = failures + 1, last_error = %s "
                "WHERE job = %s RETURNING failures",
                (str(error), job_id),
            ).fetchone()
        return row["failures"] if row else 1

    def note(self, job_id, assignments, value):
        with self.pool.connection() as conn:
            conn.execute(f"UPDATE worker_jobs SET {assignments} WHERE job = %s", (value, job_id))

    async def reconnect(self):
        """Until the database answers again (or a stop): bounded exponential backoff, jitter."""
        delay = RECONNECT_FIRST_S
        while not self.stopping:
            await asyncio.sleep(jittered(delay))
            try:
                conn = await connect_to_queue_db(self.args.checkpoint_db)
            except UserError as error:
                if error.exit_code != EXIT_NO_ANSWER:
                    raise
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            await conn.close()
            return True
        return False

    async def drain_when_idle(self):
        """--drain: stop once no job is left. While the only jobs left run on other workers
        (lab 10's held job never ends on its own), say so once rather than wait in silence."""
        queries, idle_since, told = self.pgq.qm.queries, None, False
        while not self.pgq.shutdown.is_set():
            await asyncio.sleep(POLL_S)
            left = [] if self.running else [j for j in await jobs(queries) if job_unfinished(j)]
            if not self.running and not left:
                self.pgq.shutdown.set()
            elsewhere = left and all(j["status"] == "running" for j in left)
            idle_since = (idle_since or time.monotonic()) if elsewhere else None
            if idle_since and not told and time.monotonic() - idle_since > NO_WORKER_NOTICE_S:
                workers = ", ".join(sorted({j["worker"] for j in left}))
                print_worker_line(
                    f"--drain: waiting for {len(left)} job(s) running on other workers ({workers})"
                )
                told = True


def warm_up(saver, build_graph):
    """Import LangGraph and build the graph once, before the worker takes a job.

    A job's heartbeat beats in the event loop; an import there (about a second) would stop it
    past WORKER_HEARTBEAT_S, and another worker would take a job that is still running
    (docs/performance.md, "a worker imports LangGraph before its first job")."""
    for module in ("langgraph.errors", "langgraph.runtime"):
        importlib.import_module(module)
    build_graph(saver)  # the graph run_job builds


class JobDead(Exception):
    """A job that will not be run again: pgqueuer holds it as `failed` (on_failure="hold")."""


def retryable(error):
    """Why a failed run may succeed later (the receiver or the database was away), or None."""
    import psycopg
    import psycopg_pool

    if isinstance(error, exitcodes.NoAnswer | exitcodes.Unreachable):
        return "the receiver did not answer"
    if isinstance(error, effects.InFlight):  # its receipt will be there for the next try
        return "another worker is performing its effect"
    if isinstance(error, urllib.error.HTTPError) and error.code in (502, 503, 504):
        return f"the receiver answered {error.code}"
    if isinstance(error, psycopg.OperationalError | psycopg_pool.PoolTimeout):
        return "the database was unreachable"
    return None


def retry_delay(failures, first_s, max_s):
    """Exponential backoff with jitter: first_s, 2 x first_s, ... at most max_s."""
    return jittered(min(first_s * 2 ** (failures - 1), max_s))


def show_thread_state(args):
    """The thread's newest checkpoint, read through the graph the workers run."""
    with checkpoints.open_checkpointer(args.checkpoint_db) as saver:
        snapshot = args.build_graph(saver).get_state(checkpoints.thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def load_graph(spec):
    """WORKER_GRAPH=module:function: (the module, its function that compiles the graph on a
    checkpointer). The module is imported, not run: its main() does not start."""
    name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(name)
        builder = getattr(module, function)
    except (ImportError, AttributeError, ValueError) as error:
        raise UserError(
            f"WORKER_GRAPH={spec!r} names no graph builder ({error}); use module:function, "
            f"like {GRAPH}",
            EXIT_USAGE,
        ) from None
    if not callable(builder):
        raise UserError(f"WORKER_GRAPH={spec!r}: {function} is not a function", EXIT_USAGE)
    return module, builder


@contextlib.contextmanager
def open_checkpoints(url):
    """LangGraph's PostgresSaver on a connection pool that replaces broken connections
    (check_connection), so a worker's graphs work again once a lost database is back.
    checkpoints.open_postgres creates or migrates the tables, under its lock."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    with checkpoints.open_postgres(url):
        pass
    settings = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=JOBS_PER_WORKER + 1,  # a graph per job, and the worker's own notes
        kwargs=settings,
        check=ConnectionPool.check_connection,
        timeout=CONNECT_TIMEOUT_S,  # a graph waiting for a connection fails after this (retried)
        open=True,
    )
    try:
        yield PostgresSaver(pool), pool
    finally:
        pool.close()


def ticket_client(args):
    return args.settings.client()  # the API provider's: API_URL, API_TIMEOUT_S, API_ATTEMPTS


def run_job_thread(graph, client, ledger, operation, job_id, control, lab_hold=None):
    """One job's run: start the thread from the job's input, or resume it from its checkpoint,
    its effects through ledger. The final values, or None when control drained the run at a
    step boundary."""
    from langgraph.errors import GraphDrained

    config = {"configurable": {"thread_id": operation["thread"]}}
    config["metadata"] = {WORKER_JOB: job_id}  # its checkpoints say whose thread it is
    resume = bool(graph.get_state(config).values)
    emit("job", job=job_id, resume=resume, thread=operation["thread"])
    first_input = None
    if not resume:
        first_input = {"operation_id": operation["operation_id"], "title": operation["title"]}
        if "mode" in operation:  # lab-only
            first_input["mode"] = operation["mode"]  # lab-only
    points = {}
    if lab_hold and not resume:  # lab-only: only the run that starts the thread holds
        client, points = lab_hold.client(client), {lab_hold.at: "hold"}  # lab-only
    with tracing.run(operation["thread"]) as span:  # TRACE: a drain is an event, not an error
        try:
            # sync: each node's result is saved before the next node starts, so a resume repeats
            # at most the node that was running. control: a drain stops it at the next step.
            with failpoints.scoped(points), lab_hold_scope(lab_hold):  # lab-only
                final = graph.invoke(
                    first_input,
                    config,
                    durability="sync",
                    control=control,
                    context=workflow.Context(client, ledger),
                )
        except GraphDrained as drained:
            tracing.drained(span, drained.reason)
            return None
    emit("done", **final)
    return final
