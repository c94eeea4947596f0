"""Several workers, one queue, and chaos: faults in the workers and in what they depend on,
until every operation is done.

    python -m tools.scale_chaos [--workers 3] [--operations 60] [--mode safe|naive]
        [--faults kill,freeze,pg-restart,receiver-outage,deploy] [--seed N]

Everything runs natively and throwaway: a Postgres cluster (tools.pg), a receiver on a free
port, and `python -m labs.workers run` processes (tools.native_workers). It submits OPERATIONS
operations, one thread each. Once every worker holds a job in its crash window, the first strike
SIGKILLs them all (with `kill` among the faults); then, until the queue is empty, it strikes with
each fault of FAULTS once, in a random order, then with faults picked at random, each strike
once an operation has finished since the last (paced by progress, so a busy machine still drains):
    kill             SIGKILL a random worker, and start it again (a restart policy)
    freeze           SIGSTOP a random worker for longer than the heartbeat, then SIGCONT
    pg-restart       Postgres stopped as a crash would (pg_ctl -m immediate), started 1-3 s later
    receiver-outage  the receiver killed, started again 3-5 s later: longer than the client's own
                     retries (~1.75 s), so jobs fail and the queue retries them
    deploy           a rolling deploy: SIGTERM to every worker in turn, a replacement started for
                     each; each must exit within Compose's default grace period (10 s, less
                     than the 30 s compose.yaml gives the worker) or is SIGKILLed
The first workers are held at the after-ack failpoint, inside the crash window, each by its own
file (FAILPOINTS="after-ack=pause(PATH)"), until every one of them is there: the first strike
finds them all in the window, however slow the machine. The workers started after it sit
ACK_DELAY_S in the window after each receiver answer (FAILPOINTS="after-ack=sleep(S)"), so later
strikes often land there too (no verdict depends on it). The seed (printed first, on stderr;
--seed N to reuse one) fixes the random draws: which fault strikes next, which worker, how long.
How many strikes a run needs depends on how fast the jobs go, so a replay with the same seed need
not give the same counts; the invariant holds every time (safe: no duplicate, nothing
unfinished).

The last line on stdout is one JSON object:
    operations        submitted
    tickets           tickets the receiver holds
    duplicates        tickets beyond the first for an operation (0 in safe mode)
    faults            how many times each fault struck ({"kill": 4, "freeze": 2, ...})
    deploy_exits      how the workers a deploy stopped ended: {"exit 0": 9}; "past grace: SIGKILL"
    unfinished        operations whose thread has no ticket in its final checkpoint
Progress goes to stderr. Safe mode: exit 0 when there are no duplicates and nothing is unfinished,
else 1. Naive mode: duplicates are the finding (printed as such); exit 0 unless some operation
is unfinished.
"""

import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from tools.local import ROOT, ReceiverProcess, free_port, lab_env, wait_until

sys.path.insert(0, str(ROOT))
import checkpoints
import commandline  # noqa: E402
import failpoints  # noqa: E402
from labs import lab_graph, worker_queue
from tools.native_workers import LocalWorkers, stopped  # noqa: E402

HEARTBEAT_S = "1"  # short, so a frozen or dead worker's job moves on quickly
ACK_DELAY_S = "1.0"  # seconds each run after the first strike sits in the crash window (the
# after-ack failpoint): long enough that 60 operations outlast a first round of every fault
DEADLINE_S = 170.0  # the whole run, queue drained included
FAULTS = ("kill", "freeze", "pg-restart", "receiver-outage", "deploy")
GRACE_S = 10.0  # compose's default stop_grace_period: SIGTERM, then SIGKILL after this long
RETRY_S = "0.5"  # WORKER_RETRY_S: a job failed by the receiver's outage is tried again soon
POLL_S = 0.1  # seconds between looks at the queue while the next strike waits for progress


def log_line(message):
    print(f"scale-chaos: {message}", file=sys.stderr, flush=True)


async def submit_all(queries, operations, mode):
    for n in range(operations):
        name = f"chaos-{n:03d}"
        # The title names the operation too: naive tickets carry no key to count them by.
        operation = {"thread": name, "operation_id": name, "mode": mode, "title": name}
        await worker_queue.enqueue(queries, operation)


async def pending(queries):
    return [j for j in await worker_queue.jobs(queries) if worker_queue.job_unfinished(j)]


def finished_threads(url, operations):
    """How many threads have a ticket in their latest checkpoint."""
    done = 0
    with checkpoints.open_checkpointer(url) as saver:
        graph = lab_graph.build_lab_graph(saver)
        for n in range(operations):
            config = {"configurable": {"thread_id": f"chaos-{n:03d}"}}
            snapshot = graph.get_state(config)
            done += "ticket_id" in snapshot.values and not snapshot.next
    return done


