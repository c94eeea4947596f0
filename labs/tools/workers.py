"""The `scale` profile natively: a throwaway Postgres and worker.py processes (lab 10).

compose.yaml's postgres service becomes a TempPostgres cluster in a temporary folder, and each
worker replica a `python worker.py run` process. The guide runner's local backend, the scale
chaos run and the bench start them through this class, the same way.
"""

import signal
import subprocess
import sys
from pathlib import Path

from labs.tools.local import ROOT, STOP_DEADLINE_S, wait_until
from labs.tools.pg import TempPostgres

# compose.yaml's worker service sets WORKER_HEARTBEAT_S to this too: the guide's output is the same
# either way only if a stalled job changes hands after the same time.
HEARTBEAT_S = "3"


def stopped(proc):
    """True once a SIGSTOPped process is really stopped (state T in /proc; elsewhere: assume so)."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class LocalWorkers:
    """A throwaway Postgres cluster, and worker processes logging to data_dir/workers.log."""

    def __init__(self, env, data_dir, heartbeat_s=HEARTBEAT_S):
        self.base_env, self.data_dir = env, Path(data_dir)
        self.heartbeat_s = heartbeat_s
        self.postgres = None
        self.procs = []  # one per replica, like worker_1, worker_2, ...

    @property
    def env(self):
        self.start_postgres()  # like depends_on: postgres in compose.yaml
        return dict(
            self.base_env, CHECKPOINT_DB=self.postgres.url, WORKER_HEARTBEAT_S=self.heartbeat_s
        )

    def start_postgres(self):
        if self.postgres is None:
            self.postgres = TempPostgres().start()

    def spawn(self):
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "workers.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, str(ROOT / "worker.py"), "run"],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=log,
            )

    def scale(self, replicas):
        """`up -d --scale worker=N`: N live workers, restarting dead ones, stopping extras."""
        for index in range(replicas):
            if index == len(self.procs):
                self.procs.append(self.spawn())
            elif self.procs[index].poll() is not None:
                self.procs[index] = self.spawn()
        for proc in self.procs[replicas:]:
            self.stop(proc)
        del self.procs[replicas:]

    def live(self):
        return [p for p in self.procs if p.poll() is None]

    def signal(self, sig):
        """`kill -s SIG worker`, `pause` (SIGSTOP) and `unpause` (SIGCONT): every live replica."""
        for proc in self.live():
            proc.send_signal(sig)
            if sig == signal.SIGKILL:
                proc.wait(STOP_DEADLINE_S)
            elif sig == signal.SIGSTOP:
                wait_until(lambda p=proc: stopped(p), STOP_DEADLINE_S, f"worker {proc.pid} stopped")

    def stop(self, proc):
        proc.send_signal(signal.SIGCONT)  # a frozen process would never see the SIGTERM
        proc.terminate()
        try:
            proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def run(self, args, timeout=300):
        """`run --rm worker ARGS`: python worker.py ARGS, to the end."""
        return subprocess.run(
            [sys.executable, str(ROOT / "worker.py"), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop_all(self):
        """SIGTERM every worker: each finishes the runs it has started, then exits."""
        for proc in self.live():
            self.stop(proc)
        self.procs = []

    def close(self):
        """`down -v`: stop every worker, then delete the cluster."""
        self.stop_all()
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
