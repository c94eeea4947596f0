"""Workers that run workflow.py's graph from a job queue in Postgres: the lab on several machines.

    python -m labs.workers submit --thread T --operation K [--mode ledger] [--title ...]
    python -m labs.workers run [--drain]        a worker; --drain: exit once no job is queued or
    running
    python -m labs.workers status               every job: queued, running, stalled, retrying, dead,
                                          done; and how many effects are unknown, the oldest's age
    python -m labs.workers wait [--thread T]    until no job (of thread T) is queued or running
    python -m labs.workers state --thread T     the thread's checkpoint, as `workflow.py state`
    python -m labs.workers reconcile [--confirmed KEY ...] [--not-sent KEY ...]   as workflow.py's
    python -m labs.workers metrics [--port N]   the queue's and the ledger's figures in
    Prometheus's text
                                          format, once; --port: served at GET /metrics until
                                          SIGTERM or Ctrl-C. On a SQLite CHECKPOINT_DB (the lab
                                          on one machine): the ledger's alone, read-only

Each job is one operation on one checkpoint thread. A worker takes a job and runs the thread:
from the job's input when the thread has no checkpoint, else from its checkpoint (invoke(None)).
The checkpoints, the queue and the effect ledger (effects.py) live in the same Postgres database
(CHECKPOINT_DB), so any worker on any machine can resume any thread, and finds what every other
worker's runs sent. The graph is WORKER_GRAPH's (module:function, given a checkpointer); the
lab's by default, whose --mode picks the lessons' variants (lab.MODES; ledger by default).

The queue is pgqueuer 1.6, not procrastinate; both keep jobs in Postgres and both were tried (see
the README's "Past one machine"). pgqueuer because:
  - a worker that dies is handled by the queue itself: every job has its own heartbeat, and every
    dequeue also takes `picked` jobs whose heartbeat is older than heartbeat_timeout. procrastinate
    3.10 leaves a dead worker's job `doing` until a periodic reaper you run yourself retries it.
  - one job per thread: enqueue's dedupe_key is unique over queued and picked jobs, so a second
    job for a thread that has one is refused at submit. procrastinate's queueing_lock refuses a
    second job only while the first still waits (a unique index over `todo` jobs), and its lock
    runs jobs of one lock one after the other.
  - a retry is a row update in the database (RetryRequested: the job is queued again with a later
    execute_after), so any worker may take the retry, and it survives the worker that asked for it.
  pgqueuer 1.6's Queries.install() is not idempotent: run twice it raises DuplicateObjectError
  (CREATE TYPE without IF NOT EXISTS: pgqueuer/adapters/persistence/schema_ddl.py,
  render_install). Its Queries.upgrade() is (it applies only what the live schema lacks:
  apply_upgrade in pgqueuer/adapters/persistence/queries.py). open_queue() calls install() only
  when schema_is_installed() finds nothing, under schema_lock().
  The price: pgqueuer 1.6 takes async entrypoints only, so the sync graph.invoke runs in
  asyncio.to_thread. Run in the event loop, it would block the loop, stop the job's heartbeat, and
  another worker would take a job that is still running; so would LangGraph's first import, which
  a worker therefore does before it takes a job (warm_up).

What a worker survives:
  - its database going away (a restart, a failover): one line when the connection is lost, one
    when it is back, reconnecting with bounded exponential backoff and jitter. Jobs it had running
    finish, or go to another worker once their heartbeat is stale, as when a worker dies.
  - the receiver going away for longer than the client's own retries: the job goes back to the
    queue and is tried again later (WORKER_JOB_ATTEMPTS runs in all), resuming its thread from its
    checkpoint, so its effect is keyed as always. A job that used them all is dead: `status` shows
    its last error, and `wait` names its operation and exits 5.
  - a deploy: SIGTERM asks every running graph to drain at its next step boundary (RunControl,
    LangGraph 1.2.0 and later); its checkpoint is saved and its job is queued again at once for
    another worker. The worker exits 0 once its graphs have stopped.

Neither queue can stop a worker that froze (a long GC pause, SIGSTOP, a paused VM) for longer than
its heartbeat and then wakes up: by then its job is another worker's, and the woken worker still
finishes its run. Two runs of one thread: the ledger is what the second one meets (lab 10). It
finds the receipt and sends nothing; or, while the other worker's request is out, the key's lock
(effects.InFlight: the job is tried again later, and then finds the receipt). Without the ledger
(--mode safe) only the receiver's idempotency key keeps the second request harmless, and only
while the receiver still holds that key (lab 14).

Output is one JSON object per line (workflow.py's emit). Exit codes: workflow.py's (3 also when
CHECKPOINT_DB does not answer within WORKER_DB_WAIT_S), 4 when a thread already has a job queued
or running, 5 when `wait` finds dead jobs; `run` exits 0 on SIGTERM once its graphs have drained
(`metrics --port`: at once), 130 on Ctrl-C; a second Ctrl-C or SIGTERM stops it at once (130,
143), as a crash would, and its running jobs go to another worker once their heartbeat is stale.

Configuration (environment, read in main()):
    WORKER_GRAPH         labs.cli:build_graph: the module:function that compiles the graph the jobs run
    API_URL, API_TIMEOUT_S, API_ATTEMPTS, TRACE   as for workflow.py (compose sets API_URL)
    CHECKPOINT_DB        postgresql://... (required: checkpoints and queue; compose sets it)
    WORKER_HEARTBEAT_S   10: a job whose worker has not beaten for this long goes to another one
    WORKER_JOB_ATTEMPTS  6: runs of a job that fails for a retryable reason, before it is dead;
                         set at submit, carried by the job
    WORKER_RETRY_S       2: seconds before the first retry, doubled each time, at most
                         WORKER_RETRY_MAX_S (60); each wait is a random part (half to all) of it.
                         With the defaults the retries wait 31-62 s in all: an outage shorter
                         than that is waited out, and a receiver gone for good makes the job dead
                         about a minute after its first failure, not never.
    WORKER_DB_WAIT_S     10: seconds submit, status and a starting worker wait for a database
                         that does not answer (wait uses its --timeout), then exit 3
    FAILPOINTS           the core's fault points (workflow.POINTS), for every job of this worker:
                         scale chaos holds its first workers in the crash window with
                         "after-ack=pause(PATH)", then widens it with "after-ack=sleep(S)"
"""

