"""The guarantee, checked with real processes: a run that dies in its crash window and is resumed
leaves exactly one ticket, and a key is never reused for another ticket.

    python -m unittest            (from the starter's folder; the standard library only)

Each test starts api.py on a free loopback port with its data in a temporary folder and runs
workflow.py as a real subprocess, with FAILPOINTS opening the window for real: `kill` is a
SIGKILL of the workflow process by itself, `term` a SIGTERM (see failpoints.py).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the folder with api.py and workflow.py
START_DEADLINE_S = 15.0  # seconds for api.py to answer /health
RUN_TIMEOUT_S = 120.0  # seconds for one workflow.py command (LangGraph imports in about 1 s)
POLL_S = 0.05  # seconds between two /health polls
EXIT_DRAINED = 75  # workflow.py's EXIT_DRAINED: stopped on SIGTERM, checkpoint saved
EXIT_HTTP_ERROR = 1  # workflow.py's EXIT_HTTP_ERROR: the receiver answered with an error


class CrashWindowTest(unittest.TestCase):
    def test_a_kill_after_the_ack_then_resume_leaves_one_ticket(self):
        crashed = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-ack=kill"
        )
        # SIGKILL: subprocess reports -9 (a shell shows 137). The ticket was committed.
        self.assertEqual(crashed.returncode, -signal.SIGKILL, crashed.stderr)
        self.assertIn({"event": "crash", "at": "after-ack"}, events(crashed))
        self.assertEqual(len(self.tickets()), 1)

        resumed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        ack = [e for e in events(resumed) if e["event"] == "effect_ack"]
        # create_ticket ran again and sent its request again; the key made it a replay.
        self.assertEqual(ack, [{"event": "effect_ack", "created": False, "ticket_id": 1}])
        self.assertEqual(events(resumed)[-1]["event"], "done")
        self.assertEqual([t["key"] for t in self.tickets()], ["op-1"])

    def test_a_sigterm_drains_at_the_step_boundary_then_resume_leaves_one_ticket(self):
        drained = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-prepare=term"
        )
        self.assertEqual(drained.returncode, EXIT_DRAINED, drained.stderr)
        last = events(drained)[-1]
        self.assertEqual((last["event"], last["next"]), ("drained", ["create_ticket"]))
        self.assertEqual(self.tickets(), [])  # prepare finished and was saved; nothing was sent

        resumed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertEqual(events(resumed)[-1], {"event": "done", **self.final("op-1")})
        self.assertEqual([t["key"] for t in self.tickets()], ["op-1"])

    def test_a_key_names_one_ticket_and_a_new_key_makes_a_new_one(self):
        first = self.workflow("start", "--thread", "t1", "--operation", "op-1", "--title", "A")
        self.assertEqual(first.returncode, 0, first.stderr)

        reused = self.workflow("start", "--thread", "t2", "--operation", "op-1", "--title", "B")
        self.assertEqual(reused.returncode, EXIT_HTTP_ERROR, reused.stderr)
        error = events(reused)[-1]
        self.assertEqual((error["event"], error["status"]), ("http_error", 409))
        self.assertIn("Idempotency-Key", error["body"]["error"])

        other = self.workflow("start", "--thread", "t3", "--operation", "op-2", "--title", "B")
        self.assertEqual(other.returncode, 0, other.stderr)
        self.assertEqual(events(other)[-1]["ticket_id"], 2)
        self.assertEqual(
            [(t["key"], t["payload"]) for t in self.tickets()],
            [
                ("op-1", {"title": "A"}),
                ("op-2", {"title": "B"}),
            ],
        )

    # helpers

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


if __name__ == "__main__":
    unittest.main()
