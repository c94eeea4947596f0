"""Lab 05: the key on the trace. `trace-keys [FILE]` reads the spans a traced run wrote
(TRACE=PATH, tracing.py: FILE, or TRACE's file when FILE is not given) and checks the proof:

    group the spans that carry an idempotency key by thread and node (and span name), and count
    the distinct keys: more than one means a nondeterministic input crept into the derivation

Every attempt of a node (the first, the resume's, a retry's) is another process or another
try, so its spans are in another trace: one line per group shows each attempt's key, in the
order the attempts ran. Exit 0 when every group has one key; EXIT_KEYS_DIFFER when one has more,
with one line naming it.
"""

import json

from exitcodes import EXIT_THREAD, EXIT_USAGE, UserError, emit
from tracing import KEY

EXIT_KEYS_DIFFER = 8  # a thread's node sent more than one key: its derivation is not deterministic
NODE = "langgraph.node"  # the attributes tracing.in_node puts on a span made inside a node
THREAD = "thread"


def trace_keys(args, settings):
    path = args.file or (settings.trace if settings.trace != "otlp" else "")
    if not path:
        raise UserError(
            "trace-keys reads a spans file: name it (trace-keys FILE), or set TRACE=PATH as the "
            "traced runs had it",
            EXIT_USAGE,
        )
    groups = {}
    for span in read_spans(path):
        attributes = span.get("attributes") or {}
        if KEY not in attributes or NODE not in attributes:  # the receiver's, or outside a node
            continue
        group = (attributes.get(THREAD), attributes[NODE], span["name"])
        group = groups.setdefault(group, {})
        attempt = group.setdefault(span["context"]["trace_id"], [span["start_time"], []])
        attempt[0] = min(attempt[0], span["start_time"])
        if attributes[KEY] not in attempt[1]:
            attempt[1].append(attributes[KEY])
    if not groups:
        raise UserError(
            f"no span in {path} carries a key sent from a graph's node: were the runs started "
            "with TRACE set to this file?",
            EXIT_THREAD,
        )
    differ = []
    for (thread, node, name), attempts in sorted(groups.items()):
        keys = [key for _, each in sorted(attempts.values()) for key in each]
        emit("keys", thread=thread, node=node, span=name, attempts=len(attempts), keys=keys)
        if len(set(keys)) > 1:
            differ.append(f"thread {thread!r} node {node} sent {len(set(keys))} keys ({name})")
    if differ:
        raise UserError(
            f"{'; '.join(differ)}: a nondeterministic input crept into the key's derivation",
            EXIT_KEYS_DIFFER,
        )


def read_spans(path):
    """The spans of a TRACE=PATH file: one JSON object a line (ReadableSpan.to_json)."""
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    yield json.loads(line)
                except ValueError:
                    raise UserError(
                        f"{path}, line {number}, is not a span (TRACE=PATH writes one JSON "
                        "object a line)",
                        EXIT_USAGE,
                    ) from None
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None


def add_trace_keys_parser(actions):
    sub = actions.add_parser(
        "trace-keys", help="count the keys each thread's node sent, from a spans file (lab 05)"
    )
    sub.set_defaults(run=trace_keys)
    sub.add_argument("file", nargs="?", help="the spans file (default: TRACE's)")
