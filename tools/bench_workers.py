"""Operations per second with 1, 2 and 4 workers on one queue (part of make bench).

    .venv/bin/python -m tools.bench_workers [--rounds 3] [--operations 40] [--durable]

For each worker count: a throwaway Postgres (tools.pg), a receiver on a free port, and that
many `python -m labs.workers run` processes, started and ready before the clock starts. A round
queues
OPERATIONS safe operations (one thread each) and times until the queue is empty (every job done
and logged). Figures are operations per second, the median of the rounds. Each worker runs up to
labs/worker_queue.py's JOBS_PER_WORKER jobs at a time. Prints one JSON object.

The throwaway cluster runs with fsync, synchronous_commit and full_page_writes off (tools.pg):
fast, and not what a real server does. --durable measures a cluster with all three on (Postgres's
defaults), where every commit waits for its WAL flush.
"""

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.local import ROOT, ReceiverProcess, free_port, lab_env, wait_until

sys.path.insert(0, str(ROOT))
from commandline import Parser  # noqa: E402
from labs import worker_queue
from tools.native_workers import LocalWorkers  # noqa: E402

COUNTS = (1, 2, 4)
ROUNDS = 3  # per worker count; the median ignores one round disturbed by the machine
OPERATIONS = 40  # per round: 20 jobs for each of 2 workers, enough to keep every slot busy
START_DEADLINE_S = 120.0  # seconds for the workers to start; a loaded machine is slow at imports
ROUND_DEADLINE_S = 300.0


async def one_round(queries, prefix, operations):
    for n in range(operations):
        name = f"{prefix}-{n:03d}"
        await worker_queue.enqueue(queries, {"thread": name, "operation_id": name, "mode": "safe",
                                       "title": name})  # fmt: skip
    started = time.monotonic()
    while any(map(worker_queue.job_unfinished, await worker_queue.jobs(queries))):
        if time.monotonic() - started > ROUND_DEADLINE_S:
            raise TimeoutError(f"a round of {operations} operations took over {ROUND_DEADLINE_S} s")
        await asyncio.sleep(0.02)  # a poll interval: the round ends when the queue is empty
    return operations / (time.monotonic() - started)


def bench_count(count, rounds, operations, folder, durable=False):
    env = lab_env(folder / "data", free_port())
    receiver = ReceiverProcess(env, log_path=folder / "receiver.log").start()
    workers = LocalWorkers(env, folder, durable=durable)
    loop = asyncio.new_event_loop()
    try:
        queries = loop.run_until_complete(worker_queue.open_queue(workers.env["CHECKPOINT_DB"]))
        workers.scale(count)
        log = folder / "workers.log"
        wait_until(
            lambda: log.exists() and log.read_text().count('"event": "worker"') >= count,
            START_DEADLINE_S,
            f"{count} workers to start",
        )
        return [
            loop.run_until_complete(one_round(queries, f"r{r}", operations)) for r in range(rounds)
        ]
    finally:
        workers.close()
        receiver.stop()
        loop.close()


def bench_workers(rounds=ROUNDS, operations=OPERATIONS, counts=COUNTS, durable=False):
    """{"1": ops/s, "2": ..., "4": ...}: medians of the rounds, and every round."""
    figures = {"operations_per_round": operations, "rounds": rounds, "ops_per_s": {}, "all": {}}
    figures["postgres"] = "durable (fsync on)" if durable else "throwaway (fsync off)"
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="stateful-lab-bench-workers-") as folder:
            per_round = bench_count(count, rounds, operations, Path(folder), durable)
        figures["all"][str(count)] = per_round
        figures["ops_per_s"][str(count)] = statistics.median(per_round)
    return figures


def main(argv=None):
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--operations", type=int, default=OPERATIONS)
    parser.add_argument("--durable", action="store_true", help="Postgres with fsync on")
    args = parser.parse_args(argv)
    figures = bench_workers(args.rounds, args.operations, durable=args.durable)
    for count, rate in figures["ops_per_s"].items():
        print(f"  {count} worker(s): {rate:7.1f} operations/s", file=sys.stderr)
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
