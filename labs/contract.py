"""Lab 12: the contract a run is saved under, and `migrate`. LAB_GRAPH_VERSION picks the deployed
graph: 1, or 2, where create_ticket is renamed open_ticket (EFFECT_NODE, RENAMES); LAB_KEY_VERSION
how the ticket's node derives its key: 1, or 2 (KEY_DERIVATIONS).
"""

import hashlib
import json
import shlex

import checkpoints
from exitcodes import EXIT_THREAD, UserError, command, emit

# --- lab 12: the contract a run is saved under, and migrate -------------------------------
#
# Each checkpoint records the run's contract (the code's version, the graph's shape and the key
# derivation's version): `resume` under another refuses (exit 65, EXIT_CONTRACT), and `migrate`
# moves a thread to this one, explicitly. The core (workflow.py) records none: its starter has one
# graph.

VERSION = "1"  # the code's; bump it for a change that saved threads must not meet silently
BRANCH = "branch:to:"  # the channel that sends a run to a node (LangGraph's graph/state.py)
INTERRUPT = "__interrupt__"  # the write of a node waiting in interrupt() (_internal/_constants.py)
EXIT_CONTRACT = 65  # resume of a thread saved under another contract: migrate it (EX_DATAERR)

EFFECT_NODE = {"1": "create_ticket", "2": "open_ticket"}  # LAB_GRAPH_VERSION: the effect's name
RENAMES = {"2": {"create_ticket": "open_ticket"}}  # what migrate maps a saved next through

# How the ticket's node derives the key it sends, by version (LAB_KEY_VERSION). Derived in the
# node, a key is derived again by the code that resumes the node: a thread saved under one
# version and resumed under another would send a new key, which neither the receiver nor the
# ledger has seen. A thread's `key_version` (written by migrate) pins the version it keeps.
KEY_DERIVATIONS = {
    "1": lambda state: state["key"],  # prepare's key, as it saved it
    "2": lambda state: f"{state['key']}:ticket",  # one key per effect of the operation
}
KEY_VERSION = "key_version"  # the state's field that pins a thread's derivation


def contract(graph, version=None, keys="1"):
    """What a run's checkpoints are made under: the code's version (VERSION unless given), the
    graph's shape, and the version of the ticket node's key derivation (keys: KEY_DERIVATIONS).
    A state schema's version would go here too (` state:N`), bumped when a field's meaning
    changes, with a migrate that rewrites the saved values."""
    shape = graph.get_graph()
    edges = sorted([edge.source, edge.target, edge.conditional] for edge in shape.edges)
    digest = hashlib.sha256(json.dumps([sorted(shape.nodes), edges]).encode()).hexdigest()[:8]
    return f"v{version or VERSION} graph:{digest} keys:{keys}"


def keys_of(contract_line):
    """The key derivation's version a contract names ("1" for one saved before it named one)."""
    return (contract_line or "").partition(" keys:")[2] or "1"


def saved_contract(saved):
    """The contract a saved thread's head names, as this code writes one: a contract saved
    before contracts named the key derivation ("v1 graph:d5eaa29e") was made under keys:1."""
    line = saved.metadata.get("contract")
    return f"{line} keys:1" if line and " keys:" not in line else line


def derive_keys(node, deployed):
    """node, sending the ticket under the key its thread's version derives: the version migrate
    pinned (KEY_VERSION), or the deployed one."""

    def keyed(state, runtime):
        derive = KEY_DERIVATIONS[state.get(KEY_VERSION) or deployed]
        return node({**state, "key": derive(state)}, runtime)

    return keyed


def kept_keys(saved, current):
    """What migrate writes so that a thread keeps the keys it was sent under: its key_version,
    when this code derives them by another version and nothing pinned one yet; else {}."""
    was = keys_of(saved.metadata.get("contract"))
    values = saved.checkpoint["channel_values"]
    if was == keys_of(current) or KEY_VERSION in values:
        return {}
    return {KEY_VERSION: was}


def require_contract(graph, thread, current, renames=None):
    """Refuse, changing nothing, to resume a thread saved under another contract. The line says
    whether `migrate` can move it here (tried in a copy, as migrate does) or why it cannot."""
    saved = graph.checkpointer.get_tuple(checkpoints.thread_config(thread))
    if saved_contract(saved) == current:
        return
    was = saved.metadata.get("contract")
    emit("contract_mismatch", current=current, saved=was, thread=thread)
    why = f"thread {thread!r} was saved under {was!r}, this code is {current!r}"
    keep = kept_keys(saved, current)
    try:
        plan_migration(graph, saved, current, renames, keep)
    except CannotMigrate as error:  # no migrate hint that would be refused, or undo the thread
        why += f"; migrate cannot move it ({error}): resume it with the code that saved it"
        raise UserError(why, EXIT_CONTRACT) from None
    migrate = command(f"migrate --thread {shlex.quote(thread)}")
    if keep:  # resumed here, its node would send under a key it never used: a duplicate
        why += f" (its keys derived by version {keep[KEY_VERSION]}, not {keys_of(current)})"
        raise UserError(f"{why}; {migrate} moves it here and keeps its keys", EXIT_CONTRACT)
    raise UserError(f"{why}; {migrate} moves it here", EXIT_CONTRACT)


