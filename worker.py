"""Workers that run workflow.py's graph from a job queue in Postgres: the lab on several machines.

    python worker.py submit --thread T --operation K [--mode safe] [--title ...]
    python worker.py run [--drain]        a worker; --drain: exit once no job is queued or running
    python worker.py status               the queue's jobs
    python worker.py wait [--thread T]    until no job (of thread T) is queued or running
    python worker.py state --thread T     the thread's checkpoint, as `workflow.py state`

Each job is one operation on one checkpoint thread. A worker takes a job and runs the thread:
from the job's input when the thread has no checkpoint, else from its checkpoint (invoke(None)).
The checkpoints and the queue live in the same Postgres database (CHECKPOINT_DB), so any worker
on any machine can resume any thread.

The queue is pgqueuer, not procrastinate; both keep jobs in Postgres and both were tried (see
the README's "Past one machine"). pgqueuer because:
  - a worker that dies is handled by the queue itself: every job has its own heartbeat, and every
    dequeue also takes `picked` jobs whose heartbeat is older than heartbeat_timeout. procrastinate
    3.10 leaves a dead worker's job `doing` until a periodic reaper you run yourself retries it.
  - one job per thread: enqueue's dedupe_key is unique over queued and picked jobs, so a second
    job for a thread that has one is refused at submit. procrastinate's lock= instead queues both
    and runs them one after the other.
  - its schema install is idempotent under a lock (procrastinate's `schema --apply` is not).
  The price: handlers are async, so the sync graph.invoke runs in asyncio.to_thread. Run in the
  event loop, it would block the loop, stop the job's heartbeat, and another worker would take a
  job that is still running.

Neither queue can stop a worker that froze (a long GC pause, SIGSTOP, a paused VM) for longer than
its heartbeat and then wakes up: by then its job is another worker's, and the woken worker still
finishes its run. Two runs of one thread: only the receiver's idempotency key keeps the second
effect harmless (lab 10).

Output is one JSON object per line (workflow.py's emit). Exit codes: workflow.py's, and 4 when a
thread already has a job queued or running; `run` exits 0 on SIGTERM once its running jobs are
done, 130 on Ctrl-C; a second Ctrl-C or SIGTERM stops it at once (130, 143), as a crash would, and
its running jobs go to another worker once their heartbeat is stale.

Configuration (environment, read in main()):
    API_URL, API_TIMEOUT_S, API_ATTEMPTS   as for workflow.py (compose sets API_URL)
    CHECKPOINT_DB        postgresql://... (required: checkpoints and queue; compose sets it)
    WORKER_HEARTBEAT_S   10: a job whose worker has not beaten for this long goes to another one
    WORKER_LAB_ACK_DELAY_S  0: lab-only, seconds to wait after each receiver answer (scale chaos)
"""

import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import lab
import workflow
from workflow import EXIT_NO_ANSWER, EXIT_THREAD, EXIT_USAGE, UserError, emit

ENTRYPOINT = "operation"  # the one kind of job: run one operation's thread
JOBS_PER_WORKER = 2  # pgqueuer's minimum cap for a batch of 1 (max_concurrent_tasks >= 2 x batch)
POLL_S = 0.1  # seconds between looks at the queue in `wait` and --drain
ACTIVE = ("queued", "picked")  # a job some worker will still run; a failed one stays, held
CONNECT_TIMEOUT_S = 10  # seconds for the queue's connection: a database that does not answer


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


async def connect(url):
    """The queue's own connection, with one line for a bad URL or a database that does not answer.

    asyncpg, the driver of pgqueuer's own examples, rather than psycopg (which LangGraph's
    PostgresSaver uses for the checkpoints): pgqueuer's psycopg driver shares one connection between
    LISTEN and the queries and waits for notifications 1 s at a time
    (pgqueuer/adapters/drivers/psycopg.py, watch_notifies), and psycopg's AsyncConnection.notifies()
    holds the connection's lock while it waits (psycopg/connection_async.py; psycopg issue #340), so
    each query of a running worker could wait up to a second. Measured in lab 10: taking over a dead
    worker's job and draining took 9 s with psycopg, 3 s with asyncpg."""
    import asyncpg

    try:
        return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
    except ValueError as error:  # a malformed URL, or a parameter asyncpg does not know
        raise UserError(f"CHECKPOINT_DB is not a usable URL ({error})", EXIT_USAGE) from error
    except TimeoutError as error:  # e.g. a host name Docker's resolver cannot answer for
        reason = f"no answer within {CONNECT_TIMEOUT_S} s"
        raise UserError(f"cannot open CHECKPOINT_DB ({reason})", EXIT_NO_ANSWER) from error
    except (OSError, asyncpg.PostgresError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"cannot open CHECKPOINT_DB ({reason})", EXIT_NO_ANSWER) from error


