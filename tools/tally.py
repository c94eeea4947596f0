"""What the workflow and the workers did, counted from the JSON events they already print.

    python -m tools.tally [FILE ...]          # JSON lines; stdin without a FILE
    docker compose -p stateful-lab logs --no-log-prefix worker | python -m tools.tally

prints one line, {"event": "tally", ...}, with

    started, resumed   runs: a worker's `job` event says which (resume true or false); labs/cli.py
                       prints none, so `make demo` adds its start, resume and approve commands
    drained            runs stopped at a step boundary on SIGTERM (`drained`, `job_drained`)
    acknowledged       effects the receiver created (`effect_ack`, `held_run`, the saga's
                       `charged`, `reserved`, `shipped`, `released` and `refunded`, the relay's
                       `answered`: created true)
    replayed           effects the receiver answered from their key (created false)
    settled            open effects settled: by a lookup (a resume's `effect_adopted`, the saga's
                       step with "how": "adopted"; lab 06's
                       `reconcile` that found the ticket, whose `effect_ack` then says created
                       false: not a replay; `reconciled` now confirmed or not sent) or by a
                       person (`settled`: reconcile --confirmed or --not-sent)

The core prints its events and no counters of its own: the counts are derived here, from lines
a tool already reads. `replayed` is the workflow's view of the receiver's own counter,
receiver_idempotent_replays_total (GET /metrics). Lines that are not JSON events (a log line, a
Compose prefix left on) are skipped. Exit codes: 0; 2 a FILE that cannot be read.
"""

import json
import sys
from collections import Counter

COUNTS = ("started", "resumed", "drained", "acknowledged", "replayed", "settled")
# Events that carry the receiver's answer (created true or false): a ticket's, a woken worker's,
# the saga's steps and undos (lab 13), the relay's delivery (lab 19)
# What `reconcile` says it made of an open effect when that settled it (settling.lookup_settles)
SETTLED_BY_RECONCILE = ("confirmed", "not sent")
ANSWERS = ("effect_ack", "held_run", "charged", "reserved", "shipped", "released", "refunded")
ANSWERS += ("answered",)


def events_in(lines):
    """The JSON objects with an "event" among lines; anything else is skipped."""
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            yield event


def tally(events):
    """The counts of one run's (or one command's) events, in order."""
    counts, adopted = Counter(dict.fromkeys(COUNTS, 0)), False
    for event in events:
        kind = event["event"]
        if kind == "job":
            counts["resumed" if event.get("resume") else "started"] += 1
        elif kind in ("drained", "job_drained"):
            counts["drained"] += 1
        elif kind == "reconcile":
            adopted = bool(event.get("found"))
        elif kind in ("effect_adopted", "settled") or (
            kind == "reconciled" and event.get("now") in SETTLED_BY_RECONCILE
        ):
            counts["settled"] += 1
        elif kind in ANSWERS and event.get("how") == "adopted":  # the saga's lookup by key
            counts["settled"] += 1
        elif kind in ANSWERS and "created" in event:
            if event["created"]:
                counts["acknowledged"] += 1
            elif adopted:  # the lookup found it: settled, and the receiver replayed nothing
                counts["settled"] += 1
            else:
                counts["replayed"] += 1
            adopted = False
    return counts


def tally_line(counts):
    return json.dumps({"event": "tally", **{name: counts[name] for name in COUNTS}})


def main(argv=None):
    names = sys.argv[1:] if argv is None else argv
    counts = Counter()
    try:
        for name in names:
            with open(name, encoding="utf-8") as lines:
                counts += tally(events_in(lines))
    except OSError as error:
        print(f"tally: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    if not names:
        counts = tally(events_in(sys.stdin))
    print(tally_line(counts))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("tally: interrupted", file=sys.stderr)
        sys.exit(130)
