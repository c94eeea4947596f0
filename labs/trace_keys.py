"""Lab 05: the key on the trace. `trace-keys [FILE]` reads the spans a traced run wrote
(TRACE=PATH, tracing.py: FILE, or TRACE's file when FILE is not given) and checks the proof:

    group the spans that carry an idempotency key by thread, node and effect (and span name),
    and count the distinct keys: more than one means a nondeterministic input crept into the
    derivation

One node may perform several effects (lab 07's in-node ask sends KEY and KEY:approval from
create_ticket): each effect is compared with its own attempts (tracing.EFFECT on its spans).
An attempt is the spans of one trace: a resume is another process, so another trace; a
LangGraph RetryPolicy retry runs in the same process and run, so it shares its trace and counts
as one attempt with it. One line per group shows each attempt's key, in the order the attempts
ran. Exit 0 when every group has one key; EXIT_KEYS_DIFFER when one has more, with one line
naming it.
"""

import json

from exitcodes import EXIT_THREAD, EXIT_USAGE, UserError, command, emit
from tracing import EFFECT, KEY

EXIT_KEYS_DIFFER = 8  # an effect of a thread's node sent several keys: not deterministic
NODE = "langgraph.node"  # the attributes tracing.in_node puts on a span made inside a node
THREAD = "thread"


def trace_keys(args, settings):
    path = args.file or (settings.trace if settings.trace != "otlp" else "")
    if not path:
        raise UserError(
            f"trace-keys reads a spans file: name it, as in {command('trace-keys FILE')}, or "
            "set TRACE=PATH as the traced runs had it",
            EXIT_USAGE,
        )
    groups = {}
    for number, span in read_spans(path):
        try:
            attributes = span.get("attributes") or {}
            if KEY not in attributes or NODE not in attributes:  # the receiver's, or no node's
                continue
            thread, node, effect = attributes.get(THREAD), attributes[NODE], attributes.get(EFFECT)
            group = groups.setdefault((thread, node, effect or "", span["name"]), {})
            trace, start = span["context"]["trace_id"], span["start_time"]
        except (AttributeError, KeyError, TypeError):
            raise UserError(
                f"{path}, line {number}, is not a span: it lacks its name, context.trace_id or "
                "start_time (TRACE=PATH writes them)",
                EXIT_USAGE,
            ) from None
        attempt = group.setdefault(trace, [start, []])
        attempt[0] = min(attempt[0], start)
        if attributes[KEY] not in attempt[1]:
            attempt[1].append(attributes[KEY])
    if not groups:
        raise UserError(
            f"no span in {path} carries a key sent from a graph's node: were the runs started "
            "with TRACE set to this file?",
            EXIT_THREAD,
        )
    differ = []
    for (thread, node, effect, name), attempts in sorted(groups.items()):
        keys = [key for _, each in sorted(attempts.values()) for key in each]
        made_by = {"effect": effect} if effect else {}  # a span made by an Effect names it
        emit(
            "keys",
            thread=thread,
            node=node,
            span=name,
            attempts=len(attempts),
            keys=keys,
            **made_by,
        )
        if len(set(keys)) > 1:
            of = f"effect {effect}, {name}" if effect else name
            differ.append(f"thread {thread!r} node {node} sent {len(set(keys))} keys ({of})")
    if differ:
        raise UserError(
            f"{'; '.join(differ)}: a nondeterministic input crept into the key's derivation",
            EXIT_KEYS_DIFFER,
        )


def read_spans(path):
    """The spans of a TRACE=PATH file, numbered from line 1: one JSON object a line
    (ReadableSpan.to_json)."""
    not_spans = f"{path}, line {{}}, is not a span (TRACE=PATH writes one JSON object a line)"
    try:
        with open(path, encoding="utf-8") as lines:
            number = 0
            for number, line in enumerate(lines, 1):
                try:
                    span = json.loads(line)
                except ValueError:
                    span = None
                if not isinstance(span, dict):
                    raise UserError(not_spans.format(number), EXIT_USAGE)
                yield number, span
    except UnicodeDecodeError:  # a binary file: the line it stops in is the one after number's
        raise UserError(not_spans.format(number + 1), EXIT_USAGE) from None
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None


def add_trace_keys_parser(actions):
    sub = actions.add_parser(
        "trace-keys", help="count the keys each thread's node sent, from a spans file (lab 05)"
    )
    sub.set_defaults(run=trace_keys, writes_spans=False)  # TRACE names the file to read
    sub.add_argument("file", nargs="?", help="the spans file (default: TRACE's)")
