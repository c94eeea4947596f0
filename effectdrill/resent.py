"""The requests a crash point sent again, by endpoint: without a key, under a new key, with
its key (harmless where the service honours it), in flight at the kill; and the model calls made
again, shown apart (a cost, not an effect). Their lines in the drill's table."""

from effectdrill.kinds import EFFECT, EFFECT_METHODS, MODEL

NO_KEY, NEW_KEY, SAME_KEY = "no key", "new key", "same key"  # what a repeat carried
IN_FLIGHT = "in flight"  # more only by a request the kill left without its answer
FINDINGS = (NO_KEY, NEW_KEY)  # the repeats that make a new effect at a key-honouring service
MODEL_AGAIN = "model call made again: cost, not an effect"


def repeated_requests(clean, runs, counted):
    """The endpoints a row's runs sent more often than the clean run, and with what key."""
    found = []
    clean_by = by_endpoint(clean)
    runs_by = [by_endpoint(sent) for sent in runs]
    endpoints = dict.fromkeys(e for sent in runs_by for e in sent)
    for endpoint in endpoints:
        before = clean_by.get(endpoint, [])
        sent = [s.get(endpoint, []) for s in runs_by]
        if not any(len(s) > len(before) for s in sent):
            continue
        if not any(len([r for r in s if r.answered]) > len(before) for s in sent):
            found.append(repeat_entry(endpoint, sent, before, IN_FLIGHT, True))
            continue  # more only with a request the kill left unanswered: it may never have
        same = [any(bodies(s, b) > bodies(before, b) for b in bodies_of(before)) for s in sent]
        unkeyed = [sum(r.key is None for r in s) for s in sent]
        distinct = [len(keys(s)) for s in sent]
        if any(n > sum(r.key is None for r in before) for n in unkeyed):
            kind = NO_KEY
        elif any(n > len(keys(before)) for n in distinct):
            kind = NEW_KEY
        else:
            kind = SAME_KEY
        entry = repeat_entry(endpoint, sent, before, kind, counted or kind == SAME_KEY)
        found.append(entry | {"same_body": same})
    return found


def model_repeats(clean, runs):
    """The model calls a row's runs made more often than the clean run, by endpoint: a cost,
    never a finding (kinds.py says which requests are model calls)."""
    found = []
    clean_by = by_endpoint(clean, model_calls)
    runs_by = [by_endpoint(sent, model_calls) for sent in runs]
    for endpoint in dict.fromkeys(e for sent in runs_by for e in sent):
        before = clean_by.get(endpoint, [])
        sent = [s.get(endpoint, []) for s in runs_by]
        if any(len(s) > len(before) for s in sent):
            found.append(repeat_entry(endpoint, sent, before, MODEL, True))
    return found


def repeat_entry(endpoint, sent, before, kind, counted):
    return {
        "endpoint": endpoint,
        "hosts": sorted({r.host for s in sent for r in s}),
        "sent": [len(s) for s in sent],
        "in_flight": [sum(not r.answered for r in s) for s in sent],
        "clean": len(before),
        "without_key": [sum(r.key is None for r in s) for s in sent],
        "keys": [len(keys(s)) for s in sent],
        "repeat": kind,
        "counted": counted,
    }


def requests_table(report, layout):
    """The requests block of the drill's table: one line per endpoint a crash point resent,
    its cells aligned by `layout` (the drill table's own, which wraps a long point between
    words to the table's width)."""
    lines = [["durability", "point", "request", "sent", "keys", "repeat"]]
    for row in report.rows:
        for repeat in getattr(row, "requests", []):
            clean = repeat["clean"]
            words = {
                NO_KEY: "REPEATED WITHOUT A KEY",
                NEW_KEY: "REPEATED UNDER A NEW KEY",
                SAME_KEY: "resent with its key",
                IN_FLIGHT: "in flight at the kill, sent again",
                MODEL: MODEL_AGAIN,
            }[repeat["repeat"]]
            if not repeat["counted"]:
                words += ", NOT COUNTED by the observer"
            lines.append(
                [
                    row.durability,
                    row.point,
                    repeat["endpoint"],
                    f"{' '.join(map(str, repeat['sent']))} (clean {clean})",
                    " ".join(map(str, repeat["keys"])),
                    words,
                ]
            )
    if len(lines) == 1:
        return ""
    if len({line[0] for line in lines[1:]}) == 1:
        lines = [line[1:] for line in lines]
    body = layout(lines)
    title = "requests sent again (POST and PATCH; http.client and httpx)"
    return f"{title}\n{body}\n{totals_line(report.requests)}"


def totals_line(totals):
    """The requests block's last line: how many repeats of each kind the crash points made."""
    models = totals.get(MODEL, 0)
    return (
        f"requests: {totals[NO_KEY]} repeated without a key, {totals[NEW_KEY]} under a new "
        f"key, {totals['not counted']} not counted by the observer"
        + (f"; {models} model calls made again (a cost, not an effect)" if models else "")
    )


def summary_words(totals):
    """', N requests ...' for the summary line when a repeat went uncounted, else ''."""
    if not totals or not totals["not counted"]:
        return ""
    return f", {totals['not counted']} repeated requests not counted by the observer"


# helpers


def bodies_of(sent):
    return {r.body for r in sent if r.body is not None}


def bodies(sent, body):
    """How many of `sent` carried `body`."""
    return sum(r.body == body for r in sent)


def effect_requests(sent):
    """The requests that change something: POST and PATCH, not a read, not a model call."""
    return [r for r in sent if r.method in EFFECT_METHODS and r.kind == EFFECT]


def model_calls(sent):
    return [r for r in sent if r.kind == MODEL]


def by_endpoint(sent, which=None):
    grouped = {}
    for request in (which or effect_requests)(sent):
        grouped.setdefault(request.endpoint, []).append(request)
    return grouped


def keys(sent):
    return {r.key for r in sent if r.key is not None}
