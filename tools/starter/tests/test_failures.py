"""What goes wrong between a run and its providers, each with real processes: api.py (and,
where a provider must behave as api.py does not, the stand-in provider of tests/service.py)
on a free loopback port, workflow.py run as a real process, failpoints for every timing.

    a lost answer        the provider committed and its answer never came back: looked up by key
    a late answer        it commits after the client gave up: not sent again before settle_s
                         (unless the provider honours the key), adopted once it shows
    in progress          killed while a keyed provider holds the request: its 409 "in
                         progress" leaves it unknown; the first answer wins once it is made
    a 409                the key was used for another body: a refusal, the run stops, nothing done
    a tampered receipt   the ledger refuses it (exit 7) and sends nothing
    a wrong URL's 404    nothing made, the key still free: fixed, the resume makes exactly one

A second order killed in its own window: test_crash_window.py walks two orders.
"""

import json
import os
import signal
import sqlite3
import unittest
import urllib.error
import urllib.request

import effects
import exitcodes
import failpoints
import providers
from tests.service import ServiceTestCase, StandInClient, events, handled

CLIENT_GIVES_UP_S = 2.0  # API_TIMEOUT_S where the provider is held: then no answer
STANDIN_GIVES_UP_S = 0.3  # the stand-in's client's wait for its first POST (the rest: 5 s)


class LostAnswerTest(ServiceTestCase):
    def test_a_lost_answer_is_looked_up_by_its_key_and_adopted_not_sent_again(self):
        held = self.folder / "after-commit"
        self.receiver_with(f"after-commit=pause({held})")  # committed, its answer held back
        self.env["API_TIMEOUT_S"] = str(CLIENT_GIVES_UP_S)
        try:
            done = self.workflow("start", "--thread", "t1", "--operation", "op-1")
        finally:
            failpoints.unpause(held)  # the answer goes out to a client that has gone
        self.assertEqual(done.returncode, 0, done.stderr)
        (ticket,) = self.tickets("op-1")
        adopted = {"event": "effect_adopted", "key": "op-1", "ticket_id": ticket["ticket_id"]}
        self.assertIn(adopted, events(done))
        self.assertEqual(events(done)[-1]["ticket_id"], ticket["ticket_id"])
        self.assertEqual(self.counted("idempotent_replays"), 0)  # not sent again
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            states = [to for _, to, _ in ledger.history("op-1")]
        self.assertEqual(states, ["requested", "unknown", "confirmed"])


class LateAnswerTest(ServiceTestCase):
    """A provider that commits after the client gave up (the stand-in, held before its commit),
    looked up by the reference we send (it takes no key)."""

    def test_nothing_is_sent_again_before_the_settle_time_and_the_late_one_is_adopted(self):
        held = self.folder / "before-commit"
        url = self.standin(f"before-commit=pause({held})")
        client = StandInClient(url, STANDIN_GIVES_UP_S, lambda: self.first_held(held))
        charge = effect("charge", keyed=False)
        request = {"amount": 500}
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            with self.assertRaises(effects.Unsettled):  # no answer, and nothing found yet
                charge.perform(ledger, "order-1:charge", request, client)
            self.assertEqual(ledger.get("order-1:charge").state, "unknown")
        self.first_held(held)  # the first request is held at the provider
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:  # a resume, in the settle time
            with self.assertRaises(effects.Unsettled):
                charge.perform(ledger, "order-1:charge", request, client)
            self.assertEqual(ledger.get("order-1:charge").state, "unknown")
        self.assertEqual(client.made(), [])  # nothing was sent again (a resend is not held)

        failpoints.unpause(held)  # the provider commits, late
        self.wait_until(lambda: handled(client.url) == 1, "the late commit")
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            done = charge.perform(ledger, "order-1:charge", request, client)
            history = [how for _, _, how in ledger.history("order-1:charge")]
        (made_once,) = client.made()
        self.assertEqual((done.how, done.answer["id"]), ("adopted", made_once["id"]))
        self.assertEqual(history[-1], "adopted by lookup")
        self.assertEqual(handled(client.url), 1)

    def test_in_progress_after_a_kill_mid_request_stays_unknown_and_the_first_answer_wins(self):
        # A keyed provider (the IETF Idempotency-Key draft): a retry while the key's first
        # request is still being processed gets 409 "in progress". The run is killed while its
        # request is held there; the resume meets 409: unknown (it may still be made), never
        # failed; once the provider has made it, the next resume gets the first answer.
        held = self.folder / "before-commit"
        url = self.standin(f"before-commit=pause({held})", keyed=True)
        client = StandInClient(url)
        reserve = effect("reserve", keyed=True)
        pid = os.fork()
        if pid == 0:  # a run whose request is at the provider, killed there
            try:
                with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
                    reserve.perform(ledger, "order-1:reserve", {"n": 1}, client)
            finally:
                os._exit(1)
        self.first_held(held)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            with self.assertRaises(effects.Unsettled) as stopped:
                reserve.perform(ledger, "order-1:reserve", {"n": 1}, client)
            self.assertIn("409", str(stopped.exception))
            self.assertEqual(ledger.get("order-1:reserve").state, "unknown")
            failpoints.unpause(held)  # the provider makes the held request
            self.wait_until(lambda: len(client.made()) == 1, "the held request to be made")
            done = reserve.perform(ledger, "order-1:reserve", {"n": 1}, client)
            self.assertEqual(ledger.get("order-1:reserve").state, "confirmed")
        (made_once,) = client.made()  # one, and the answer the key got first
        self.assertEqual((done.how, done.answer["id"]), ("adopted", made_once["id"]))

    def first_held(self, held):
        """Until the first request is held at the provider (it made the pause's file)."""
        self.wait_until(held.exists, "the first request to reach the provider")


