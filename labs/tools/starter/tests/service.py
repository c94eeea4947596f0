"""The service for the tests: receiver.py on a free loopback port, its data in a temp folder."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the folder with receiver.py and workflow.py
START_DEADLINE_S = 60.0  # a hang guard: receiver.py answers /health in under a second (unless busy)
RUN_TIMEOUT_S = 120.0  # seconds for one workflow.py command (LangGraph imports in about 1 s)
POLL_S = 0.05  # seconds between two /health polls


class ServiceTestCase(unittest.TestCase):
    """Each test gets its own receiver.py (self.url) and environment for workflow.py (self.env)."""

    def setUp(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
        self.env.update(
            PORT=str(port),
            API_URL=self.url,
            RECEIVER_DB=str(folder / "receiver.sqlite"),
            CHECKPOINT_DB=str(folder / "checkpoints.sqlite"),
        )
        log = self.enterContext(open(folder / "receiver.log", "wb"))
        service = [sys.executable, str(HERE / "receiver.py")]
        receiver = subprocess.Popen(service, env=self.env, stderr=log)
        self.addCleanup(receiver.wait, 10)
        self.addCleanup(receiver.terminate)
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.healthy():
            log_text = (folder / "receiver.log").read_text()
            self.assertIsNone(receiver.poll(), f"receiver.py exited: {log_text}")
            self.assertLess(time.monotonic(), deadline, "receiver.py did not answer /health")
            time.sleep(POLL_S)

    def healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def tickets(self, key=None):
        """What the outside world holds: every ticket the receiver has, or those of one key."""
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        with urllib.request.urlopen(self.url + "/tickets" + query, timeout=5) as response:
            return json.load(response)["tickets"]

    def counted(self, name):
        """One of the receiver's counters (GET /metrics): what it did since it started."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(f"receiver_{name}_total "):
                    return int(line.split()[1])
        raise AssertionError(f"no counter {name} in /metrics")

    def workflow(self, *args, fail=""):
        env = dict(self.env, FAILPOINTS=fail) if fail else self.env
        return subprocess.run(
            [sys.executable, str(HERE / "workflow.py"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )


def events(done):
    """The JSON lines a workflow.py run printed (a CompletedProcess, or its output)."""
    text = done if isinstance(done, str) else done.stdout
    return [json.loads(line) for line in text.splitlines()]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