async def open_queue(url):
    """pgqueuer's Queries on a new connection, its tables installed once (under its own lock)."""
    from pgqueuer import Queries

    queries = Queries.from_asyncpg_connection(await connect(url))
    async with queries.schema_lock():
        if not await queries.schema_is_installed():
            await queries.install()
    return queries


async def jobs(queries, thread=None):
    """The queue's jobs, oldest first: queued, picked, and failed ones, which stay (held) for you to
    see; a job that succeeded leaves the table."""
    table = queries.qbe.qualified.queue_table
    rows = await queries.driver.fetch(
        f"SELECT id, status, dedupe_key FROM {table} "  # noqa: S608 (pgqueuer's own table name)
        "WHERE entrypoint = $1 AND ($2::text IS NULL OR dedupe_key = $2) ORDER BY id",
        ENTRYPOINT,
        thread,
    )
    return [{"job": r["id"], "status": r["status"], "thread": r["dedupe_key"]} for r in rows]


async def enqueue(queries, operation):
    """Queue one operation; the job's id. dedupe_key: one queued-or-running job per thread,
    enforced by a unique index, so a second one raises UserError (exit 4)."""
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
    return job


async def submit(args):
    queries = await open_queue(args.checkpoint_db)
    operation = {"thread": args.thread, "operation_id": args.operation, "title": args.title}
    operation.update(lab_operation_fields(args))  # lab-only: --mode, --lab-hold
    job = await enqueue(queries, operation)
    await lab_forget_hold(queries, args)  # lab-only
    emit("submitted", job=job, thread=args.thread)


async def status(args):
    queries = await open_queue(args.checkpoint_db)
    emit("jobs", jobs=await jobs(queries))


async def wait(args):
    """Until no job (of --thread) is queued or running, and no worker is still running it."""
    queries = await open_queue(args.checkpoint_db)
    if args.wait_for == "hold":  # lab-only
        return await lab_wait_for_hold(queries, args)  # lab-only
    deadline = time.monotonic() + args.timeout
    while True:
        busy = any(j["status"] in ACTIVE for j in await jobs(queries, args.thread))
        busy = busy or await lab_holding(queries, args.thread)  # lab-only
        if not busy:
            break
        if time.monotonic() > deadline:
            raise UserError(f"still running after {args.timeout:g} s", EXIT_NO_ANSWER)
        await asyncio.sleep(POLL_S)
    emit("idle", **({"thread": args.thread} if args.thread else {}))
    await lab_report_held_runs(queries, args.thread)  # lab-only


def run_operation(saver, client, operation, job_id, args):
    """One job, in a worker thread: start the thread from the job's input, or resume it."""
    config = {"configurable": {"thread_id": operation["thread"]}}
    resume = bool(lab.build_graph(saver).get_state(config).values)
    emit("job", job=job_id, resume=resume, thread=operation["thread"])
    client = lab_client(client, operation, job_id, resume, args)  # lab-only
    graph = lab.build_graph(saver)
    first_input = None
    if not resume:
        first_input = {"operation_id": operation["operation_id"], "title": operation["title"]}
        first_input["mode"] = operation["mode"]  # lab-only
    # sync: each node's result is saved before the next node starts, so a resume repeats at
    # most the node that was running.
    context = workflow.Context(client)
    final = graph.invoke(first_input, config, durability="sync", context=context)
    emit("done", **final)
    lab_hold_finished(client)  # lab-only


