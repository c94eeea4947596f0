"""Run the lab's two programs natively: the receiver in the background, the workflow per command.

The guide runner's local backend, the drill, the chaos run and the tests all start
processes through this module, so they run the lab exactly the same way.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEALTH_DEADLINE_S = 10.0  # seconds for a receiver to answer /health after it starts
STOP_DEADLINE_S = 5.0  # seconds to exit after SIGTERM before we SIGKILL it


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lab_env(data_dir, port, **extra):
    """The environment both programs read, with the data layout of the two Compose volumes."""
    data_dir = Path(data_dir)
    env = dict(os.environ)
    env.update(
        RECEIVER_DB=str(data_dir / "receiver" / "receiver.sqlite"),
        CHECKPOINT_DB=str(data_dir / "workflow" / "checkpoints.sqlite"),
        HOST="127.0.0.1",
        PORT=str(port),
        API_URL=f"http://127.0.0.1:{port}",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def wait_until(predicate, deadline_s, what):
    """Poll predicate() until it is true; raise TimeoutError naming `what` after the deadline."""
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {deadline_s:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class ReceiverProcess:
    """api.py (or another receiver script) as a background process on a loopback port."""

    def __init__(self, env, log_path=None, script=ROOT / "api.py"):
        self.env, self.script = env, Path(script)
        self.url = env["API_URL"]
        self.log_path = Path(log_path) if log_path else None
        self.proc = None

    def start(self):
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script)], env=self.env, stderr=log, cwd=ROOT
            )
        finally:
            if self.log_path:
                log.close()
        wait_until(self.healthy, HEALTH_DEADLINE_S, f"receiver at {self.url} answering /health")
        return self

    def healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"receiver exited with {self.proc.returncode} while starting")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return json.load(response) == {"ok": True}
        except OSError:
            return False

    def stop(self, sig=signal.SIGTERM):
        """Send sig and wait for the exit; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self):
        return self.stop(signal.SIGKILL)


def run_workflow(args, env, timeout=60):
    """python workflow.py ARGS; returns the CompletedProcess (text). -9 is the SIGKILL exit."""
    return subprocess.run(
        [sys.executable, str(ROOT / "workflow.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def shell_exit_code(returncode):
    """What a shell (and docker compose run) reports: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