def migrate_thread(graph, thread, current, renames=None, owner=None):
    """Move a thread to the current contract: its values kept, its saved next run next, by this
    graph's names (renames: old name -> new). Nothing runs. The move is made in a copy of the
    thread first (plan_migration), and written only when its next is what this prints.
    owner(saved): the line for a thread another command runs, or None."""
    saved = graph.checkpointer.get_tuple(checkpoints.thread_config(thread))
    if saved is None:
        raise UserError(f"no thread {thread!r}; check --thread", EXIT_THREAD)
    if owner and (line := owner(saved)):
        raise UserError(line, EXIT_THREAD)
    if saved_contract(saved) == current:  # nothing to move: write nothing
        emit("unchanged", contract=current, next=list(graph.get_state(saved.config).next))
        return
    keep = kept_keys(saved, current)
    try:
        was, moved, writes = plan_migration(graph, saved, current, renames, keep)
    except CannotMigrate as error:
        raise UserError(f"thread {thread!r}: {error}; nothing written", EXIT_CONTRACT) from None
    for write in writes:  # the copy's new checkpoint (one put), then the question it waits on
        write(graph.checkpointer)
    saved_under = saved.metadata["contract"]
    emit("migrated", contract=current, next=moved, saved=saved_under, was=was, **keep)


def plan_migration(graph, saved, current, renames=None, keep=None):
    """The move of a saved thread (a CheckpointTuple) to this graph, made in a copy of it:
    (was, next, the writes to replay on the real saver). CannotMigrate says why it would not do.
    keep: values written with the move (kept_keys'), the others unchanged.

    The new checkpoint is written as the node that wrote the saved one (its name here): LangGraph's
    update_state, given no as_node, credits the write to the last writer that still exists
    (Pregel._infer_as_node, pregel/main.py), and that node's edges fire too, so a finished thread
    would be sent back to its effect. The copy is an InMemorySaver holding the thread's head; the
    real saver gets its one put only once the copy's next is the saved one, so a refusal leaves
    SQLite and Postgres alike untouched."""
    from langgraph.types import Command

    renames = renames or {}
    if "contract" not in saved.metadata:
        raise CannotMigrate("it has no contract: the program that saved it records none")
    values = saved.checkpoint["channel_values"]
    if strays := sorted(c for c in values if c not in graph.channels and not c.startswith(BRANCH)):
        raise CannotMigrate(f"it holds {strays}, which this graph has no place for")
    was = [c[len(BRANCH) :] for c in values if c.startswith(BRANCH)]
    goto = [renames.get(name, name) for name in was]
    if (writer := last_writer(saved.checkpoint)) is None:
        raise CannotMigrate("no node has run on it yet")
    writer = renames.get(writer, writer)
    if missing := [name for name in [writer, *goto] if name not in graph.nodes]:
        raise CannotMigrate(f"this graph has no node {missing}")
    copy = copy_saver(graph.checkpointer, saved)
    mover = graph.copy({"checkpointer": copy})
    config = {
        **checkpoints.thread_config(saved.config["configurable"]["thread_id"]),
        "metadata": {"contract": current},
    }
    copy.recording = True
    mover.update_state(config, Command(goto=goto, update=keep or None), as_node=writer)
    moved = mover.get_state(config)
    asked = [value for _, channel, value in saved.pending_writes or [] if channel == INTERRUPT]
    if asked and len(was) == 1 == len(moved.tasks):  # it waited in interrupt(): it still does
        copy.put_writes(moved.config, [(INTERRUPT, asked[0])], moved.tasks[0].id)
        moved = mover.get_state(config)
    if sorted(moved.next) != sorted(goto):
        raise CannotMigrate(
            f"written as {writer}, its next would be {list(moved.next)}, not {goto}"
        )
    return was, list(moved.next), copy.replay


class CannotMigrate(Exception):
    """Why a saved thread cannot be moved to this graph."""


def last_writer(checkpoint):
    """The node that wrote a saved checkpoint, by its saved name: the one that read the newest
    channel version (versions_seen), as Pregel._infer_as_node picks it, but over every name the
    checkpoint knows, not only those of the graph reading it."""
    seen = [
        (version, node)
        for node, versions in checkpoint["versions_seen"].items()
        if node != "__input__" and not node.startswith("__snapshot")
        for version in versions.values()
    ]
    return max(seen)[1] if seen else None


def copy_saver(real, saved):
    """A copy of a thread's head in memory, for plan_migration to write into: an InMemorySaver
    holding the saved checkpoint and its pending writes, with the real saver's version format.
    Once `recording` is set, the checkpoint it is given and the writes on that checkpoint are
    kept in `replay`, to replay on the real saver; the update's record of itself on the saved
    checkpoint (history only) is not replayed, so the saved checkpoint stays as it was."""
    from langgraph.checkpoint.memory import InMemorySaver

    class Copy(InMemorySaver):
        recording, replay, new_id = False, [], None

        def get_next_version(self, current, channel):
            return real.get_next_version(current, channel)

        def put(self, config, checkpoint, metadata, new_versions):
            if self.recording:
                self.new_id = checkpoint["id"]
                self.replay.append(lambda to: to.put(config, checkpoint, metadata, new_versions))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config, writes, task_id, task_path=""):
            if self.recording and config["configurable"]["checkpoint_id"] == self.new_id:
                self.replay.append(lambda to: to.put_writes(config, writes, task_id, task_path))
            return super().put_writes(config, writes, task_id, task_path)

    copy = Copy(serde=real.serde)
    copy.replay = []
    where = saved.config["configurable"]
    parent = (saved.parent_config or {"configurable": {}})["configurable"].get("checkpoint_id")
    head = {"configurable": {**where, "checkpoint_id": parent}}
    head["configurable"].setdefault("checkpoint_ns", "")
    copy.put(head, saved.checkpoint, saved.metadata, saved.checkpoint["channel_versions"])
    tasks = {}
    for task_id, channel, value in saved.pending_writes or []:
        tasks.setdefault(task_id, []).append((channel, value))
    for task_id, writes in tasks.items():
        copy.put_writes(saved.config, writes, task_id)
    return copy
