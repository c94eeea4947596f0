"""Drill this starter's own graph: kill it just before each saver call, resume, count the tickets.

effectdrill (copied next to workflow.py) runs workflow.build_graph's graph against the real
receiver.py, kills a forked run with SIGKILL before each `put` and `put_writes` of a clean run, in
every durability mode, resumes it from the same SQLite file and counts that run's tickets. Change
the graph (a new node, a new effect, a key made in the wrong place) and this test says where a
crash now repeats an effect.
"""

import contextlib
import io
import unittest

import effectdrill
import effects
import workflow
from tests.service import ServiceTestCase


class DrillTest(ServiceTestCase):
    def test_no_crash_point_in_any_durability_mode_repeats_or_loses_a_ticket(self):
        client = workflow.TicketClient(self.url)

        def graph():
            return workflow.build_graph(None)  # the drill gives it a saver of its own

        def observe(thread):
            """This run's tickets: the drill puts the thread id into the run's operation id
            and title, and a ticket carries it in its key or its title."""
            tickets = self.tickets()
            return {"ticket": sum(thread in f"{t['key']} {t['payload']}" for t in tickets)}

        with contextlib.redirect_stdout(io.StringIO()):  # the nodes' event lines
            report = effectdrill.drill(
                graph,
                {"operation_id": "{thread}", "title": "{thread}"},
                observe,
                durability="all",
                context=workflow.Context(client, effects.Ledger(self.env["CHECKPOINT_DB"])),
            )
        self.assertEqual(set(report.clean), {"sync", "async", "exit"})
        # A clean run makes one ticket for each effect workflow.py declares.
        each = {"ticket": len(effects.declared(vars(workflow)))}
        self.assertTrue(all(counts == each for counts in report.clean.values()), report.clean)
        self.assertGreater(len(report.rows), len(report.clean))  # several points per mode
        report.assert_clean()


if __name__ == "__main__":
    unittest.main()
