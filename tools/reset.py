"""make reset: the learner's own lab, both ways (`python -m tools.reset`). .venv stays.

Docker: `down -v --remove-orphans` of the project the guides name. Natively: the receiver the
docs/native.md's `up` started (its pid in data/receiver.pid, and only if that process runs this
folder's labs/receiver.py), any other receiver of this folder that serves data/ (a second `up` that
could
not listen overwrote the pid file with its own, dead, pid), lab 10's workers and Postgres tool
(their pid files), then data/: never while a receiver still serves it.
"""

import os
import shutil
import signal
import sys
from pathlib import Path

from tools import native_workers
from tools.backends import LEARNER_PROJECT, compose_command, docker_engine_answers
from tools.local import ROOT, run_command, wait_until
from tools.native import PID_FILE


def stop_native_receiver(pid_file):
    """Stop the receiver a native `up` started (docs/native.md: its pid in data/receiver.pid),
    and wait for it to exit. Only if that pid is this lab's receiver: a pid can be reused by any
    process after a reboot or a crash, and a reset never signals a stranger. -> what it did, or
    None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    where = pid_file.relative_to(ROOT)
    if not running(pid):  # its receiver exited (a second `up` whose port was taken, say)
        return f"native: {where} names pid {pid}, which is not running: nothing to stop"
    if not is_this_labs_receiver(pid):
        return f"native: {where} names pid {pid}, not this lab's receiver: left alone"
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not is_this_labs_receiver(pid), 10, f"the receiver (pid {pid}) stopping")
    return f"native: receiver (pid {pid}) stopped"


def reset_the_learners_lab():
    """make reset: the learner's lab, both ways. .venv stays."""
    if docker_engine_answers():
        # --remove-orphans: a `run --rm` container still attached would keep the network (lab 10).
        down = [*compose_command(), "-p", LEARNER_PROJECT, "down", "-v", "--remove-orphans"]
        done = run_command(down, timeout=120)
        if done.returncode:
            print(f"reset: docker: {done.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        print(f"docker: project {LEARNER_PROJECT} removed (containers, network, volumes)")
    try:
        message = stop_native_receiver(ROOT / PID_FILE)
    except TimeoutError as error:
        print(f"reset: native: {error}; data/ left in place", file=sys.stderr)
        return 1
    if message:
        print(message)
    try:
        for message in stop_receivers_serving(ROOT / "data"):
            print(message)
    except TimeoutError as error:
        print(f"reset: native: {error}; data/ left in place", file=sys.stderr)
        return 1
    native_workers.stop_workers(
        ROOT / "data"
    )  # lab 10 natively: its workers and its Postgres, by pid
    if (ROOT / "data").exists():
        shutil.rmtree(ROOT / "data")
        print("native: data/ deleted")
    return 0


def stop_receivers_serving(data):
    """Stop every running lab receiver (python -m labs.receiver) of this folder whose RECEIVER_DB
    lies in data (the pid file names one receiver at most, and a second `up` that could not listen
    left its own dead pid
    there): what was done, a line each."""
    listed = run_command(
        ["ps", "-ww", "-A", "-o", "pid=,command="], timeout=10
    ).stdout  # -ww: whole
    pids = [int(line.split(None, 1)[0]) for line in listed.splitlines() if "labs.receiver" in line]
    for pid in pids:
        if pid != os.getpid() and is_this_labs_receiver(pid) and serves_data(pid, data):
            os.kill(pid, signal.SIGTERM)
            gone = lambda pid=pid: not is_this_labs_receiver(pid)  # noqa: E731 (a zombie is gone)
            wait_until(gone, 10, f"the receiver (pid {pid}) stopping")
            yield f"native: receiver (pid {pid}) stopped: it served data/ (not in {PID_FILE})"


def serves_data(pid, data):
    """Whether receiver pid keeps its database in data: its RECEIVER_DB (api.py's
    default when unset) from its environment, against its working folder. A receiver whose
    environment or folder cannot be read (another user's; no /proc) is taken to serve it."""
    try:
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
            if "=" in item
        )
    except OSError:
        return True
    cwd = process_cwd(pid)
    db = Path(environ.get("RECEIVER_DB", "data/receiver/receiver.sqlite"))
    if cwd is None:
        return True
    return (cwd / db).resolve().is_relative_to(data.resolve())


# helpers


def running(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and is another user's
        return True
    return True


def is_this_labs_receiver(pid):
    """True when process pid is `python -m labs.receiver` started in this folder (ROOT)."""
    argv = run_command(["ps", "-ww", "-o", "command=", "-p", str(pid)], timeout=10).stdout.split()
    if not argv or not Path(argv[0]).name.lower().startswith("python"):
        return False
    if "labs.receiver" not in argv or argv[argv.index("labs.receiver") - 1] != "-m":
        return False
    cwd = process_cwd(pid)
    return cwd is not None and cwd.resolve() == ROOT.resolve()


def process_cwd(pid):
    """A process's working folder: /proc on Linux, lsof on macOS; None when neither says."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    if not shutil.which("lsof"):
        return None
    listed = run_command(["lsof", "-a", "-d", "cwd", "-p", str(pid), "-Fn"], timeout=10).stdout
    names = [line[1:] for line in listed.splitlines() if line.startswith("n")]
    return Path(names[0]) if names else None


if __name__ == "__main__":
    if sys.argv[1:]:
        sys.exit("usage: python -m tools.reset  (it takes no arguments)")
    sys.exit(reset_the_learners_lab())