import asyncio
import contextlib
import contextvars
import dataclasses
import http.server
import importlib
import json
import logging
import os
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
import urllib.error
from datetime import timedelta

import checkpoints
import commandline
import effects
import exitcodes
import failpoints
import providers
import tracing
import workflow
from exitcodes import EXIT_NO_ANSWER, EXIT_THREAD, EXIT_USAGE, UserError, emit
from labs import inbox, relay

ENTRYPOINT = "operation"  # the one kind of job: run one operation's thread
JOBS_PER_WORKER = 2  # pgqueuer's minimum cap for a batch of 1 (max_concurrent_tasks >= 2 x batch)
POLL_S = 0.1  # seconds between looks at the queue in `wait` and --drain
CONNECT_TIMEOUT_S = 10  # seconds for one connection attempt: a database that does not answer
DB_WAIT_S = 10.0  # submit, status, a starting worker: how long a database outage is waited out
RECONNECT_FIRST_S = 0.25  # the first pause before connecting again, doubled each time ...
RECONNECT_MAX_S = 5.0  # ... up to this: a database back after a restart is found within ~5 s
JOB_ATTEMPTS = 6  # runs of a job that keeps failing for a retryable reason (see the docstring)
RETRY_S = 2.0  # the first retry's delay: longer than the client's own retries (~1.75 s)
RETRY_MAX_S = 60.0  # the longest delay between two runs of a job
NO_WORKER_NOTICE_S = 3.0  # `wait` says nothing is running the queued jobs after this long
EXIT_DEAD = 5  # `wait`: jobs used up their attempts; their operations did not finish
DRAINED = "drained"  # the reason on a job that a deploy sent back to the queue
GRAPH = "labs.cli:build_graph"  # WORKER_GRAPH's default: the lab's graph, with its --mode variants

# labs/workers.py's own bookkeeping beside pgqueuer's tables: who runs (a worker's session is alive
# while its queue connection is: pg_stat_activity), and what became of each job.
WORKER_TABLES = (
    """CREATE TABLE IF NOT EXISTS worker_sessions (
        queue_manager_id uuid PRIMARY KEY, name text NOT NULL, backend_pid int NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS worker_jobs (
        job bigint PRIMARY KEY, thread text NOT NULL, operation text NOT NULL,
        failures int NOT NULL DEFAULT 0, last_error text, ticket_id int, done timestamptz)""",
    # drains apart from failures: a deploy's drain is a clean stop, not a failed run
    "ALTER TABLE worker_jobs ADD COLUMN IF NOT EXISTS drains int NOT NULL DEFAULT 0",
)


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


def require_postgres(url):
    if not url.startswith(("postgresql://", "postgres://")):
        raise UserError(
            f"CHECKPOINT_DB must be a postgresql:// URL for workers, not {url!r}", EXIT_USAGE
        )


# --- the queue: submit, status, wait ---------------------------------------------------------


async def enqueue(queries, operation):
    """Queue one operation; the job's id. dedupe_key: one queued-or-running job per thread,
    enforced by a unique index, so a second one raises UserError (exit 4). A dead job of the
    thread is replaced: submitting again is how its operation gets another go."""
    from pgqueuer.errors import DuplicateJobError

    thread = operation["thread"]
    try:
        (job,) = await queries.enqueue(
            ENTRYPOINT, json.dumps(operation).encode(), dedupe_key=thread
        )
    except DuplicateJobError as error:
        raise UserError(
            f"thread {thread!r} already has a job queued or running; wait for it", EXIT_THREAD
        ) from error
    table = queries.qbe.qualified.queue_table
    await queries.driver.execute(
        f"DELETE FROM {table} WHERE dedupe_key = $1 AND status = 'failed'",  # noqa: S608
        thread,
    )
    await queries.driver.execute(
        "INSERT INTO worker_jobs (job, thread, operation) VALUES ($1, $2, $3)",
        job,
        thread,
        operation["operation_id"],
    )
    return job


