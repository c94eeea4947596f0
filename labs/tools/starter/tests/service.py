"""The service for the tests: api.py on a free loopback port, its data in a temporary folder."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the folder with api.py and workflow.py
START_DEADLINE_S = 60.0  # a hang guard: api.py answers /health in under a second (unless busy)
RUN_TIMEOUT_S = 120.0  # seconds for one workflow.py command (LangGraph imports in about 1 s)
POLL_S = 0.05  # seconds between two /health polls


class ServiceTestCase(unittest.TestCase):
    """Each test gets its own api.py (self.url) and environment for workflow.py (self.env)."""

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
        api = subprocess.Popen([sys.executable, str(HERE / "api.py")], env=self.env, stderr=log)
        self.addCleanup(api.wait, 10)
        self.addCleanup(api.terminate)
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.healthy():
            self.assertIsNone(api.poll(), f"api.py exited: {(folder / 'receiver.log').read_text()}")
            self.assertLess(time.monotonic(), deadline, "api.py did not answer /health in time")
            time.sleep(POLL_S)

    def healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def tickets(self):
        """What the outside world holds: every ticket the receiver has."""
        with urllib.request.urlopen(self.url + "/tickets", timeout=5) as response:
            return json.load(response)["tickets"]

    def final(self, operation, title="Check supplier configuration"):
        """The done event's values for the only ticket there is (workflow.py's default title)."""
        (ticket,) = self.tickets()
        return {
            "key": operation,
            "operation_id": operation,
            "ticket_id": ticket["ticket_id"],
            "title": title,
        }

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
    return [json.loads(line) for line in done.stdout.splitlines()]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
