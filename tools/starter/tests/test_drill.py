"""Drill this starter's own graph: kill it just before each saver call, resume, count the effects.

effectdrill (copied next to workflow.py) runs workflow.build_graph's graph against the real
api.py, kills a forked run with SIGKILL before each `put` and `put_writes` of a clean run, in
every durability mode, resumes it from the same SQLite file and counts that run's effects, each
declared effect by its name, asked of its provider through its declaration. Change the graph (a
new node, a new effect, a key made in the wrong place) and this test says where a crash now
repeats an effect.
"""

import contextlib
import io
import unittest

import effectdrill
import effects
import workflow
from tests.service import ServiceTestCase, context


class DrillTest(ServiceTestCase):
    def test_no_crash_point_in_any_durability_mode_repeats_or_loses_an_effect(self):
        declared = effects.declared(vars(workflow))
        run = context(self.env, effects.Ledger(self.env["CHECKPOINT_DB"]))  # as main() makes it

        def graph():
            return workflow.build_graph(None)  # the drill gives it a saver of its own

        def observe(thread):
            """This run's effects, {name: how many}: the drill puts the thread id into the
            run's operation id and title, so each key or request of this run carries it. Each
            one the ledger has is asked of its provider by its effect's lookup (counted if the
            provider holds it), or, for a provider without one, counted by its receipt."""
            counts = dict.fromkeys(declared, 0)
            with effects.Ledger(self.env["CHECKPOINT_DB"]) as ledger:
                rows = ledger.sql("SELECT key, effect, request, state FROM effects").fetchall()
            for key, name, request, state in rows:
                if thread in key or thread in request:
                    effect = declared[name]
                    if effect.lookup is None:
                        counts[name] += state == "confirmed"
                    else:
                        counts[name] += effect.lookup(run.client_for(effect), key) is not None
            return counts

        with contextlib.redirect_stdout(io.StringIO()):  # the nodes' event lines
            report = effectdrill.drill(
                graph,
                {"operation_id": "{thread}", "title": "{thread}"},
                observe,
                durability="all",
                context=run,
            )
        self.assertEqual(set(report.clean), {"sync", "async", "exit"})
        # A clean run makes one of each effect workflow.py declares.
        each = dict.fromkeys(declared, 1)
        self.assertTrue(all(counts == each for counts in report.clean.values()), report.clean)
        self.assertGreater(len(report.rows), len(report.clean))  # several points per mode
        report.assert_clean()


if __name__ == "__main__":
    unittest.main()