async def submit(args):
    queries = await open_queue(args.checkpoint_db, time.monotonic() + args.db_wait_s)
    operation = {"thread": args.thread, "operation_id": args.operation, "title": args.title}
    operation["attempts"] = args.job_attempts
    operation.update(lab_operation_fields(args))  # lab-only: --mode, --lab-hold
    job = await enqueue(queries, operation)
    await lab_forget_hold(queries, args)  # lab-only
    emit("submitted", job=job, thread=args.thread)


async def status(args):
    """The jobs, and what is stuck: how many effects are open, their answer never recorded
    (unknown, or requested: a kill in the crash window, or a request out right now; reconcile
    settles them), and the age of the oldest, in seconds."""
    queries = await open_queue(args.checkpoint_db, time.monotonic() + args.db_wait_s)
    listed = await jobs(queries)
    unknown, oldest_s = await asyncio.to_thread(stuck_effects, args.checkpoint_db)
    emit("jobs", effects_unknown=unknown, jobs=listed, oldest_unknown_s=round(oldest_s))


def stuck_effects(url):
    with job_ledger(url) as ledger:
        return ledger.stuck()


def reconcile(args):
    """workflow.py's reconcile, on the workers' ledger: the open effects asked by key, or
    settled as a person says (--confirmed, --not-sent). It looks up the effects the graph's
    module declares, and the core's."""
    args.effects = effects.declared(vars(workflow)) | effects.declared(vars(args.graph_module))
    commandline.run_reconcile(args, args.settings)


async def wait(args):
    """Until no job (of --thread) is queued or running, and no worker is still running it."""
    deadline = time.monotonic() + args.timeout
    queries = await open_queue(args.checkpoint_db, deadline)
    if args.wait_for == "hold":  # lab-only
        return await lab_wait_for_hold(queries, args)  # lab-only
    unattended_since, told = None, False
    while True:
        try:
            listed = await jobs(queries, args.thread)
            live = await live_workers(queries)
            busy = await lab_holding(queries, args.thread)  # lab-only
        except Exception as error:
            if not lost_connection(error):
                raise
            queries = await open_queue(args.checkpoint_db, deadline)  # a short outage: wait it out
            continue
        pending = [j for j in listed if unfinished(j)]
        if not pending and not busy:
            break
        unattended_since = None if live or not pending else unattended_since or time.monotonic()
        if (
            unattended_since
            and not told
            and time.monotonic() - unattended_since > NO_WORKER_NOTICE_S
        ):
            print(f"labs.workers: {no_worker(pending)}", file=sys.stderr, flush=True)
            told = True
        if time.monotonic() > deadline:
            what = no_worker(pending) if not live else f"{len(pending)} job(s) still running"
            raise UserError(f"{what} after {args.timeout:g} s", EXIT_NO_ANSWER)
        await asyncio.sleep(POLL_S)
    dead = [j for j in listed if j["status"] == "dead"]
    if dead:
        names = ", ".join(j["operation"] for j in dead)
        raise UserError(
            f"{len(dead)} operation(s) did not finish, their jobs are dead: {names} "
            "(status shows each one's last error; submit it again once the cause is fixed)",
            EXIT_DEAD,
        )
    emit("idle", **({"thread": args.thread} if args.thread else {}))
    await lab_report_held_runs(queries, args.thread)  # lab-only


def unfinished(job):
    """A job some worker will still run: queued, running, stalled or retrying."""
    return job["status"] not in ("dead", "done")


def no_worker(pending):
    return (
        f"{len(pending)} job(s) queued and no worker is running; start one "
        "(docker compose up -d worker, or natively: python -m labs.workers run)"
    )


async def jobs(queries, thread=None):
    """Every job, oldest first, with what is happening to it (and `drains`, how many times a deploy
    drained it, when it was: a drain is no failure, it counts no attempt and leaves no error):
    queued     waiting for a worker
    running    on a live worker (`worker` names it: host:pid)
    stalled    picked by a worker that is gone; another takes it once its heartbeat is stale
    retrying   failed for a retryable reason; `attempt` n of `attempts` runs in `next_try_s`
    dead       used up its attempts, or failed for a reason no retry fixes (`error`)
    done       finished (`ticket_id`)"""
    table = queries.qbe.qualified.queue_table
    rows = await queries.driver.fetch(
        f"""SELECT q.id AS job, q.status::text, q.dedupe_key AS thread,
            convert_from(q.payload, 'UTF8')::jsonb AS payload, j.failures, j.last_error,
            j.ticket_id, j.drains, s.name AS worker, a.pid IS NOT NULL AS alive,
            greatest(0, extract(epoch FROM q.execute_after - now()))::float AS wait_s
        FROM {table} q LEFT JOIN worker_jobs j ON j.job = q.id
        LEFT JOIN worker_sessions s ON s.queue_manager_id = q.queue_manager_id
        LEFT JOIN pg_stat_activity a ON a.pid = s.backend_pid
        WHERE q.entrypoint = $1 AND ($2::text IS NULL OR q.dedupe_key = $2)
        UNION ALL
        SELECT j.job, 'done', j.thread, jsonb_build_object('operation_id', j.operation),
            j.failures, j.last_error, j.ticket_id, j.drains, NULL, false, 0
        FROM worker_jobs j WHERE j.done IS NOT NULL AND ($2::text IS NULL OR j.thread = $2)
        ORDER BY job""",  # noqa: S608 (pgqueuer's own table name)
        ENTRYPOINT,
        thread,
    )
    return [describe(row) for row in rows]


