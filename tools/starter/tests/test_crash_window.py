"""The guarantee, checked with real processes: a run that dies in an effect's crash window and is
resumed leaves exactly one of that effect, and a key is never reused for another request.

    python -m unittest            (from the starter's folder, with requirements.txt installed)

Each test starts api.py on a free loopback port with its data in a temporary folder and runs
workflow.py as a real subprocess, with FAILPOINTS opening the window for real (see failpoints.py).

The first three tests are told nothing about the graph's effects: they walk the windows of
every effect workflow.py performs, whatever effects you declare there, killing the run (SIGKILL)
once in each: after the intent was recorded and before the request left (after-intent), after
the provider answered and before the ledger's receipt (after-send), or after the receipt and
before the node returned (after-receipt), resuming after each kill until a run finishes. Then
each provider is asked, through the effect's own declaration (its lookup), what it holds under
each key: one thing each, the one the receipt names, and nothing else. (While the request is at
the provider: tests/test_at_the_provider.py.)
"""

import contextlib
import functools
import io
import signal
import time
import unittest

import effects
import exitcodes
import failpoints
import workflow
from tests.service import RUN_TIMEOUT_S, ServiceTestCase, context, events, made

OPEN = effects.OPEN  # requested, unknown: a request may be out there
EXIT_UNSETTLED = exitcodes.EXIT_UNSETTLED  # a run stopped for a person: an effect without lookup