async def work(args):
    from pgqueuer import PgQueuer

    queries = await open_queue(args.checkpoint_db)  # installs the queue before the first dequeue
    pgq = PgQueuer.from_asyncpg_connection(await connect(args.checkpoint_db))
    client = workflow.TicketClient(args.api_url, args.timeout_s, args.attempts)
    running = set()
    loop = asyncio.get_running_loop()
    stop_signal = []

    def stop(signum):
        if stop_signal:  # the second Ctrl-C or SIGTERM: stop now, as a crash would
            print(
                f"worker.py: stopped with {len(running)} job(s) running; each goes to another "
                f"worker once its heartbeat is {args.heartbeat_s:g} s old",
                file=sys.stderr,
                flush=True,
            )
            os._exit(130 if signum == signal.SIGINT else 143)
        stop_signal.append(signum)
        pgq.shutdown.set()  # no new jobs; run() returns once the running ones are done
        if running:
            print(
                "worker.py: stopping once the running jobs finish (Ctrl-C again: stop now)",
                file=sys.stderr,
                flush=True,
            )

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    sys.stdout = LineStdout(sys.stdout)

    with workflow.open_checkpointer(args.checkpoint_db) as saver:
        args.queue_manager_id = pgq.qm.queue_manager_id  # lab-only
        args.queue_table = queries.qbe.qualified.queue_table  # lab-only

        @pgq.entrypoint(ENTRYPOINT, on_failure="hold")  # hold: a failed job stays, visible
        async def handle(job):
            operation = json.loads(job.payload)
            running.add(job.id)
            try:
                # A thread, not the event loop: the loop must keep the job's heartbeat going.
                await asyncio.to_thread(run_operation, saver, client, operation, job.id, args)
            except Exception as error:
                emit("job_failed", error=str(error), job=job.id, thread=operation["thread"])
                raise
            finally:
                running.discard(job.id)

        async def drain_when_idle():
            while not pgq.shutdown.is_set():
                await asyncio.sleep(POLL_S)
                if not running and not any(j["status"] in ACTIVE for j in await jobs(queries)):
                    pgq.shutdown.set()

        emit("worker", heartbeat_s=args.heartbeat_s, drain=args.drain)
        drainer = asyncio.create_task(drain_when_idle()) if args.drain else None
        await pgq.run(
            dequeue_timeout=timedelta(seconds=1),  # how often an idle worker looks for stale jobs
            batch_size=1,
            max_concurrent_tasks=JOBS_PER_WORKER,
            heartbeat_timeout=timedelta(seconds=args.heartbeat_s),
        )
        if drainer:
            drainer.cancel()
    if signal.SIGINT in stop_signal:
        print("worker.py: interrupted; running jobs finished", file=sys.stderr)
        return 130
    return 0


def state(args):
    lab.state(args, workflow.Settings(checkpoint_db=args.checkpoint_db))


def parse_args(argv):
    parser = workflow.Parser(prog="worker.py", description=__doc__.split("\n")[0])
    actions = parser.add_subparsers(dest="action", required=True, parser_class=workflow.Parser)
    sub = actions.add_parser("submit", help="queue one operation for the workers")
    sub.set_defaults(run=submit)
    sub.add_argument("--thread", required=True, help="checkpoint thread id (one job at a time)")
    sub.add_argument("--operation", required=True, help="operation id, used as the key")
    sub.add_argument("--title", default="Check supplier configuration", help="ticket title")
    lab_submit_arguments(sub)  # lab-only
    sub = actions.add_parser("run", help="run queued operations until SIGTERM or Ctrl-C")
    sub.set_defaults(run=work)
    sub.add_argument("--drain", action="store_true", help="exit once no job is queued or running")
    sub = actions.add_parser("status", help="list the queued and running jobs")
    sub.set_defaults(run=status)
    sub = actions.add_parser("wait", help="wait until no job is queued or running")
    sub.set_defaults(run=wait)
    sub.add_argument("--thread", default=None, help="only this thread's jobs")
    sub.add_argument("--timeout", type=float, default=120.0, help="seconds (default: 120)")
    lab_wait_arguments(sub)  # lab-only
    sub = actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=state)
    sub.add_argument("--thread", required=True)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        settings = workflow.Settings.from_environ(os.environ)  # API_URL, CHECKPOINT_DB, ...
        vars(args).update(dataclasses.asdict(settings))
        args.heartbeat_s = workflow.number(os.environ, "WORKER_HEARTBEAT_S", 10.0, float)
        args.lab_ack_delay_s = float(os.environ.get("WORKER_LAB_ACK_DELAY_S", "0"))  # lab-only
        require_postgres(args.checkpoint_db)
        if asyncio.iscoroutinefunction(args.run):
            return asyncio.run(args.run(args)) or 0
        args.run(args)
    except KeyboardInterrupt:
        print("worker.py: interrupted", file=sys.stderr)
        return 130
    except UserError as error:
        print(f"worker.py: {error}", file=sys.stderr)
        return error.exit_code
    return 0