def describe(row):
    payload = json.loads(row["payload"])  # asyncpg hands jsonb over as its text
    job = {"job": row["job"], "thread": row["thread"], "operation": payload["operation_id"]}
    failures, attempts = row["failures"] or 0, payload.get("attempts", JOB_ATTEMPTS)
    if row["status"] == "picked":
        job.update(status="running" if row["alive"] else "stalled", worker=row["worker"])
    elif row["status"] == "queued" and failures and row["last_error"] != DRAINED:
        job.update(status="retrying", attempt=failures + 1, attempts=attempts)
        job.update(next_try_s=round(row["wait_s"], 1), error=row["last_error"])
    elif row["status"] == "failed":
        job.update(status="dead", attempts=failures, error=row["last_error"])
    elif row["status"] == "done":
        job.update(status="done", ticket_id=row["ticket_id"])
    else:
        job["status"] = "queued"
    if row["drains"]:
        job["drains"] = row["drains"]
    return job


async def live_workers(queries):
    rows = await queries.driver.fetch(
        "SELECT s.name FROM worker_sessions s JOIN pg_stat_activity a ON a.pid = s.backend_pid"
    )
    return [r["name"] for r in rows]


async def metrics(args):
    """The queue's and the ledger's figures as Prometheus text: printed once, or served with
    --port. On a SQLite CHECKPOINT_DB, the ledger's alone (there is no queue).

    Read from the tables at each scrape, not counted in a worker: a deploy's SIGTERM drains a
    worker and then it exits, and a counter of its own would go with it. The tables are the
    queue's, not one worker's, so one process serves them: scraped from each of three workers,
    every drain would be there three times. The counters start again only with the database."""
    if checkpoints.is_postgres(args.checkpoint_db):  # installs the queue
        await open_queue(args.checkpoint_db, time.monotonic() + args.db_wait_s)
    if args.port is None:
        print(await metrics_text(args.checkpoint_db), end="")
        return
    try:
        server = MetricsServer((args.host, args.port), args.checkpoint_db)
    except (OSError, OverflowError) as error:  # taken, not 0-65535, not this machine's host
        why = getattr(error, "strerror", None) or error
        raise UserError(f"cannot serve on {args.host}:{args.port} ({why})", EXIT_USAGE) from None
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)  # exits 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emit("metrics", host=args.host, port=server.server_address[1])
    try:
        await stop.wait()
    finally:
        server.shutdown()


async def metrics_text(url):
    ledger = await asyncio.to_thread(lambda: ledger_lines(url) + outbox_lines(url))
    if not checkpoints.is_postgres(url):
        return "\n".join(ledger) + "\n"
    from pgqueuer import Queries

    conn = await connect(url)
    try:
        listed = await jobs(Queries.from_asyncpg_connection(conn))
        runs = await conn.fetchrow(
            "SELECT coalesce(sum(failures), 0) AS failures, coalesce(sum(drains), 0) AS drains "
            "FROM worker_jobs"
        )
    finally:
        await conn.close()
    states = dict.fromkeys(("queued", "running", "stalled", "retrying", "dead", "done"), 0)
    for job in listed:
        states[job["status"]] += 1
    lines = [
        "# HELP worker_jobs Jobs, by the state `labs/workers.py status` shows.",
        "# TYPE worker_jobs gauge",
        *(f'worker_jobs{{state="{name}"}} {count}' for name, count in states.items()),
        "# HELP worker_job_failures_total Runs of a job that failed (retried, or the last).",
        "# TYPE worker_job_failures_total counter",
        f"worker_job_failures_total {runs['failures']}",
        "# HELP worker_job_drains_total Runs a drain stopped at a step boundary: not failures.",
        "# TYPE worker_job_drains_total counter",
        f"worker_job_drains_total {runs['drains']}",
        *ledger,
    ]
    return "\n".join(lines) + "\n"


def ledger_lines(url):
    """The ledger's gauges: its effects by state, and the age of the oldest open one (requested
    or unknown: its answer never recorded). Every requested row counts as open, a live run's
    request in flight too: a row past a lease and one within it look alike from here."""
    by_state, oldest_s = ledger_counts(url)
    return [
        "# HELP ledger_effects Effects in the ledger, by state.",
        "# TYPE ledger_effects gauge",
        *(f'ledger_effects{{state="{state}"}} {n}' for state, n in by_state.items()),
        "# HELP ledger_oldest_open_effect_age_seconds Seconds since the oldest open effect "
        "(requested or unknown: no answer recorded) last moved; 0 with none open.",
        "# TYPE ledger_oldest_open_effect_age_seconds gauge",
        f"ledger_oldest_open_effect_age_seconds {oldest_s:.3f}",
    ]