class RefusalTest(ServiceTestCase):
    def test_a_409_for_the_key_with_another_body_stops_the_run_with_nothing_done(self):
        # Another client used the key first, for another body.
        post(self.url + "/tickets", {"title": "B"}, "op-1")
        refused = self.workflow("start", "--thread", "t1", "--operation", "op-1", "--title", "A")
        self.assertEqual(refused.returncode, exitcodes.EXIT_HTTP_ERROR, refused.stderr)
        self.assertEqual(len(refused.stderr.splitlines()), 1, refused.stderr)  # no traceback
        self.assertIn("refused", refused.stderr)
        self.assertNotIn("done", [e["event"] for e in events(refused)])
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            record = ledger.get("op-1")
            self.assertEqual(record.state, "failed")
            self.assertEqual(record.refusal["status"], 409)
            self.assertIsNone(ledger.receipt("op-1"))  # nothing recorded as done
        self.assertEqual([t["payload"] for t in self.tickets("op-1")], [{"title": "B"}])
        self.assertEqual(self.counted("key_conflicts"), 1)  # asked once, not again
        # Failed is final: a resume says so again and sends nothing.
        again = self.workflow("resume", "--thread", "t1")
        self.assertEqual(again.returncode, exitcodes.EXIT_HTTP_ERROR, again.stderr)
        self.assertIn("refused", again.stderr)
        self.assertEqual(self.counted("key_conflicts"), 1)


class TamperTest(ServiceTestCase):
    def test_a_receipt_changed_in_the_ledger_is_refused_and_nothing_is_sent(self):
        crashed = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-ack=kill"
        )
        self.assertEqual(crashed.returncode, -9, crashed.stderr)  # the receipt kept, not returned
        with sqlite3.connect(self.env["CHECKPOINT_DB"]) as db:  # someone edits the ledger
            db.execute("DROP TRIGGER receipts_are_kept")
            db.execute("UPDATE effect_receipts SET answer = ?", (json.dumps({"ticket_id": 999}),))
        db.close()

        resumed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(resumed.returncode, exitcodes.EXIT_LEDGER_DAMAGED, resumed.stderr)
        self.assertEqual(len(resumed.stderr.splitlines()), 1, resumed.stderr)
        self.assertIn("integrity", resumed.stderr)
        self.assertNotIn("done", [e["event"] for e in events(resumed)])
        self.assertEqual(len(self.tickets()), 1)
        self.assertEqual(self.counted("idempotent_replays"), 0)  # nothing sent for it


class WrongUrlTest(ServiceTestCase):
    def test_a_404_from_a_wrong_url_makes_nothing_and_the_fixed_resume_makes_one(self):
        right = self.env["API_URL"]
        self.env["API_URL"] = right + "/wrong"
        lost = self.workflow("start", "--thread", "t1", "--operation", "op-1")
        self.assertEqual(lost.returncode, exitcodes.EXIT_HTTP_ERROR, lost.stderr)
        self.assertIn({"event": "http_error", "status": 404}, strip_body(events(lost)))
        self.assertIn("the key is still free", lost.stderr)
        self.assertEqual(self.tickets(), [])
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            self.assertEqual(ledger.get("op-1").state, "released")

        self.env["API_URL"] = right
        fixed = self.workflow("resume", "--thread", "t1")
        self.assertEqual(fixed.returncode, 0, fixed.stderr)
        (ticket,) = self.tickets("op-1")
        self.assertEqual(events(fixed)[-1]["ticket_id"], ticket["ticket_id"])
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            self.assertEqual(ledger.get("op-1").state, "confirmed")


# helpers


def effect(name, keyed):
    """An effect at the stand-in provider: it takes our reference (the key) in the body and is
    looked up by it; keyed: it also honours the key (Idempotency-Key)."""
    return effects.Effect(
        name,
        send=lambda client, request, key: client.post(
            f"/{name}", {**request, "reference": key}, key if keyed else None
        ),
        lookup=lambda client, key: next(
            ({"id": t["id"], **t["body"]} for t in client.made(reference=key)), None
        ),
        external_id=lambda answer: answer["id"],
        not_sent=providers.IETF_ANSWERS.not_sent,  # what a provider's answers mean, by default
        refused=providers.IETF_ANSWERS.refused,
        keyed=keyed,
        settle_s=60.0,
    )


def post(url, body, key):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Idempotency-Key": key})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def strip_body(printed):
    return [{k: v for k, v in e.items() if k != "body"} for e in printed]


if __name__ == "__main__":
    unittest.main()
