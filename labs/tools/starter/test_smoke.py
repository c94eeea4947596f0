"""Smoke test: the service up, a workflow run to `done`, the same operation again: no new ticket.

    python -m unittest test_smoke.py

Standard library only; it starts api.py on a free loopback port with its data in a temp folder.
"""

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

HERE = Path(__file__).resolve().parent
DEADLINE_S = 15.0  # seconds for the service to answer /health


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SmokeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = dict(
            os.environ,
            PORT=str(port),
            API_URL=self.url,
            RECEIVER_DB=str(Path(self.tmp.name) / "receiver.sqlite"),
            CHECKPOINT_DB=str(Path(self.tmp.name) / "checkpoints.sqlite"),
        )
        self.api = subprocess.Popen(
            [sys.executable, str(HERE / "api.py")], env=self.env, stderr=subprocess.DEVNULL
        )
        self.addCleanup(self.tmp.cleanup)
        self.addCleanup(self.api.wait, 10)
        self.addCleanup(self.api.terminate)
        deadline = time.monotonic() + DEADLINE_S
        while not self.healthy():
            self.assertIsNone(self.api.poll(), "api.py exited while starting")
            self.assertLess(time.monotonic(), deadline, "api.py did not answer /health")
            time.sleep(0.05)

    def healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return json.load(response) == {"ok": True}
        except OSError:
            return False

    def workflow(self, *args):
        done = subprocess.run(
            [sys.executable, str(HERE / "workflow.py"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        return [json.loads(line) for line in done.stdout.splitlines()]

    def test_a_run_finishes_and_a_repeat_of_its_operation_makes_no_second_ticket(self):
        operation = "order-42:open-ticket:v1"
        first = self.workflow("start", "--thread", "t1", "--operation", operation)
        self.assertEqual(first[-1]["event"], "done")
        self.assertEqual(first[-1]["ticket_id"], 1)
        again = self.workflow("start", "--thread", "t2", "--operation", operation)
        ack = [e for e in again if e["event"] == "effect_ack"]
        self.assertEqual(ack, [{"event": "effect_ack", "created": False, "ticket_id": 1}])
        listed = self.workflow("tickets")
        self.assertEqual(len(listed[0]["tickets"]), 1)


if __name__ == "__main__":
    unittest.main()