OUTBOX_STATES = ("pending", "published", "refused", "quarantined")  # labs/relay.py's outbox rows


def outbox_lines(url):
    """The outbox's gauges (lab 19's labs/relay.py, in the same database): its messages by state,
    a quarantined one (a row the relay cannot read, kept and skipped) among them."""
    by_state = dict.fromkeys(OUTBOX_STATES, 0) | outbox_counts(url)
    return [
        "# HELP outbox_messages The outbox's messages, by state (quarantined: unreadable, kept).",
        "# TYPE outbox_messages gauge",
        *(f'outbox_messages{{state="{state}"}} {n}' for state, n in by_state.items()),
    ]


def outbox_counts(url):
    """{state: how many} of CHECKPOINT_DB's outbox, read only; none yet: {}."""

    def read(ledger):
        rows = ledger.sql("SELECT state, COUNT(*) AS n FROM outbox GROUP BY state")
        return {row["state"]: row["n"] for row in rows.fetchall()}

    return read_only(url, read, {})


def ledger_counts(url):
    """effects.Ledger.counts() of CHECKPOINT_DB, opened to read only (a SQLite file is neither
    made nor written); no ledger yet (no file, no table): every state 0."""
    return read_only(url, lambda ledger: ledger.counts(), (dict.fromkeys(effects.STATES, 0), 0.0))


def read_only(url, read, none):
    """read(ledger) on CHECKPOINT_DB opened to read only, or none where there is nothing to read
    yet: no file (none is made), or no such table."""
    if not checkpoints.is_postgres(url) and not os.path.exists(url):
        return none
    try:
        with effects.read_ledger(url) as ledger:
            return read(ledger)
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
    except Exception as error:
        psycopg = sys.modules.get("psycopg")
        if psycopg is None or not isinstance(error, psycopg.errors.UndefinedTable):
            raise
    return none


