"""Which command runs a saved thread: the ticket run, lab 13's saga, lab 19's outbox, or lab 10's
workers; what a start on a thread that exists should do instead; and how the lessons' programs
are typed, natively and through Docker, for the hints that name them (exitcodes.Typed)."""

import contextlib
import shlex

import checkpoints
import effects
import failpoints
from exitcodes import EXIT_DRAINED, Typed, command, emit
from labs.contract import BRANCH

COMPOSE = "docker compose -p stateful-lab"  # the guides' project
RESET_HINT = f"reset the lab: {COMPOSE} down -v --remove-orphans (natively: make reset)"


def typed_as(prog, service, environ=None):
    """How `python -m PROG` is typed, and its Docker form: compose.yaml's SERVICE runs it (the
    workflow service runs python -m labs, worker python -m labs.workers, relay labs.relay).
    environ: the settings a hint's command needs again (LAB_GRAPH_VERSION=2)."""
    native = "".join(f"{k}={shlex.quote(v)} " for k, v in (environ or {}).items())
    docker = "".join(f"-e {k}={shlex.quote(v)} " for k, v in (environ or {}).items())
    return Typed(f"{native}python -m {prog}", f"{COMPOSE} run --rm {docker}{service}")


LABS = typed_as("labs", "workflow")  # the lessons' CLI (labs/cli.py sets its own, with the graph)
WORKERS = typed_as("labs.workers", "worker")  # lab 10's workers (labs/workers.py's parser)
RELAY = typed_as("labs.relay", "relay")  # lab 19's relay


def thread_words(words, thread):
    """WORDS --thread THREAD, the thread quoted for a shell."""
    return f"{words} --thread {shlex.quote(thread)}"


def exists_hint(saved):
    """What to do about a start of a thread that exists: a naive one sends no key, so its
    resume would repeat a request that may have taken effect."""
    reset = RESET_HINT
    values = saved.checkpoint["channel_values"] if saved else {}
    if values.get("mode") == "naive" and any(c.startswith(BRANCH) for c in values):
        return f"it sends no key (--mode naive), so a resume repeats its request; or {reset}"
    thread = saved.config["configurable"]["thread_id"] if saved else None
    resume = f": {command(thread_words('resume', thread))};" if thread else ""
    return f"resume it{resume} or pick a new --thread; or {reset}"


def owning_command_line(saved):
    """The line for a thread that another command runs (a CheckpointTuple), or None: lab 13's
    saga (its values hold seats), lab 19's outbox run, a thread of labs/workers.py (its
    checkpoints name the job), or one the core's workflow.py saved (no contract recorded)."""
    thread = saved.config["configurable"]["thread_id"]
    if is_saga(saved):
        return f"thread {thread!r} is a saga (lab 13): {saga_resume_line(saved)}"
    if is_outbox(saved):
        return (
            f"thread {thread!r} is an outbox run (lab 19): "
            f"{command(thread_words('outbox resume', thread))}"
        )
    if WORKER_JOB in saved.metadata:
        return (
            f"thread {thread!r} records no contract: labs/workers.py saves its threads so and runs "
            f"them from its queue (lab 10): {WORKERS(thread_words('state', thread))}"
        )
    if "contract" not in saved.metadata:
        return (
            f"thread {thread!r} records no contract: the core's workflow.py saved it, and runs "
            f"it: {Typed.of('workflow.py')(thread_words('resume', thread))}"
        )
    return None


WORKER_JOB = "worker_job"  # in the metadata of each checkpoint labs/workers.py's runs save


def own_command(values, verb, thread):
    """VERB (resume, state) --thread THREAD as the lesson whose thread it is types it, from its
    saved values: lab 13's saga, lab 19's outbox run, else a ticket run's."""
    kind = "saga " if "seats" in values else "outbox " if "delivery" in values else ""
    return command(thread_words(f"{kind}{verb}", thread))


def is_saga(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 13's: only its state holds seats."""
    return "seats" in saved.checkpoint["channel_values"]


def saga_resume_line(saved):
    """The saga command that goes on from a saved saga thread: a naive one waiting at an undo (a
    release, a refund) sends it without a key, so its resume undoes again if the first went
    through."""
    thread = saved.config["configurable"]["thread_id"]
    values = saved.checkpoint["channel_values"]
    if undo := naive_undo(values):
        again = thread_words("saga resume", thread)
        return (
            f"its {undo} goes without a key (--mode naive), so {again}"
            f" {undo}s again if the first {undo} went through: look at the {undo}s first, "
            f"{command(f'saga {undo}s')}"
        )
    return command(thread_words("saga resume", thread))


def naive_undo(values):
    """The undo ("release", "refund") a naive saga's saved values wait at: sent without a key."""
    waits = [u for u in ("release", "refund") if f"{BRANCH}{u}" in values]
    return waits[0] if values.get("mode") == "naive" and waits else None


def look_first(values):
    """The listing to look at before a resume that would send a request again without a key
    (hints.resume_or_warning), from a lab thread's saved values: a naive ticket run's
    `tickets`; a naive saga waiting at an undo, its `saga releases` or `saga refunds` (its
    other steps are keyed); None where the resume is safe."""
    if "seats" in values:  # a saga (is_saga)
        return f"saga {undo}s" if (undo := naive_undo(values)) else None
    return "tickets" if values.get("mode") == "naive" else None


def is_outbox(saved):
    """Whether a saved thread (a CheckpointTuple) is lab 19's: only its state holds delivery."""
    return "delivery" in saved.checkpoint["channel_values"]


@contextlib.contextmanager
def lesson_run(args, settings):
    """A lesson graph's run (the saga, the outbox): --crash-at's kill armed for it, the
    checkpointer and the ledger open. -> (saver, ledger)."""
    points = {args.crash_at: "kill"} if args.crash_at else {}
    with (
        failpoints.scoped(points),
        checkpoints.open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db) as ledger,
    ):
        yield saver, ledger


def run_ended(final):
    """A lesson run's exit code: drained on SIGTERM (its final state None), or done."""
    if final is None:
        return EXIT_DRAINED
    emit("done", **final)
    return 0
