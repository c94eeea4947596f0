"""The guarantee, checked with real processes: a run that dies in an effect's crash window and is
resumed leaves exactly one of that effect, and a key is never reused for another request.

    python -m unittest            (from the starter's folder, with requirements.txt installed)

Each test starts receiver.py on a free loopback port with its data in a temporary folder and runs
workflow.py as a real subprocess, with FAILPOINTS opening the window for real: `kill` is a
SIGKILL of the workflow process by itself, `term` a SIGTERM (see failpoints.py).

The first test is told nothing about the graph's effects: it kills the run in the window of
each effect workflow.py performs (after-send: the receiver has committed, the ledger has no
receipt yet), whatever effects you declare there, and checks that each was done exactly once.
"""

import contextlib
import io
import signal
import unittest

import effects
import workflow
from tests.service import ServiceTestCase, events


class CrashWindowTest(ServiceTestCase):
    def test_every_effect_killed_in_its_window_is_adopted_by_its_key_not_sent_again(self):
        # A kill lands in the window of the first effect the ledger holds no receipt of. On
        # the resume that effect's key is looked up (it is adopted, not sent) and the next
        # effect is sent: the same failpoint kills the run in its window. And so on, until a
        # run has no effect left to send and finishes.
        declared = effects.declared(vars(workflow))
        command, kills = ["start", "--thread", "t1", "--operation", "op-1"], 0
        for _ in range(len(declared) + 1):  # one kill per effect at most, then done
            done = self.workflow(*command, fail="after-send=kill")
            if done.returncode != -signal.SIGKILL:
                break
            self.assertIn({"event": "crash", "at": "after-send"}, events(done))
            kills, command = kills + 1, ["resume", "--thread", "t1"]
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(events(done)[-1]["event"], "done")

        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            performed = [ledger.get(key) for (key,) in ledger.sql("SELECT key FROM effects")]
            histories = {record.key: ledger.history(record.key) for record in performed}
        # Every effect declared in workflow.py was performed (one not wired into STEPS fails
        # here), and each one was killed in its window once.
        self.assertEqual({record.effect for record in performed}, set(declared))
        self.assertEqual(kills, len(performed))
        for record in performed:
            self.assertEqual(record.state, "confirmed", histories)
            self.assertEqual(
                histories[record.key],
                [(None, "requested", "claimed"), ("requested", "confirmed", "adopted by lookup")],
            )
            (made,) = self.tickets(record.key)  # the receiver holds one under each key
            self.assertEqual(made["ticket_id"], record.answer["ticket_id"])
        self.assertEqual(len(self.tickets()), len(performed))  # and nothing else
        self.assertEqual(self.counted("idempotent_replays"), 0)  # nothing was sent twice

    def test_a_kill_after_the_receipt_then_resume_sends_nothing(self):
        crashed = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-ack=kill"
        )
        # SIGKILL: subprocess reports -9 (a shell shows 137). The ticket was committed, and
        # its receipt is in the ledger; the checkpoint does not know yet.
        self.assertEqual(crashed.returncode, -signal.SIGKILL, crashed.stderr)
        self.assertIn({"event": "crash", "at": "after-ack"}, events(crashed))
        (ticket,) = self.tickets("op-1")

        resumed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        # create_ticket ran again and found the receipt: the receiver was not asked again.
        replayed = [e for e in events(resumed) if e["event"].startswith("effect_")][0]
        self.assertEqual(
            replayed, {"event": "effect_receipt", "key": "op-1", "ticket_id": ticket["ticket_id"]}
        )
        self.assertEqual(events(resumed)[-1]["event"], "done")
        self.assertEqual(self.tickets("op-1"), [ticket])
        self.assertEqual(self.counted("idempotent_replays"), 0)

    def test_a_sigterm_drains_at_the_step_boundary_then_resume_leaves_one_ticket(self):
        drained = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-prepare=term"
        )
        self.assertEqual(drained.returncode, workflow.EXIT_DRAINED, drained.stderr)
        last = events(drained)[-1]
        self.assertEqual((last["event"], last["next"]), ("drained", ["create_ticket"]))
        self.assertEqual(self.tickets(), [])  # prepare finished and was saved; nothing was sent

        resumed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        done = events(resumed)[-1]
        (ticket,) = self.tickets("op-1")
        self.assertEqual((done["event"], done["ticket_id"]), ("done", ticket["ticket_id"]))

    def test_a_key_names_one_request_and_a_new_key_makes_a_new_ticket(self):
        # No kill here: workflow.main in this process, the same code as workflow.py's.
        def run(*args):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = workflow.main(list(args), environ=self.env)
            return code, events(out.getvalue()), err.getvalue()

        code, _, err = run("start", "--thread", "t1", "--operation", "op-1", "--title", "A")
        self.assertEqual(code, 0, err)
        # The same key for another request: the ledger refuses it before anything is sent.
        code, _, err = run("start", "--thread", "t2", "--operation", "op-1", "--title", "B")
        self.assertEqual(code, workflow.EXIT_HTTP_ERROR, err)
        self.assertIn("claimed for another ticket request", err)
        # And the receiver refuses it too, sent without the ledger (workflow.py post).
        code, printed, err = run("post", "--operation", "op-1", "--title", "B")
        self.assertEqual(code, workflow.EXIT_HTTP_ERROR, err)
        self.assertEqual((printed[-1]["event"], printed[-1]["status"]), ("http_error", 409))
        self.assertIn("Idempotency-Key", printed[-1]["body"]["error"])

        code, _, err = run("start", "--thread", "t3", "--operation", "op-2", "--title", "B")
        self.assertEqual(code, 0, err)
        self.assertEqual([t["payload"] for t in self.tickets("op-1")], [{"title": "A"}])
        self.assertEqual([t["payload"] for t in self.tickets("op-2")], [{"title": "B"}])


if __name__ == "__main__":
    unittest.main()