class MetricsServer(http.server.ThreadingHTTPServer):
    """GET /metrics: metrics_text on a connection of its own per scrape; 503 while the database
    does not answer, 404 for any other path."""

    daemon_threads = True

    def __init__(self, address, url):
        self.url = url
        super().__init__(address, MetricsHandler)


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        status, kind = 200, "text/plain; version=0.0.4; charset=utf-8"
        if self.path.split("?")[0] != "/metrics":
            status, kind, text = 404, "text/plain", "GET /metrics is the only path\n"
        else:
            try:
                text = asyncio.run(metrics_text(self.server.url))
            except Exception as error:
                unreadable = isinstance(error, sqlite3.Error | UserError)  # a locked file, say
                if not lost_connection(error) and not unreadable:
                    raise
                status, kind, text = 503, "text/plain", f"{reason(error)}\n"
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # Prometheus scrapes every few seconds: no line for each
        pass


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
                say(f"lost the database ({reason(error)}); reconnecting")
                if await worker.reconnect():
                    say(f"the database is back after {time.monotonic() - lost:.1f} s")
    if worker.stopping == signal.SIGINT:
        say("interrupted; running graphs drained")
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
            say(
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
            say(
                f"draining {len(self.running)} running job(s) at their next step; each goes "
                "back to the queue (Ctrl-C again: stop now)"
            )

    async def serve(self):
        """Run jobs on a new queue connection until stopped; raises when the connection breaks."""
        from pgqueuer import PgQueuer

        conn = await connect(self.args.checkpoint_db)
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
                final = run_thread(graph, self.client, ledger, operation, job_id, control, hold)
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
                conn = await connect(self.args.checkpoint_db)
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
            left = [] if self.running else [j for j in await jobs(queries) if unfinished(j)]
            if not self.running and not left:
                self.pgq.shutdown.set()
            elsewhere = left and all(j["status"] == "running" for j in left)
            idle_since = (idle_since or time.monotonic()) if elsewhere else None
            if idle_since and not told and time.monotonic() - idle_since > NO_WORKER_NOTICE_S:
                workers = ", ".join(sorted({j["worker"] for j in left}))
                say(f"--drain: waiting for {len(left)} job(s) running on other workers ({workers})")
                told = True


def warm_up(saver, build_graph):
    """Import LangGraph and build the graph once, before the worker takes a job.

    A job's heartbeat beats in the event loop, first at half of WORKER_HEARTBEAT_S after the pick,
    and the job goes to another worker once its last beat is WORKER_HEARTBEAT_S old. The first job
    used to import LangGraph there (handle's RunControl: about 1 s on an idle machine, as
    `time python -c 'import langgraph.runtime'` shows; longer with three workers starting at
    once), which stopped the loop past the heartbeat: another worker took a job that was still
    running. In lab 10 the held job changed hands before the freeze, its hold let go, and the run
    it held finished before `pause`."""
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


def jittered(delay):
    """Between half and all of delay: workers that failed together do not retry together."""
    return delay * random.uniform(0.5, 1.0)


def state(args):
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


# --- the one place labs/workers.py calls into workflow.py's graph
# ----------------------------------


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


@contextlib.contextmanager
def job_ledger(url):
    """The effect ledger on a connection of the job's own, in CHECKPOINT_DB beside the
    checkpoints; closed when the job ends.

    Not one connection for the worker: its jobs run in threads at once, and psycopg 3 shares a
    connection's transaction between every thread using it ("Concurrent operations" in its
    docs: "if a thread starts a transaction, every cursor on the same connection will execute
    their queries in the same transaction"), so one job's statements would land inside another
    job's claim. Nor the checkpoints' pool: a job holding one of its
    connections for a whole run would leave its graph's saver short. And a claim is a session's
    advisory lock (effects.PostgresLedger.performing), which the same session would take again
    for a second job: two jobs of one worker on one key would both own it. A connection per job
    costs one connect per run, and a database that went away breaks no connection of the next
    job."""
    import psycopg
    from psycopg.rows import dict_row

    settings = {"autocommit": True, "row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S}
    with psycopg.connect(url, **settings) as conn:
        yield effects.PostgresLedger(conn)


def run_thread(graph, client, ledger, operation, job_id, control, lab_hold=None):
    """One job's run: start the thread from the job's input, or resume it from its checkpoint,
    its effects through ledger. The final values, or None when control drained the run at a
    step boundary."""
    from langgraph.errors import GraphDrained

    config = {"configurable": {"thread_id": operation["thread"]}}
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


# helpers


async def connect(url, deadline=None):
    """The queue's own connection, with one line for a bad URL or a database that does not answer.
    Until deadline (time.monotonic()), a database that refuses or is starting is tried again.

    asyncpg, the driver of pgqueuer's own examples, rather than psycopg (which LangGraph's
    PostgresSaver uses for the checkpoints): pgqueuer's psycopg driver shares one connection between
    LISTEN and the queries and waits for notifications 1 s at a time
    (pgqueuer/adapters/drivers/psycopg.py, watch_notifies), and psycopg's AsyncConnection.notifies()
    holds the connection's lock while it waits (psycopg/connection_async.py; psycopg PR #760), so
    each query of a running worker could wait up to a second behind it."""
    import asyncpg

    delay = RECONNECT_FIRST_S
    while True:
        try:
            return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
        except ValueError as error:  # a malformed URL, or a parameter asyncpg does not know
            raise UserError(f"CHECKPOINT_DB is not a usable URL ({error})", EXIT_USAGE) from error
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            transient = not isinstance(error, asyncpg.PostgresError) or lost_connection(error)
            if transient and deadline and time.monotonic() + delay < deadline:
                await asyncio.sleep(jittered(delay))
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            if isinstance(error, TimeoutError):  # e.g. a host name Docker's resolver cannot answer
                why = f"no answer within {CONNECT_TIMEOUT_S} s"
            else:
                why = reason(error)
            raise UserError(f"cannot open CHECKPOINT_DB ({why})", EXIT_NO_ANSWER) from error


async def open_queue(url, deadline=None):
    """pgqueuer's Queries on a new connection, its tables and labs/workers.py's installed once,
    under
    pgqueuer's schema lock: Queries.install() is not idempotent, so it runs only on a database
    that has none of pgqueuer's objects yet (see the module's docstring)."""
    from pgqueuer import Queries

    queries = Queries.from_asyncpg_connection(await connect(url, deadline))
    async with queries.schema_lock():
        if not await queries.schema_is_installed():
            await queries.install()
        for table in WORKER_TABLES:
            await queries.driver.execute(table)
    return queries


def lost_connection(error):
    """True when error (or what caused it) is a database connection that broke or never came."""
    import asyncpg
    import psycopg
    import psycopg_pool

    lost = (
        OSError,
        TimeoutError,
        asyncpg.InterfaceError,  # "connection is closed"
        asyncpg.PostgresConnectionError,  # class 08
        asyncpg.exceptions.OperatorInterventionError,  # class 57: shutting down, starting up
        psycopg.OperationalError,
        psycopg_pool.PoolTimeout,
    )
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, BaseExceptionGroup):
            return any(lost_connection(e) for e in error.exceptions)
        if isinstance(error, lost):
            return True
        error = error.__cause__ or error.__context__
    return False


def reason(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def say(message):
    print(f"labs.workers: {message}", file=sys.stderr, flush=True)


def parse_args(argv, graph_module):
    parser = commandline.Parser(prog="labs.workers", description=__doc__.split("\n")[0])
    actions = parser.add_subparsers(dest="action", required=True, parser_class=commandline.Parser)
    sub = actions.add_parser("submit", help="queue one operation for the workers")
    sub.set_defaults(run=submit)
    sub.add_argument("--thread", required=True, help="checkpoint thread id (one job at a time)")
    sub.add_argument("--operation", required=True, help="operation id, used as the key")
    sub.add_argument("--title", default="Check supplier configuration", help="ticket title")
    lab_submit_arguments(sub, graph_module)  # lab-only
    sub = actions.add_parser("run", help="run queued operations until SIGTERM or Ctrl-C")
    sub.set_defaults(run=work)
    sub.add_argument("--drain", action="store_true", help="exit once no job is queued or running")
    sub = actions.add_parser("status", help="list the jobs and what is happening to each")
    sub.set_defaults(run=status)
    sub = actions.add_parser("wait", help="wait until no job is queued or running")
    sub.set_defaults(run=wait)
    sub.add_argument("--thread", default=None, help="only this thread's jobs")
    sub.add_argument("--timeout", type=float, default=120.0, help="seconds (default: 120)")
    lab_wait_arguments(sub)  # lab-only
    sub = actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=state)
    sub.add_argument("--thread", required=True)
    sub = actions.add_parser("reconcile", help="settle the ledger's open effects")
    sub.set_defaults(run=reconcile)
    sub.add_argument("--confirmed", nargs="+", default=[], metavar="KEY", help="it happened")
    sub.add_argument("--not-sent", nargs="+", default=[], metavar="KEY", help="it did not")
    sub.add_argument(
        "--wait", action="store_true", help="wait out the providers' settle time, then settle"
    )
    sub = actions.add_parser("metrics", help="the queue's figures for Prometheus")
    sub.set_defaults(run=metrics)
    sub.add_argument("--port", type=int, help="serve GET /metrics on this port (0: any free one)")
    sub.add_argument("--host", default="127.0.0.1", help="with --port (default: 127.0.0.1)")
    return parser.parse_args(argv)


def main(argv=None):
    checkpoints.own_tables({**inbox.COLUMNS, **relay.COLUMNS})  # the lab's, beside the checkpoints
    try:
        graph_module, build_graph = load_graph(os.environ.get("WORKER_GRAPH", GRAPH))
    except UserError as error:
        print(f"labs.workers: {error}", file=sys.stderr)
        return error.exit_code
    args = parse_args(argv, graph_module)
    args.graph_module, args.build_graph = graph_module, build_graph
    # pgqueuer logs each failed job and flush with its traceback; the worker says what happened
    # in its own lines (job_retry, job_dead, "lost the database"), so those loggers stay quiet;
    # psycopg's pool logs each failed reconnect the same way.
    for name in ("pgqueuer", "psycopg.pool"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        commandline.require_text(args)  # a --title that is not UTF-8: one line, exit 2
        settings = workflow.Settings.from_environ(os.environ)  # API_URL, CHECKPOINT_DB, ...
        vars(args).update(dataclasses.asdict(settings), settings=settings)
        try:  # the core's points (FAILPOINTS="after-ack=sleep(1)": every job of this worker)
            failpoints.configure(settings.failpoints, known=workflow.POINTS, announce=announce)
        except failpoints.FailpointSpecError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        try:
            tracing.start(settings.trace, "worker")
        except tracing.TracingError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        commandline.key_receipts(settings)  # LEDGER_RECEIPT_KEY
        args.heartbeat_s = providers.number(os.environ, "WORKER_HEARTBEAT_S", 10.0, float)
        args.job_attempts = providers.number(os.environ, "WORKER_JOB_ATTEMPTS", JOB_ATTEMPTS, int)
        args.retry_s = providers.number(os.environ, "WORKER_RETRY_S", RETRY_S, float)
        args.retry_max_s = providers.number(os.environ, "WORKER_RETRY_MAX_S", RETRY_MAX_S, float)
        args.db_wait_s = providers.number(os.environ, "WORKER_DB_WAIT_S", DB_WAIT_S, float)
        if args.action != "metrics":  # metrics reads a SQLite ledger too
            require_postgres(args.checkpoint_db)
        if asyncio.iscoroutinefunction(args.run):
            return asyncio.run(args.run(args)) or 0
        args.run(args)
    except KeyboardInterrupt:
        print("labs.workers: interrupted", file=sys.stderr)
        return exitcodes.EXIT_INTERRUPTED
    except UserError as error:
        print(f"labs.workers: {error}", file=sys.stderr)
        return error.exit_code
    except effects.LedgerError as error:  # reconcile on a damaged row: one line, as workflow.py's
        print(f"labs.workers: {error}", file=sys.stderr)
        return commandline.ledger_exit(error)
    return 0


# ---------------------------------------------------------------------------------------------
# lab-only: begin
# Lab 10's switch: `submit --lab-hold before-request|after-ack` turns that failpoint of the core's
# create_ticket on as `hold`, for the run that starts the thread only (failpoints.scoped, in the
# thread that runs the job). The worker notes the hold in a lab_holds table and waits there until
# its job is no longer its own (another worker took it over, or finished it), then releases it.
# While it waits, its heartbeat goes on and the queue leaves the job alone; freeze the worker
# (SIGSTOP, `docker compose pause`) and the heartbeat stops too. `wait --for hold` returns once a
# worker holds the thread.
HOLD_POINTS = ("before-request", "after-ack")
LAB_HOLDS = """CREATE TABLE IF NOT EXISTS lab_holds (
    thread text PRIMARY KEY, at text NOT NULL, backend_pid int NOT NULL,
    state text NOT NULL DEFAULT 'holding', outcome jsonb)"""


def lab_submit_arguments(sub, graph_module):
    """--mode: the variants of a graph module that has them (lab.MODES); ledger, the core's,
    unless a lesson asks for another."""
    if modes := getattr(graph_module, "MODES", ()):
        sub.add_argument(
            "--mode", choices=modes, default="ledger" if "ledger" in modes else modes[0]
        )
    sub.add_argument("--lab-hold", choices=HOLD_POINTS, help="lab 10: where the first run waits")


def lab_wait_arguments(sub):
    sub.add_argument("--for", dest="wait_for", choices=("idle", "hold"), default="idle")


def lab_operation_fields(args):
    fields = {"lab_hold": args.lab_hold} if args.lab_hold else {}
    if getattr(args, "mode", None):
        fields["mode"] = args.mode
    return fields


async def lab_forget_hold(queries, args):
    """A new held job: a row left by an earlier run of the thread (a lab run twice without
    `down -v`) must not make `wait --for hold` return at once."""
    if args.lab_hold:
        await queries.driver.execute(LAB_HOLDS)
        await queries.driver.execute("DELETE FROM lab_holds WHERE thread = $1", args.thread)


async def lab_holds(queries, thread):
    await queries.driver.execute(LAB_HOLDS)
    return await queries.driver.fetch(
        "SELECT h.thread, h.at, h.state, h.outcome, a.pid IS NOT NULL AS alive FROM lab_holds h "
        "LEFT JOIN pg_stat_activity a ON a.pid = h.backend_pid "
        "WHERE $1::text IS NULL OR h.thread = $1",
        thread,
    )


async def lab_wait_for_hold(queries, args):
    deadline = time.monotonic() + args.timeout
    while not (rows := await lab_holds(queries, args.thread)):
        if time.monotonic() > deadline:
            raise UserError(f"no worker held the thread within {args.timeout:g} s", EXIT_NO_ANSWER)
        await asyncio.sleep(POLL_S)
    emit("held", at=rows[0]["at"], thread=rows[0]["thread"])


async def lab_holding(queries, thread):
    """A live worker has not finished its held run. A killed worker's row stays in the table,
    but its database session is gone (pg_stat_activity), so it does not count."""
    return any(r["alive"] and r["state"] != "finished" for r in await lab_holds(queries, thread))


async def lab_report_held_runs(queries, thread):
    """What each finished held run got from the receiver (the worker's own output is in its log)."""
    for row in await lab_holds(queries, thread) if thread else []:
        if row["state"] == "finished":
            outcome = json.loads(row["outcome"])  # asyncpg hands jsonb over as its text
            emit("held_run", at=row["at"], thread=row["thread"], **outcome)


_lab_hold = contextvars.ContextVar("lab_hold", default=None)  # the job's LabHold, in its thread


@contextlib.contextmanager
def lab_hold_scope(hold):
    token = _lab_hold.set(hold)
    try:
        yield
    finally:
        _lab_hold.reset(token)


def announce(name, action):
    """failpoints' announce, in the thread that reached the point: the core's line, and lab 10's
    hold, which waits here until its job has moved on and then lets the failpoint go."""
    exitcodes.announce(name, action)
    hold = _lab_hold.get()
    if action == "hold" and hold is not None and name == hold.at:
        hold.wait()
        failpoints.release(name)


class LabHold:
    """One held job's hold: where, its lab_holds row, and what the receiver answered."""

    def __init__(self, operation, job_id, args):
        self.thread, self.at = operation["thread"], operation["lab_hold"]
        self.job = (job_id, args.queue_manager_id)
        self.queue_table, self.url = args.queue_table, args.checkpoint_db
        self.conn = self.recorder = None

    def client(self, client):
        self.recorder = RecordingClient(client)
        return self.recorder

    def wait(self):
        import psycopg

        self.conn = psycopg.connect(self.url, autocommit=True)
        self.conn.execute(LAB_HOLDS)
        self.conn.execute(
            "INSERT INTO lab_holds (thread, at, backend_pid) VALUES (%s, %s, pg_backend_pid()) "
            "ON CONFLICT (thread) DO UPDATE SET at = excluded.at, "
            "backend_pid = excluded.backend_pid, state = 'holding', outcome = NULL",
            (self.thread, self.at),
        )
        emit("lab_hold", at=self.at, thread=self.thread)
        mine = f"SELECT 1 FROM {self.queue_table} WHERE id = %s AND queue_manager_id = %s"
        while self.conn.execute(mine, self.job).fetchone():
            time.sleep(POLL_S)
        emit("lab_woken", thread=self.thread)

    def finished(self, final):
        if self.conn is None:
            return
        if final is not None:  # sent: what the receiver answered; not sent: the ledger's receipt
            answer = self.recorder.result
            outcome = {"sent": answer is not None, "ticket_id": final["ticket_id"]}
            outcome.update({"created": answer["created"]} if answer else {})
            self.conn.execute(
                "UPDATE lab_holds SET state = 'finished', outcome = %s WHERE thread = %s",
                (json.dumps(outcome), self.thread),
            )
        self.conn.close()


class RecordingClient:
    """The receiver client, keeping its last answer to create() for lab_holds' outcome."""

    def __init__(self, client):
        self.client, self.result = client, None

    def create(self, title, key=None):
        self.result = self.client.create(title, key)
        return self.result

    def tickets(self, key=None):
        return self.client.tickets(key)


# lab-only: end


if __name__ == "__main__":
    sys.exit(main())