def tickets_at(api_url):
    with urllib.request.urlopen(api_url + "/tickets", timeout=10) as response:
        return json.load(response)["tickets"]


def chaos_run(
    workers_n, operations, mode, seed, work_dir, ack_delay_s=ACK_DELAY_S, faults=FAULTS,
    grace_s=GRACE_S, deadline_s=DEADLINE_S,
):  # fmt: skip
    """The run's figures (see the docstring). grace_s: a deploy's SIGKILL comes this long after
    its SIGTERM; deadline_s: how long the workers may take to reach the window, then to drain the
    queue (a test passes hang guards for both: how fast is the run's figure, not its verdict)."""
    rng = random.Random(seed)
    env = lab_env(work_dir / "data", free_port())
    receiver = [ReceiverProcess(env, log_path=work_dir / "receiver.log").start()]
    workers = LocalWorkers(env, work_dir, heartbeat_s=HEARTBEAT_S)
    # Many outages may hit one job: it must not run out of attempts in a chaos run.
    base_env = dict(env, WORKER_RETRY_S=RETRY_S, WORKER_JOB_ATTEMPTS="50")
    pauses = [work_dir / f"after-ack-{n + 1}" for n in range(workers_n)]  # one per worker
    struck = Counter({fault: 0 for fault in faults})
    exits = Counter()  # how the workers a deploy stopped exited
    loop = asyncio.new_event_loop()
    try:
        url = workers.env["CHECKPOINT_DB"]
        queries = loop.run_until_complete(worker_queue.open_queue(url))
        loop.run_until_complete(submit_all(queries, operations, mode))
        log_line(f"{operations} {mode} operations queued; starting {workers_n} workers")
        for n, path in enumerate(pauses):  # worker n+1 stops at after-ack until its file says go
            workers.base_env = dict(base_env, FAILPOINTS=f"after-ack=pause({path})")
            workers.scale(n + 1)

        # The first strike waits until every worker (by pid) that holds a job is paused at
        # after-ack (its file exists: it has the receiver's answer and stays in the crash window),
        # and every worker holds one or no job is left for it: a strike on a worker still starting
        # up, or on one between jobs, would prove nothing.
        def all_in_the_window():
            jobs = loop.run_until_complete(pending(queries))
            holding = {j["worker"].rsplit(":", 1)[1] for j in jobs if j["status"] == "running"}
            paused = {
                str(p.pid) for p, path in zip(workers.procs, pauses, strict=True) if path.exists()
            }
            left = any(j["status"] != "running" for j in jobs)  # queued, stalled or retrying
            return bool(holding) and holding <= paused and (len(holding) >= workers_n or not left)

        wait_until(all_in_the_window, deadline_s, "every worker to hold a job in the crash window")
        workers.base_env = dict(base_env, FAILPOINTS=f"after-ack=sleep({ack_delay_s})")
        if "kill" in faults:  # the first strike: every worker at once, then random faults
            for proc in workers.live():
                proc.kill()
                proc.wait()
                struck["kill"] += 1
            log_line(f"SIGKILL all {workers_n} workers")
            workers.scale(workers_n)
        for path in pauses:  # a worker not killed goes on, and passes after-ack from now on
            failpoints.unpause(path)
        deadline = time.monotonic() + deadline_s
        strike = Strike(rng, workers, workers_n, receiver, env, work_dir, exits, grace_s)

        def look():
            """Every job; our own connection again if a pg-restart broke it."""
            nonlocal queries
            try:
                return loop.run_until_complete(worker_queue.jobs(queries))
            except Exception as error:
                if not worker_queue.lost_connection(error):
                    raise
            queries = loop.run_until_complete(worker_queue.open_queue(url, time.monotonic() + 30))
            return loop.run_until_complete(worker_queue.jobs(queries))

        # Each fault once, in a random order, even if the queue drains first (a deploy or an
        # outage must not lose an idle worker's next job either); then any, until it drains.
        # Strikes are paced by progress, not by the clock: each one after the first waits for an
        # operation to finish since the last, so a slow machine sees fewer strikes per second,
        # never a queue that cannot drain because every job is struck before it ends.
        first = rng.sample(faults, len(faults))
        done_at_strike = -1
        while True:
            jobs = look()
            left = sum(worker_queue.job_unfinished(j) for j in jobs)
            if not first and not left:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the queue did not drain within {deadline_s:g} s")
            done = sum(j["status"] == "done" for j in jobs)
            if done <= done_at_strike and left:
                time.sleep(POLL_S)  # no operation finished since the last strike: not yet
                continue
            fault = first.pop() if first else rng.choice(faults)
            if getattr(strike, fault.replace("-", "_"))():
                struck[fault] += 1
            done_at_strike = done
            time.sleep(rng.uniform(0.5, 2.0))  # a random moment, not a synchronisation
        # A woken worker may still be in a run that another worker completed already: SIGTERM
        # lets every worker drain what it started before it exits.
        log_line("queue drained; stopping the workers")
        workers.stop_all()
        done = finished_threads(url, operations)
        held = tickets_at(env["API_URL"])
    finally:
        for path in pauses:  # a worker still paused would not see its SIGTERM's drain
            failpoints.unpause(path)
        workers.close()
        receiver[0].stop()
        loop.close()
    per_operation = Counter(t["payload"]["title"] for t in held)
    return {
        "operations": operations,
        "tickets": len(held),
        "duplicates": sum(count - 1 for count in per_operation.values()),
        "faults": dict(struck),
        "deploy_exits": dict(exits),
        "unfinished": operations - done,
    }


