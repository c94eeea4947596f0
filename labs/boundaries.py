"""Labs 04, 08 and 09: where a run can stop. --durability (04: when LangGraph saves a step),
--crash-at step-boundary (08: the result computed, not yet saved) and --term-at (09: SIGTERM,
as a deploy sends it: the run drains at the next step boundary, exit 75, and resume goes on).
"""

import threading

import workflow
from failpoints import fail

TERM_POINTS = ("after-prepare", "after-ack")  # where --term-at sends SIGTERM (lab 09)
DURABILITIES = ("sync", "async", "exit")  # LangGraph's durability modes (lab 04); sync: the core's
POINTS = (*workflow.POINTS, "step-boundary")  # the failpoints a ticket run knows


def step_boundary_saver():
    """A SqliteSaver that passes failpoint step-boundary as create_ticket's result is about to
    be saved (lab 08): with it set to kill, the node has returned and its result is on no disk.

    LangGraph 1.2.24 saves a finished node with two background writes that have no order between
    them (langgraph#8039): the node's writes (put_writes) and the next checkpoint (put). Whichever
    comes first with the ticket_id passes the point; the other waits behind it for the kill.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    dying = threading.Lock()

    def step_boundary():
        with dying:
            fail("step-boundary")

    class StepBoundarySaver(SqliteSaver):
        def put_writes(self, config, writes, task_id, task_path=""):
            if any(channel == "ticket_id" for channel, _ in writes):
                step_boundary()
            return super().put_writes(config, writes, task_id, task_path)

        def put(self, config, checkpoint, metadata, new_versions):
            if "ticket_id" in checkpoint["channel_values"]:
                step_boundary()
            return super().put(config, checkpoint, metadata, new_versions)

    return StepBoundarySaver
