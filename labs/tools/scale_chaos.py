"""Several workers, one queue, and chaos: SIGKILL and freeze workers until every operation is done.

    python -m labs.tools.scale_chaos [--workers 3] [--operations 60] [--mode safe|naive] [--seed N]

Everything runs natively and throwaway: a Postgres cluster (labs.tools.pg), a receiver on a free
port, and `python worker.py run` processes (labs.tools.workers). It submits OPERATIONS operations,
one thread each. Once every worker holds a job in its crash window, it SIGKILLs them all; then,
until the queue is empty, it SIGKILLs a random worker (and starts it again) or freezes one with
SIGSTOP for longer than the heartbeat timeout (and wakes it with SIGCONT).
Workers pause WORKER_LAB_ACK_DELAY_S after each receiver answer, inside the crash window, so the
chaos usually catches them there.

The last line on stdout is one JSON object:
    operations        submitted
    tickets           tickets the receiver holds
    duplicates        tickets beyond the first for an operation (0 in safe mode)
    workers_killed    SIGKILLs sent
    workers_frozen    SIGSTOP/SIGCONT pairs
    unfinished        operations whose thread has no ticket in its final checkpoint
Progress goes to stderr. Exit 0 when there are no duplicates and nothing is unfinished, else 1.
"""

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from labs.tools.local import ROOT, ReceiverProcess, free_port, lab_env, wait_until

sys.path.insert(0, str(ROOT))
import lab  # noqa: E402
import worker  # noqa: E402
import workflow  # noqa: E402
from labs.tools.workers import LocalWorkers, stopped  # noqa: E402

HEARTBEAT_S = "1"  # short, so a frozen or dead worker's job moves on quickly
ACK_DELAY_S = "0.2"  # the crash window each run sits in (WORKER_LAB_ACK_DELAY_S)
DEADLINE_S = 170.0  # the whole run, queue drained included


def say(message):
    print(f"scale-chaos: {message}", file=sys.stderr, flush=True)


async def submit_all(queries, operations, mode):
    for n in range(operations):
        name = f"chaos-{n:03d}"
        # The title names the operation too: naive tickets carry no key to count them by.
        operation = {"thread": name, "operation_id": name, "mode": mode, "title": name}
        await worker.enqueue(queries, operation)


async def pending(queries):
    return [j for j in await worker.jobs(queries) if j["status"] in ("queued", "picked")]


async def busy_workers(queries):
    """How many workers hold a picked job (pgqueuer records the picking queue manager)."""
    table = queries.qbe.qualified.queue_table
    (row,) = await queries.driver.fetch(
        f"SELECT count(DISTINCT queue_manager_id) AS n FROM {table} WHERE status = 'picked'"  # noqa: S608
    )
    return row["n"]


def finished_threads(url, operations):
    """How many threads have a ticket in their latest checkpoint."""
    done = 0
    with workflow.open_checkpointer(url) as saver:
        graph = lab.build_graph(saver)
        for n in range(operations):
            config = {"configurable": {"thread_id": f"chaos-{n:03d}"}}
            snapshot = graph.get_state(config)
            done += "ticket_id" in snapshot.values and not snapshot.next
    return done


def tickets(api_url):
    with urllib.request.urlopen(api_url + "/tickets", timeout=10) as response:
        return json.load(response)["tickets"]


def chaos_run(workers_n, operations, mode, seed, work_dir, ack_delay_s=ACK_DELAY_S):
    rng = random.Random(seed)
    env = lab_env(work_dir / "data", free_port())
    receiver = ReceiverProcess(env, log_path=work_dir / "receiver.log").start()
    workers = LocalWorkers(env, work_dir, heartbeat_s=HEARTBEAT_S)
    workers.base_env = dict(env, WORKER_LAB_ACK_DELAY_S=str(ack_delay_s))
    killed = frozen = 0
    loop = asyncio.new_event_loop()
    try:
        url = workers.env["CHECKPOINT_DB"]
        queries = loop.run_until_complete(worker.open_queue(url))
        loop.run_until_complete(submit_all(queries, operations, mode))
        say(f"{operations} {mode} operations queued; starting {workers_n} workers")
        workers.scale(workers_n)

        # The first strike waits until every worker holds a job and every held job has had its
        # answer from the receiver (it sits in the crash window): a run that ended before any
        # strike, or a strike on a worker still starting up, would prove nothing.
        def all_in_the_window():
            jobs = loop.run_until_complete(pending(queries))
            picked = {j["thread"] for j in jobs if j["status"] == "picked"}
            busy = loop.run_until_complete(busy_workers(queries))
            answered = {t["payload"]["title"] for t in tickets(env["API_URL"])}  # title = thread
            return not jobs or (busy >= workers_n and picked <= answered)

        wait_until(all_in_the_window, 60, "every worker to hold a job in the crash window")
        for proc in workers.live():  # the first strike: every worker at once, then random ones
            proc.kill()
            proc.wait()
            killed += 1
        say(f"SIGKILL all {workers_n} workers")
        workers.scale(workers_n)
        deadline = time.monotonic() + DEADLINE_S
        heartbeat = float(HEARTBEAT_S)
        while loop.run_until_complete(pending(queries)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the queue did not drain within {DEADLINE_S:g} s")
            victim = rng.randrange(workers_n)
            proc = workers.procs[victim]
            if proc.poll() is not None:
                continue
            if rng.random() < 0.5:
                proc.kill()
                proc.wait()
                killed += 1
                say(f"SIGKILL worker {victim + 1}")
                workers.scale(workers_n)  # a new process in its place, like a restart policy
            else:
                proc.send_signal(signal.SIGSTOP)
                wait_until(lambda p=proc: stopped(p), 5, "the worker to stop")
                frozen += 1
                hold = heartbeat + rng.uniform(0.2, 1.0)  # past the heartbeat: its job moves on
                say(f"SIGSTOP worker {victim + 1} for {hold:.1f} s")
                time.sleep(hold)
                proc.send_signal(signal.SIGCONT)
            time.sleep(rng.uniform(0.5, 2.0))  # a random moment, not a synchronisation
        # A woken worker may still be in a run that another worker completed already: SIGTERM
        # lets every worker finish what it started before it exits.
        say("queue drained; stopping the workers")
        workers.stop_all()
        done = finished_threads(url, operations)
        held = tickets(env["API_URL"])
    finally:
        workers.close()
        receiver.stop()
        loop.close()
    per_operation = Counter(t["payload"]["title"] for t in held)
    return {
        "operations": operations,
        "tickets": len(held),
        "duplicates": sum(count - 1 for count in per_operation.values()),
        "workers_killed": killed,
        "workers_frozen": frozen,
        "unfinished": operations - done,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--operations", type=int, default=60)
    parser.add_argument("--mode", choices=("safe", "naive"), default="safe")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's chaos")
    parser.add_argument(
        "--ack-delay", type=float, default=float(ACK_DELAY_S), help="seconds in the crash window"
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.operations < 1:
        parser.exit(2, "scale-chaos: --workers and --operations must be at least 1\n")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    say(f"seed {seed}")
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="stateful-lab-scale-") as work_dir:
            result = chaos_run(
                args.workers, args.operations, args.mode, seed, Path(work_dir), args.ack_delay
            )
    except KeyboardInterrupt:
        print("scale-chaos: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as error:
        print(f"scale-chaos: {error}", file=sys.stderr)
        return 1
    say(f"done in {time.monotonic() - started:.0f} s")
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["duplicates"] == 0 and result["unfinished"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