class Strike:
    """One fault each; True when it struck (a worker already gone is not struck again)."""

    def __init__(self, rng, workers, workers_n, receiver, env, work_dir, exits, grace_s):
        self.rng, self.workers, self.workers_n = rng, workers, workers_n
        self.receiver, self.env, self.work_dir, self.exits = receiver, env, work_dir, exits
        self.grace_s = grace_s

    def victim(self):
        index = self.rng.randrange(self.workers_n)
        proc = self.workers.procs[index]
        return (index, proc) if proc.poll() is None else (index, None)

    def kill(self):
        index, proc = self.victim()
        if proc is None:
            return False
        proc.kill()
        proc.wait()
        log_line(f"SIGKILL worker {index + 1}")
        self.workers.scale(self.workers_n)  # a new process in its place, like a restart policy
        return True

    def freeze(self):
        index, proc = self.victim()
        if proc is None:
            return False
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(proc), 5, "the worker to stop")
        hold = float(HEARTBEAT_S) + self.rng.uniform(0.2, 1.0)  # past the heartbeat
        log_line(f"SIGSTOP worker {index + 1} for {hold:.1f} s")
        time.sleep(hold)
        proc.send_signal(signal.SIGCONT)
        return True

    def pg_restart(self):
        down = self.rng.uniform(1.0, 3.0)
        log_line(f"Postgres stopped (immediate) for {down:.1f} s")
        self.workers.postgres.halt()
        time.sleep(down)
        self.workers.postgres.start_server()
        return True

    def receiver_outage(self):
        down = self.rng.uniform(3.0, 5.0)  # longer than the client's own retries (~1.75 s)
        log_line(f"receiver killed for {down:.1f} s")
        self.receiver[0].kill()
        time.sleep(down)
        log = self.work_dir / "receiver.log"
        self.receiver[0] = ReceiverProcess(self.env, log_path=log).start()
        return True

    def deploy(self):
        """A rolling deploy: each worker in turn gets SIGTERM, and a replacement starts."""
        log_line(f"rolling deploy of {self.workers_n} workers")
        for index in range(self.workers_n):
            old = self.workers.procs[index]
            self.workers.procs[index] = self.workers.spawn()
            old.send_signal(signal.SIGCONT)  # a frozen one would never see the SIGTERM
            old.terminate()
            try:
                self.exits[f"exit {old.wait(self.grace_s)}"] += 1  # 0: drained and gone in time
            except subprocess.TimeoutExpired:
                old.kill()  # what compose does once the grace period is over
                old.wait()
                self.exits["past grace: SIGKILL"] += 1
        return True


def main(argv=None):
    parser = commandline.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--operations", type=int, default=60)
    parser.add_argument("--mode", choices=("safe", "naive"), default="safe")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's chaos")
    parser.add_argument(
        "--ack-delay",
        type=float,
        default=float(ACK_DELAY_S),
        help="seconds in the crash window after the first strike",
    )
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}"
    )
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if not faults or set(faults) - set(FAULTS):
        parser.exit(2, f"scale-chaos: --faults takes some of {','.join(FAULTS)}\n")
    if args.workers < 1 or args.operations < 1:
        parser.exit(2, "scale-chaos: --workers and --operations must be at least 1\n")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    log_line(f"seed {seed}")
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="stateful-lab-scale-") as work_dir:
            result = chaos_run(
                args.workers, args.operations, args.mode, seed, Path(work_dir), args.ack_delay,
                faults,
            )  # fmt: skip
    except KeyboardInterrupt:
        print("scale-chaos: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as error:
        print(f"scale-chaos: {error}", file=sys.stderr)
        return 1
    log_line(f"done in {time.monotonic() - started:.0f} s")
    print(json.dumps(result, sort_keys=True), flush=True)
    if result["unfinished"]:
        return 1
    if args.mode == "naive":  # the lesson, not a failure
        log_line(
            f"finding: {result['duplicates']} duplicate ticket(s) in naive mode: without a key "
            "every repeated run of create_ticket is a new ticket (safe mode: 0)"
        )
        return 0
    return 0 if result["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
