"""Which command runs a saved thread: the ticket run, lab 13's saga, lab 19's outbox, or lab 10's
workers; and what a start on a thread that exists should do instead."""

from labs.contract import BRANCH

RESET_HINT = (
    "reset the lab: docker compose -p stateful-lab down -v --remove-orphans (natively: make reset)"
)


def exists_hint(saved):
    """What to do about a start of a thread that exists: a naive one sends no key, so its
    resume would repeat a request that may have taken effect."""
    reset = RESET_HINT
    values = saved.checkpoint["channel_values"] if saved else {}
    if values.get("mode") == "naive" and any(c.startswith(BRANCH) for c in values):
        return f"it sends no key (--mode naive), so a resume repeats its request; or {reset}"
    return f"resume it or pick a new --thread; or {reset}"


def owning_command_line(saved):
    """The line for a thread that another command runs (a CheckpointTuple), or None: lab 13's
    saga (its values hold seats), or a thread of labs/workers.py, which records no contract."""
    thread = saved.config["configurable"]["thread_id"]
    if is_saga(saved):
        return f"thread {thread!r} is a saga (lab 13): {saga_goes_on(saved)}"
    if is_outbox(saved):
        return f"thread {thread!r} is an outbox run (lab 19): outbox resume --thread {thread}"
    if "contract" not in saved.metadata:
        return (
            f"thread {thread!r} records no contract: labs/workers.py saves its threads so and runs "
            f"them from its queue (lab 10): labs/workers.py state --thread {thread}"
        )
    return None


def is_saga(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 13's: only its state holds seats."""
    return "seats" in saved.checkpoint["channel_values"]


def saga_goes_on(saved):
    """The saga command that goes on from a saved saga thread: a naive one waiting at its refund
    sends that refund without a key, so its resume refunds again if the first went through."""
    thread = saved.config["configurable"]["thread_id"]
    values = saved.checkpoint["channel_values"]
    if values.get("mode") == "naive" and f"{BRANCH}refund" in values:
        return (
            "its refund goes without a key (--mode naive), so saga resume --thread "
            f"{thread} refunds again if the first refund went through: look at saga refunds first"
        )
    return f"saga resume --thread {thread}"


def is_outbox(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 19's: only its state holds delivery."""
    return "delivery" in saved.checkpoint["channel_values"]
