"""Lab 10's switch: `submit --lab-hold before-request|after-ack` holds the job's first run at that
failpoint of the core's create_ticket (failpoints.scoped, in the thread that runs the job), until
its job is another worker's or finished; `wait --for hold` returns once a worker holds it.

While it waits, it beats the job's heartbeat itself, from the thread that holds, every
HOLD_POLL_S: the queue leaves the job alone. pgqueuer's own beats come from the worker's event
loop every WORKER_HEARTBEAT_S / 2, and a loaded machine can delay them past WORKER_HEARTBEAT_S;
another worker would then take the held job before anyone froze its worker. Freeze the worker
(SIGSTOP, `docker compose pause`) and both beats stop. The hold is noted in a lab_holds
table, so `wait` can report what each held run got from the receiver.
"""

import asyncio
import contextlib
import contextvars
import json
import time

import exitcodes
import failpoints
from exitcodes import EXIT_NO_ANSWER, UserError, emit

HOLD_POLL_S = 0.1  # seconds between looks at lab_holds, and between the held job's beats
HOLD_POINTS = ("before-request", "after-ack")
LAB_HOLDS = """CREATE TABLE IF NOT EXISTS lab_holds (
    thread text PRIMARY KEY, at text NOT NULL, backend_pid int NOT NULL,
    state text NOT NULL DEFAULT 'holding', outcome jsonb)"""


def lab_submit_arguments(sub, graph_module):
    """--mode: the variants of a graph module that has them (labs/modes.py's MODES); ledger,
    the core's, unless a lesson asks for another."""
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
        await asyncio.sleep(HOLD_POLL_S)
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


def announce_or_hold(name, action):
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
        # Still ours: beat its heartbeat as pgqueuer does (heartbeat = NOW()). None: taken or done.
        beat = (
            f"UPDATE {self.queue_table} SET heartbeat = NOW() "
            "WHERE id = %s AND queue_manager_id = %s RETURNING id"
        )
        while self.conn.execute(beat, self.job).fetchone():
            time.sleep(HOLD_POLL_S)
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
