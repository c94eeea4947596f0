"""`python -m labs.workers metrics`: the queue's, the ledger's and the outbox's figures in
Prometheus's text format, printed once or served at GET /metrics."""

import asyncio
import http.server
import os
import signal
import sqlite3
import sys
import threading
import time

import checkpoints
import effects
from exitcodes import EXIT_USAGE, UserError, emit
from labs.worker_queue import (
    connect_to_queue_db,
    first_line_of,
    jobs,
    lost_connection,
    open_queue,
)


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

    conn = await connect_to_queue_db(url)
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
                status, kind, text = 503, "text/plain", f"{first_line_of(error)}\n"
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # Prometheus scrapes every few seconds: no line for each
        pass
