"""The guarantee, checked with real processes: a run that dies in its crash window and is resumed
leaves exactly one ticket, and a key is never reused for another ticket.

    python -m unittest            (from the starter's folder, with requirements.txt installed)

Each test starts api.py on a free loopback port with its data in a temporary folder and runs
workflow.py as a real subprocess, with FAILPOINTS opening the window for real: `kill` is a
SIGKILL of the workflow process by itself, `term` a SIGTERM (see failpoints.py).
"""

import signal
import unittest

from tests.service import ServiceTestCase, events

EXIT_DRAINED = 75  # workflow.py's EXIT_DRAINED: stopped on SIGTERM, checkpoint saved
EXIT_HTTP_ERROR = 1  # workflow.py's EXIT_HTTP_ERROR: the receiver answered with an error


class CrashWindowTest(ServiceTestCase):
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


if __name__ == "__main__":
    unittest.main()
