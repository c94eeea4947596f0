"""Lab 10's workers as native processes: a throwaway Postgres and `python -m labs.workers run`s.

labs/workers.py is the product (the workers themselves); this module starts, signals and stops them
where Compose would, by pid. bench_workers.py times them.

compose.yaml's postgres service becomes a TempPostgres cluster in a temporary folder, and each
worker replica a `python -m labs.workers run` process. The guide runner's local backend, the scale
chaos run and the bench start them through LocalWorkers, the same way.

A learner typing lab 10 natively uses the command line below instead: it keeps the pid of each
worker it starts in data/workers/, so it signals and stops those processes and no others (a broad
`pkill -f 'labs.workers run'` would hit anyone's workers on a shared machine). `make reset`
stops them
too, and the Postgres tool whose pid the guide's native line kept in data/pg.pid.

    python -m tools.native_workers up N        N workers in the background (log in
                                                    data/workers.log); dead ones started again,
                                                    extra ones stopped
    python -m tools.native_workers signal SIG  SIGKILL, SIGSTOP, SIGCONT... to each live one
    python -m tools.native_workers stop        SIGTERM each (they drain), then forget them
Options: --data DIR (default: data). Workers read CHECKPOINT_DB and the rest from the environment.
"""

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from tools import safefiles
from tools.local import ROOT, STOP_DEADLINE_S, wait_until
from tools.pg import TempPostgres

# compose.yaml's worker service sets WORKER_HEARTBEAT_S to this too: the guide's output is the same
# either way only if a stalled job changes hands after the same time.
HEARTBEAT_S = "3"
WORKER = "-m labs.workers run"  # in a worker's command line (ps): its pid file names ours


def stopped(proc):
    """True once a SIGSTOPped process is really stopped (state T in /proc; elsewhere: assume so)."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class LocalWorkers:
    """A throwaway Postgres cluster, and worker processes logging to data_dir/workers.log."""

    def __init__(self, env, data_dir, heartbeat_s=HEARTBEAT_S, durable=False):
        self.base_env, self.data_dir = env, Path(data_dir)
        self.heartbeat_s, self.durable = heartbeat_s, durable
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
            self.postgres = TempPostgres(durable=self.durable).start()

    def spawn(self):
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with safefiles.open_log(self.data_dir / "workers.log") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "labs.workers", "run"],
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
        """`run --rm worker ARGS`: python -m labs.workers ARGS, to the end."""
        return subprocess.run(
            [sys.executable, "-m", "labs.workers", *args],
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


# helpers: the native command line


def pid_files(data):
    return sorted((Path(data) / "workers").glob("worker-*.pid"), key=lambda f: int(f.stem[7:]))


def is_ours(pid, what):
    """pid is still a live process running `what` (a pid file can outlive its process, and the
    number can be reused by another program)."""
    done = subprocess.run(
        ["ps", "-ww", "-o", "command=", "-p", str(pid)], capture_output=True, text=True
    )
    return what in done.stdout


def read_pid(pid_file, what):
    try:
        pid = int((safefiles.read_regular(pid_file) or "").strip())  # a FIFO: NotAFile, no hang
    except (OSError, ValueError):
        return None
    return pid if is_ours(pid, what) else None


def up(data, replicas):
    folder = Path(data) / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(1, replicas + 1):
        pid_file = folder / f"worker-{index}.pid"
        if read_pid(pid_file, WORKER):
            continue
        safefiles.refuse_special(pid_file)  # before a worker starts that nothing would name
        with safefiles.open_log(Path(data) / "workers.log") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "labs.workers", "run"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # not in the shell's job control: Ctrl-C there is not ours
            )
        safefiles.write_beside(pid_file, f"{proc.pid}\n")
        print(f"workers: worker {index} started (pid {proc.pid})")
    for pid_file in pid_files(data)[replicas:]:
        stop_one(pid_file)


def signal_workers(data, sig):
    for pid_file in pid_files(data):
        if pid := read_pid(pid_file, WORKER):
            os.kill(pid, sig)


def stop_one(pid_file, what=WORKER):
    """SIGCONT (a frozen process would never see the rest), SIGTERM, and wait; SIGKILL after
    STOP_DEADLINE_S. The pid file goes either way."""
    pid = read_pid(pid_file, what)
    if pid:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not is_ours(pid, what), STOP_DEADLINE_S, f"pid {pid} to exit")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
        print(f"workers: pid {pid} ({what}) stopped")
    pid_file.unlink(missing_ok=True)


def stop_workers(data):
    """Every worker this command line started, then the Postgres tool of data/pg.pid."""
    for pid_file in pid_files(data):
        stop_one(pid_file)
    pg_pid = Path(data) / "pg.pid"
    if pg_pid.exists():
        stop_one(pg_pid, "tools.pg")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.native_workers", description=__doc__)
    parser.add_argument("--data", default="data", help="the native lab's folder (default: data)")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("up").add_argument("replicas", type=int)
    actions.add_parser("signal").add_argument("signal", choices=[s.name for s in signal.Signals])
    actions.add_parser("stop")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up(args.data, args.replicas)
        elif args.action == "signal":
            signal_workers(args.data, signal.Signals[args.signal])
        else:
            stop_workers(args.data)
    except safefiles.NotAFile as error:  # a link or a FIFO where its log or a pid file goes
        print(f"workers: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
