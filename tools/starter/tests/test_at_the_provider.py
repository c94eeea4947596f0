"""The window the provider holds: a run killed (or stopped with Ctrl-C) while its request is
still at the provider, read and not yet made, as a slow provider or a busy one holds it.

    python -m unittest tests.test_at_the_provider

Every provider workflow.py declares holds the first request of each key it reads (a failpoint
before its commit: api.py's before-commit, the stand-in's), whatever effects you declare.
The run is stopped there (SIGKILL, or Ctrl-C): its row stays open, never released or failed.
Then the provider makes it, and the resume goes on: adopted by a lookup, answered under the key,
or settled by a person who looked. At the end each provider holds one thing per key, the one
its receipt names. (A resume while the provider still holds the request, which a keyed
provider answers "in progress": tests/test_failures.py.)
"""

import signal
import time
import unittest

import effects
import exitcodes
import failpoints
import workflow
from tests import test_crash_window as crash
from tests.service import (
    RUN_TIMEOUT_S,
    ServiceTestCase,
    counters,
    events,
    handled,
    made_by_receiver,
)

ALLOWED = {0, exitcodes.EXIT_UNSETTLED}  # done, or stopped for a lookup, the key, or a person


class AtTheProviderTest(ServiceTestCase):
    held_at_providers = True

    def test_every_effect_killed_while_its_request_is_at_the_provider_is_made_once(self):
        killed = self.walk("order-1", signal.SIGKILL, -signal.SIGKILL)
        crash.CrashWindowTest.one_effect_per_key_at_each_provider(self, killed)

    def test_ctrl_c_while_the_request_is_at_the_provider_leaves_it_open_not_released(self):
        killed = self.walk("order-1", signal.SIGINT, exitcodes.EXIT_INTERRUPTED)
        crash.CrashWindowTest.one_effect_per_key_at_each_provider(self, killed)

    def test_a_resume_while_the_provider_holds_the_request_sends_it_again_under_its_key(self):
        # api.py honours the key (API is declared keyed): the resume of a run killed
        # while its ticket is at the provider finds nothing yet, sends again under the key,
        # and gets the one ticket; the held first request then finds the key made.
        for name in self.urls:  # only the ticket's provider holds: the others let all pass
            failpoints.unpause(self.held(name))
        run, _, _ = self.workflow_started("start", "--thread", "t", "--operation", "k")
        self.wait_until(lambda: crash.waiting(self.held("API")), "the request at the provider")
        run.kill()
        run.wait()
        resumed = self.workflow("resume", "--thread", "t")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            history = [how for _, _, how in ledger.history("k")]
        self.assertIn("sent again: the provider honours the key", history)
        answered = answered_by_receiver(self.url)
        failpoints.unpause(self.held("API"))  # the first request: its key made already
        self.wait_until(lambda: answered_by_receiver(self.url) > answered, "the held request")
        self.assertEqual(len(self.tickets("k")), 1)

    def test_a_persons_word_before_the_settle_time_is_refused_and_names_when(self):
        # The run is killed while its request is at the provider: nothing is there yet, and
        # it may still be made. A person who looks now and says --not-sent would have it sent
        # twice: refused until the provider's settle time since the send has passed.
        for name in self.urls:  # only the ticket's provider holds: the others let all pass
            failpoints.unpause(self.held(name))
        run, _, _ = self.workflow_started("start", "--thread", "t", "--operation", "k")
        self.wait_until(lambda: crash.waiting(self.held("API")), "the request at the provider")
        run.kill()
        run.wait()
        early = self.workflow("reconcile", "--not-sent", "k")
        asked_by = time.time()  # reconcile looked at the clock before this
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            record, sent_at = ledger.get("k"), ledger.row("k")["sent_at"]
        if asked_by - sent_at < workflow.ticket.settled_after_s:  # measured, not assumed
            self.assertEqual(early.returncode, exitcodes.EXIT_THREAD, early.stderr)
            self.assertIn("try again in", early.stderr)
            self.assertIn(record.state, effects.OPEN)
        failpoints.unpause(self.held("API"))  # it is made; every later request passes
        done = self.workflow("resume", "--thread", "t")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(len(self.tickets("k")), 1)

    # helpers

    def walk(self, order, sent, stopped_code):
        """Run order until it finishes: each run held at a provider is stopped there (the signal
        sent), the provider lets the request go, and the run is resumed; one that waits for a
        person (exit 6) is settled as a person does. Returns the keys stopped."""
        names = ["API", *self.urls]
        command, stopped = ["start", "--thread", order, "--operation", order], []
        for attempt in range(6 * len(effects.declared(vars(workflow))) + 4):  # a hang guard
            process, out, err = self.workflow_started(*command, name=f"{order}-{attempt}")
            command = ["resume", "--thread", order]

            def settled_or_held(process=process):
                return process.poll() is not None or any(crash.waiting(self.held(n)) for n in names)

            self.wait_until(settled_or_held, "the run to end or be held", RUN_TIMEOUT_S)
            if process.poll() is None:  # held at a provider: its request is there
                key = self.open_keys()[-1]
                self.assertNotIn(key, stopped, "a key held twice: it was sent again")
                process.send_signal(sent)
                process.wait(RUN_TIMEOUT_S)
                self.assertEqual(process.returncode, stopped_code, err.read_text())
                stopped.append(key)
                state = self.state_of(key)
                self.assertIn(state, effects.OPEN, f"{key}: {state} while at the provider")
                self.let_go(names)  # the provider makes it, after its sender is gone
                continue
            code, printed = process.returncode, events(out.read_text())
            self.assertIn(code, ALLOWED, err.read_text())  # never failed, never a traceback
            if code == 0:
                self.assertEqual(printed[-1]["event"], "done", printed)
                return stopped
            self.settle_as_a_person(err)
        self.fail(f"the run did not finish after {attempt + 1} runs; stopped at {stopped}")

    def let_go(self, names):
        """Let every held request go on, and wait until each provider has answered it (made it,
        or found its key made); re-armed for the next request. How many were held."""
        held = [n for n in names if crash.waiting(self.held(n))]
        before = self.handled()
        for name in held:
            failpoints.unpause(self.held(name))
        self.wait_until(lambda: self.handled() >= before + len(held), "the held requests")
        for name in held:
            self.held(name).unlink()
        return len(held)

    def handled(self):
        """Every POST the providers have answered: api.py's by its counters (made, or
        answered from its key), the stand-ins' by their own count."""
        receivers = [self.url] + [
            u for u, count in self.others.values() if count is made_by_receiver
        ]
        total = sum(answered_by_receiver(url) for url in receivers)
        return total + sum(handled(u) for u in self.urls.values() if u not in receivers)

    def open_keys(self):
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            rows = ledger.sql("SELECT key, state FROM effects ORDER BY rowid").fetchall()
        return [key for key, state in rows if state in effects.OPEN]

    def state_of(self, key):
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            return ledger.get(key).state

    settle_as_a_person = crash.CrashWindowTest.settle_as_a_person


def answered_by_receiver(url):
    """The keyed POSTs api.py has answered: made, replayed from the key, or refused."""
    kinds = ("_created", "idempotent_replays", "key_conflicts")
    return sum(n for name, n in counters(url).items() if name.endswith(kinds))


if __name__ == "__main__":
    unittest.main()