# ---------------------------------------------------------------------------------------------
# lab-only: begin
# Lab 10's switch: `submit --lab-hold before-request|after-ack` makes the worker that starts the
# thread stop at that point of create_ticket, note it in a lab_holds table, and wait there until
# its job is no longer its own (another worker took it over, or finished it). While it waits, its
# heartbeat goes on and the queue leaves the job alone; freeze the worker (SIGSTOP, `docker compose
# pause`) and the heartbeat stops too. `wait --for hold` returns once a worker holds the thread.
HOLD_POINTS = ("before-request", "after-ack")
LAB_HOLDS = """CREATE TABLE IF NOT EXISTS lab_holds (
    thread text PRIMARY KEY, at text NOT NULL, backend_pid int NOT NULL,
    state text NOT NULL DEFAULT 'holding', outcome jsonb)"""


def lab_submit_arguments(sub):
    sub.add_argument("--mode", choices=lab.MODES, default="safe")
    sub.add_argument("--lab-hold", choices=HOLD_POINTS, help="lab 10: where the first run waits")


def lab_wait_arguments(sub):
    sub.add_argument("--for", dest="wait_for", choices=("idle", "hold"), default="idle")


def lab_operation_fields(args):
    return {"mode": args.mode, **({"lab_hold": args.lab_hold} if args.lab_hold else {})}


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


class HoldingClient:
    """The receiver client, stopping once at the operation's hold point."""

    def __init__(self, client, operation, job_id, args):
        import psycopg

        self.client, self.thread, self.at = client, operation["thread"], operation["lab_hold"]
        self.job = (job_id, args.queue_manager_id)
        self.queue_table = args.queue_table
        self.conn = psycopg.connect(args.checkpoint_db, autocommit=True)
        self.conn.execute(LAB_HOLDS)

    def hold(self):
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

    def create(self, title, key=None):
        if self.at == "before-request":
            self.hold()
        self.result = self.client.create(title, key)
        if self.at == "after-ack":
            self.hold()
        return self.result

    def tickets(self, key=None):
        return self.client.tickets(key)

    def finished(self):
        outcome = {k: self.result[k] for k in ("created", "ticket_id")}
        self.conn.execute(
            "UPDATE lab_holds SET state = 'finished', outcome = %s WHERE thread = %s",
            (json.dumps(outcome), self.thread),
        )
        self.conn.close()


class SlowAckClient:
    """WORKER_LAB_ACK_DELAY_S (scale chaos): sleep after every answer, inside the crash window, so
    that a worker killed or frozen at a random moment is most likely caught in it."""

    def __init__(self, client, delay_s):
        self.client, self.delay_s = client, delay_s

    def create(self, title, key=None):
        result = self.client.create(title, key)
        time.sleep(self.delay_s)
        return result

    def tickets(self, key=None):
        return self.client.tickets(key)


def lab_client(client, operation, job_id, resume, args):
    """The lab's switches around the receiver client. Only the run that starts the thread holds;
    a resumed one runs straight through."""
    if args.lab_ack_delay_s:
        client = SlowAckClient(client, args.lab_ack_delay_s)
    if resume or not operation.get("lab_hold"):
        return client
    return HoldingClient(client, operation, job_id, args)


def lab_hold_finished(client):
    if isinstance(client, HoldingClient):
        client.finished()


# lab-only: end


if __name__ == "__main__":
    sys.exit(main())
