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
lab's by default, whose --mode picks the lessons' variants (labs/modes.py; ledger by default).

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
    WORKER_GRAPH         labs.lab_graph:build_lab_graph: the module:function that compiles the
                         graph the jobs run
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
import dataclasses
import logging
import os
import sys

import checkpoints
import commandline
import effects
import exitcodes
import failpoints
import providers
import tracing
import workflow
from exitcodes import EXIT_USAGE, UserError
from labs import inbox, relay
from labs.threads import WORKERS
from labs.worker_holds import announce_or_hold, lab_submit_arguments, lab_wait_arguments
from labs.worker_metrics import metrics
from labs.worker_queue import (
    DB_WAIT_S,
    JOB_ATTEMPTS,
    RETRY_MAX_S,
    RETRY_S,
    require_postgres,
    settle_open_effects,
    status,
    submit,
    wait,
)
from labs.worker_run import GRAPH, load_graph, show_thread_state, work


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
    sub.set_defaults(run=show_thread_state)
    sub.add_argument("--thread", required=True)
    sub = actions.add_parser("reconcile", help="settle the ledger's open effects")
    sub.set_defaults(run=settle_open_effects)
    sub.add_argument("--confirmed", nargs="+", default=[], metavar="KEY", help="it happened")
    sub.add_argument("--not-sent", nargs="+", default=[], metavar="KEY", help="it did not")
    sub.add_argument(
        "--correct", nargs="+", default=[], metavar="KEY=ID", help="a person's answer was wrong"
    )
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
    exitcodes.TYPED.set(WORKERS)  # a hint names python -m labs.workers ... and its Docker form
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
            failpoints.configure(
                settings.failpoints, known=workflow.POINTS, announce=announce_or_hold
            )
        except failpoints.FailpointSpecError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        try:
            tracing.start(settings.trace, "worker")
        except tracing.TracingError as error:
            raise UserError(str(error), EXIT_USAGE) from None
        commandline.configure_receipts(settings)  # LEDGER_RECEIPT_KEY
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


if __name__ == "__main__":
    commandline.run_script(main, "labs.workers", one_run=False)