class CrashWindowTest(ServiceTestCase):
    def test_every_effect_killed_after_its_answer_is_adopted_by_its_key_not_sent_again(self):
        # Killed in the window of the first effect the ledger holds no receipt of. On the resume
        # that effect's key is looked up (adopted, not sent) and the next effect is sent: killed
        # in its window. And so on, until a run has no effect left to send and finishes. Then
        # a second order, walked the same way: each order's keys get things of their own (a
        # lookup that ignored the key would adopt the first order's).
        killed = self.walk("after-send", "order-1")[0] + self.walk("after-send", "order-2")[0]
        performed = self.one_effect_per_key_at_each_provider(killed)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            for record in performed:
                effect = effects.declared(vars(workflow))[record.effect]
                if effect.lookup is not None:  # found under its key by the next attempt
                    self.assertEqual(
                        ledger.history(record.key),
                        [
                            (None, "requested", "claimed"),
                            ("requested", "confirmed", "adopted by lookup"),
                        ],
                    )

    def test_every_effect_killed_after_its_receipt_is_replayed_from_it_not_sent_again(self):
        # Killed once its receipt is in the ledger and before its node returned (the ledger's
        # own point, after-receipt, which every effect passes once it has kept a new receipt):
        # the resume re-runs the node, which finds the receipt and sends nothing (a replay,
        # which does not pass the point again), then sends the next effect: killed.
        killed, replays = self.walk("after-receipt", "order-1")
        self.assertEqual(replays, 0)  # a replay keeps no new receipt: it never reaches the point
        performed = self.one_effect_per_key_at_each_provider(killed)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            for record in performed:
                self.assertEqual(
                    ledger.history(record.key),
                    [(None, "requested", "claimed"), ("requested", "confirmed", "answered")],
                )

    def test_every_effect_killed_before_its_request_left_is_sent_once_on_resume(self):
        # Killed once its intent is in the ledger and before its request left (after-intent,
        # the ledger's own point, met before every send): the provider holds nothing. The
        # resume cannot tell that from a request that left and sends only on evidence: under
        # the key to a keyed provider; else, once the provider's settle time is over, a person
        # who looked and found nothing says so (reconcile --not-sent) and the next resume
        # sends. Each effect is sent once, by a resume, and answered.
        killed = self.walk_before_the_request("order-1")
        performed = self.one_effect_per_key_at_each_provider(killed)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            for record in performed:
                history = ledger.history(record.key)
                self.assertEqual(history[0], (None, "requested", "claimed"))
                self.assertEqual(history[-1], ("requested", "confirmed", "answered"), history)

    def test_a_sigterm_drains_at_the_step_boundary_then_resume_leaves_one_ticket(self):
        drained = self.workflow(
            "start", "--thread", "t1", "--operation", "op-1", fail="after-prepare=term"
        )
        self.assertEqual(drained.returncode, exitcodes.EXIT_DRAINED, drained.stderr)
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
        self.assertEqual(code, exitcodes.EXIT_HTTP_ERROR, err)
        self.assertIn("claimed for another ticket request", err)
        # And the receiver refuses it too, sent without the ledger (workflow.py post).
        code, printed, err = run("post", "--operation", "op-1", "--title", "B")
        self.assertEqual(code, exitcodes.EXIT_HTTP_ERROR, err)
        self.assertEqual((printed[-1]["event"], printed[-1]["status"]), ("http_error", 409))
        self.assertIn("Idempotency-Key", printed[-1]["body"]["error"])

        code, _, err = run("start", "--thread", "t3", "--operation", "op-2", "--title", "B")
        self.assertEqual(code, 0, err)
        self.assertEqual([t["payload"] for t in self.tickets("op-1")], [{"title": "A"}])
        self.assertEqual([t["payload"] for t in self.tickets("op-2")], [{"title": "B"}])

    def test_a_second_process_on_the_key_waits_while_the_first_holds_it_and_not_after(self):
        # Two processes at one key: the first has the provider's answer and not yet its
        # receipt (held at after-send). While its lease holds, the second meets InFlight (exit
        # 4) and sends nothing; once the lease has run out (a performer hung past every
        # timeout) the second goes on, and the first's late answer finds the receipt: one
        # ticket, one receipt, no extra, and both runs finish.
        self.env["LEDGER_LEASE_S"] = "4"
        at = self.folder / "first-after-send"
        first, _, first_err = self.workflow_started(
            "start", "--thread", "t", "--operation", "k", fail=f"after-send=pause({at})"
        )
        self.wait_until(lambda: waiting(at), "the first run to have its answer")
        lease_until = self.lease_until("k")  # the first's
        second = self.workflow("resume", "--thread", "t")
        if time.time() < lease_until:  # it asked while the lease held (measured, not assumed)
            self.assertEqual(second.returncode, exitcodes.EXIT_THREAD, second.stderr)
            self.assertIn("being performed by another live process", second.stderr)
        self.wait_until(lambda: time.time() > lease_until, "the first's lease to run out")
        second = self.workflow("resume", "--thread", "t")
        self.assertEqual(second.returncode, 0, second.stderr)
        failpoints.unpause(at)  # the first's answer comes in late
        first.wait(RUN_TIMEOUT_S)
        self.assertEqual(first.returncode, 0, first_err.read_text())
        self.assertEqual(len(self.tickets("k")), 1)
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            self.assertEqual((ledger.get("k").state, ledger.extras()), ("confirmed", []))

    # helpers

    def effect_of(self, key):
        """The name of the effect the ledger holds key for."""
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            return ledger.get(key).effect

    def lease_until(self, key):
        """When the lease of key's performer ends (time.time())."""
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            return ledger.row(key)["lease_until"]

    def walk(self, window, order):
        """Run a new thread for order (its operation id), killed in `window` of each effect
        once, resumed after each kill, until a run finishes: ([the killed keys, in order], the
        replays met and skipped).

        The run is held at the point (a pause) and killed there by this test. Only an arrival
        that follows a send in the same process is a window: an arrival with nothing sent (a
        replay: a node's own point such as after-ack, met again by the re-run node) is counted
        and let go, since a kill there would be met by every resume for ever. The send is seen
        as a pause at after-send, which also lets this test re-arm the point in time."""
        command, killed, replays = ["start", "--thread", order, "--operation", order], [], 0
        resent = False  # the resume sends the killed key again (keyed, no lookup)
        for attempt in range(3 * len(effects.declared(vars(workflow))) + 2):  # a hang guard
            at = self.folder / f"{order}-{window}-{attempt}"
            sent = self.folder / f"{order}-after-send-{attempt}"
            kept = self.folder / f"{order}-after-receipt-{attempt}"
            spec = f"after-send=pause({sent})" + (
                f";{window}=pause({at})" * (window != "after-send")
            )
            if resent and window == "after-send":  # stopped once its resend has its receipt
                spec += f";after-receipt=pause({kept})"
            if window == "after-send":
                at = sent
            before = self.ledger_states()
            process, out, err = self.workflow_started(
                *command, fail=spec, name=f"{order}-{attempt}"
            )
            seen_send = window == "after-send"
            while True:
                held = functools.partial(stopped, process, at, None if seen_send else sent)
                self.wait_until(held, f"the run to reach {window} or end", RUN_TIMEOUT_S)
                if process.poll() is not None:
                    break
                if waiting(at) and seen_send:  # in the window: a kill, as a crash would
                    now = self.ledger_states()  # in the order the keys were claimed
                    moved = [k for k in now if now[k] != before.get(k)]
                    self.assertTrue(
                        moved,
                        "held after a send, and no ledger row moved: a request it did not record",
                    )
                    if moved[-1] in killed:  # sent again under its key (keyed, no lookup),
                        failpoints.unpause(at)  # killed in this window once already: let it
                        receipt = functools.partial(stopped, process, kept)
                        self.wait_until(receipt, "its receipt")  # and stop the run there
                        process.kill()
                        process.wait()
                        resent = False
                        break
                    process.kill()
                    process.wait()
                    killed.append(moved[-1])  # the newest
                    declared = effects.declared(vars(workflow))[self.effect_of(moved[-1])]
                    resent = declared.keyed and declared.lookup is None
                    break
                if waiting(at):  # a replay (or an adoption): nothing sent, not a window
                    replays += 1
                    failpoints.unpause(at)
                    continue
                seen_send = True  # held after a send: the next arrival at `at` is a window
                at.unlink(missing_ok=True)  # re-armed: passed by the replay, if any
                failpoints.unpause(sent)
            printed = events(out.read_text())
            if process.returncode == 0:
                self.assertEqual(printed[-1]["event"], "done", printed)
                return killed, replays
            if process.returncode == EXIT_UNSETTLED:  # an effect without lookup: a person
                self.settle_as_a_person(err)
            else:
                self.assertEqual(process.returncode, -signal.SIGKILL, err.read_text())
            command = ["resume", "--thread", order]
        self.fail(f"the run did not finish after {attempt + 1} runs; killed {killed}")

    def walk_before_the_request(self, order):
        """Run a new thread for order, killed at after-intent of each effect once (its intent
        committed, its request not sent), resumed after each kill (and settled as a person says
        where a resume stops for one), until a run finishes: [the killed keys, in order].

        An arrival at after-intent for a key killed there already is its resend: let go, and
        the point re-armed once the run is held after that send (after-send), so the next
        effect's arrival is held too."""
        command, killed = ["start", "--thread", order, "--operation", order], []
        for attempt in range(3 * len(effects.declared(vars(workflow))) + 2):  # a hang guard
            at = self.folder / f"{order}-after-intent-{attempt}"
            sent = self.folder / f"{order}-after-send-{attempt}"
            process, out, err = self.workflow_started(
                *command, fail=f"after-intent=pause({at});after-send=pause({sent})",
                name=f"{order}-intent-{attempt}",
            )  # fmt: skip
            while True:
                held = functools.partial(stopped, process, at, sent)
                self.wait_until(held, "the run to reach after-intent or end", RUN_TIMEOUT_S)
                if process.poll() is not None:
                    break
                if waiting(sent):  # after a resend: re-arm after-intent, then let it go on
                    at.unlink()
                    failpoints.unpause(sent)
                    continue
                (key,) = [k for k, (state, _) in self.ledger_states().items() if state in OPEN]
                if key in killed:  # its resend, after the kill: let it go
                    failpoints.unpause(at)
                    continue
                confirmed = self.confirmed_keys()
                self.assertEqual(
                    self.made_at_providers(),
                    len(confirmed),
                    f"{key}: killed before its request left, and a provider holds it",
                )
                process.kill()
                process.wait()
                killed.append(key)
                break
            if process.returncode == 0:
                self.assertEqual(events(out.read_text())[-1]["event"], "done")
                return killed
            if process.returncode == EXIT_UNSETTLED:  # no evidence it was not sent: a person
                self.say_not_sent_as_a_person(err)
            else:
                self.assertEqual(process.returncode, -signal.SIGKILL, err.read_text())
            command = ["resume", "--thread", order]
        self.fail(f"the run did not finish after {attempt + 1} runs; killed {killed}")

    def say_not_sent_as_a_person(self, err):
        """A resume stopped (exit 6) at an effect killed before its request left: a person asks
        the providers (their own counts: nothing beyond what the ledger confirmed) and says it
        was not sent, taken once the provider's settle time is over (--wait)."""
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            (record,) = ledger.unsettled()
        self.assertEqual(self.made_at_providers(), len(self.confirmed_keys()), err.read_text())
        said = self.workflow("reconcile", "--not-sent", record.key, "--wait")
        self.assertEqual(said.returncode, 0, said.stderr)

    def confirmed_keys(self):
        return [k for k, (state, _) in self.ledger_states().items() if state == "confirmed"]

    def ledger_states(self):
        """{key: (state, transitions so far)} of the ledger's rows, in the order claimed."""
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            rows = ledger.sql("SELECT key, state FROM effects ORDER BY rowid").fetchall()
            return {key: (state, len(ledger.history(key))) for key, state in rows}

    def one_effect_per_key_at_each_provider(self, killed):
        """Every effect declared was performed and killed once in its window; each provider
        holds under each key the one thing its receipt names, and nothing else was made.
        Returns the ledger's records."""
        declared = effects.declared(vars(workflow))
        clients = context(self.env)  # each effect's provider's client, as main() makes them
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            keys = [key for (key,) in ledger.sql("SELECT key FROM effects")]
            performed = [ledger.get(key) for key in keys]
        self.assertEqual({record.effect for record in performed}, set(declared))
        self.assertEqual(len(set(killed)), len(killed))  # no key killed twice in its window
        self.assertEqual(sorted(killed), sorted(keys))
        for record in performed:
            self.assertEqual(record.state, "confirmed", record)
            effect = declared[record.effect]
            if effect.lookup is not None:  # asked as the effect asks its provider
                found = effect.lookup(clients.client_for(effect), record.key)
                self.assertIsNotNone(found, f"{record.effect} {record.key!r}: nothing found")
                held, kept = effect.external_id(found), effect.external_id(record.answer)
                self.assertEqual(str(held), str(kept), record)
            else:  # no lookup: its stand-in provider's own records are the evidence
                self.assertIn(effect.provider_name, self.urls, f"{record.effect}")
        # Each key's receipt names a thing of its own, not another key's.
        named = [(r.effect, str(declared[r.effect].external_id(r.answer))) for r in performed]
        self.assertEqual(len(set(named)), len(named), f"two keys name one thing: {named}")
        # Nothing made beyond one per key: the providers' own counts of what they made.
        self.assertEqual(self.made_at_providers(), len(performed))
        return performed

    def settle_as_a_person(self, err):
        """A resume stopped (exit 6) at an effect whose provider has no lookup and does not
        honour its key: what a person does, who asks the provider (here the stand-in, by its own
        records) and tells the ledger what it made (reconcile --confirmed KEY=ID)."""
        with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
            (record,) = ledger.unsettled()
        effect = effects.declared(vars(workflow))[record.effect]
        self.assertIsNone(effect.lookup, err.read_text())
        url = self.urls.get(effect.provider_name)
        self.assertIsNotNone(url, f"{record.effect}: no stand-in provider to ask")
        thing = made(url)[-1]  # the newest: the run was killed just after it
        # --wait: a person's word is taken once the provider's settle time is over
        said = f"{record.key}={thing['id']}"
        settled = self.workflow("reconcile", "--confirmed", said, "--wait")
        self.assertEqual(settled.returncode, 0, settled.stderr)


def stopped(process, at, sent=None):
    """The run ended, or it is held at `at`, or (sent given) at the pause after a send."""
    return process.poll() is not None or waiting(at) or (sent is not None and waiting(sent))


def waiting(path):
    """A run is held at the pause whose file is path (it made it), not yet told to go."""
    try:
        return path.read_text() != failpoints.GO
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    unittest.main()
