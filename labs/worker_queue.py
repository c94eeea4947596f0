"""Lab 10's job queue (pgqueuer, in CHECKPOINT_DB): submit, status, wait, reconcile, and the
queue's connection. labs/workers.py's docstring says why pgqueuer and what a worker survives."""

import asyncio
import contextlib
import json
import random
import sys
import time

import commandline
import effects
import workflow
from exitcodes import EXIT_NO_ANSWER, EXIT_THREAD, EXIT_USAGE, UserError, emit
from labs.threads import COMPOSE, WORKERS
from labs.worker_holds import (
    lab_forget_hold,
    lab_holding,
    lab_operation_fields,
    lab_report_held_runs,
    lab_wait_for_hold,
)

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

# labs/workers.py's own bookkeeping beside pgqueuer's tables: who runs (a worker's session is alive
# while its queue connection is: pg_stat_activity), and what became of each job.
WORKER_TABLES = (
    """CREATE TABLE IF NOT EXISTS worker_sessions (
        queue_manager_id uuid PRIMARY KEY, name text NOT NULL, backend_pid int NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS worker_jobs (
        job bigint PRIMARY KEY, thread text NOT NULL, operation text NOT NULL,
        failures int NOT NULL DEFAULT 0, last_error text, ticket_id int, done timestamptz)""",
    # drains apart from failures: a deploy's drain is a clean stop, not a failed run. Only
    # where it is missing: ALTER TABLE locks the table (even with IF NOT EXISTS), and every
    # command that opens the queue runs this beside the workers' writes.
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema =
                       current_schema() AND table_name = 'worker_jobs' AND column_name = 'drains')
        THEN ALTER TABLE worker_jobs ADD COLUMN drains int NOT NULL DEFAULT 0;
        END IF;
    END $$""",
)


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


def settle_open_effects(args):
    """workflow.py's reconcile, on the workers' ledger: the open effects asked by key, or
    settled as a person says (--confirmed, --not-sent, --correct). It looks up the effects the
    graph's module declares, and the core's."""
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
        pending = [j for j in listed if job_unfinished(j)]
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


def job_unfinished(job):
    """A job some worker will still run: queued, running, stalled or retrying."""
    return job["status"] not in ("dead", "done")


def no_worker(pending):
    return (
        f"{len(pending)} job(s) queued and no worker is running; start one: "
        f"{WORKERS.native} run (Docker: {COMPOSE} up -d worker)"
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
    return [describe_job(row) for row in rows]


def describe_job(row):
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


async def connect_to_queue_db(url, deadline=None):
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
                why = first_line_of(error)
            raise UserError(f"cannot open CHECKPOINT_DB ({why})", EXIT_NO_ANSWER) from error


async def open_queue(url, deadline=None):
    """pgqueuer's Queries on a new connection, its tables and labs/workers.py's installed once,
    under
    pgqueuer's schema lock: Queries.install() is not idempotent, so it runs only on a database
    that has none of pgqueuer's objects yet (see the module's docstring)."""
    from pgqueuer import Queries

    queries = Queries.from_asyncpg_connection(await connect_to_queue_db(url, deadline))
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


def first_line_of(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def print_worker_line(message):
    print(f"labs.workers: {message}", file=sys.stderr, flush=True)


def jittered(delay):
    """Between half and all of delay: workers that failed together do not retry together."""
    return delay * random.uniform(0.5, 1.0)
