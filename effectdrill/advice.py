"""How to fix what the drill found, in words: each verdict and each kind of repeated request,
what it means and what fixes it. The HTML report's legend and its rows, and the --json rows, say
it from here. Documents that teach the fixes are named through teach(); without it the fixes
stand alone."""

from effectdrill.kinds import MODEL
from effectdrill.resent import IN_FLIGHT, MODEL_AGAIN, NEW_KEY, NO_KEY, SAME_KEY

TOPICS = ("keyed fix", "key source", "lost answer", "interrupt", "key expiry", "ledger", "retry")
TAUGHT = {}  # topic -> where it is taught, as teach() was told; empty: no pointers


def teach(places):
    """Say where each fix is taught, {topic: place} (topics from TOPICS): every fix given from
    then on ends with its places, e.g. ' (docs/keys.md)'. An unknown topic is a ValueError."""
    unknown = sorted(set(places) - set(TOPICS))
    if unknown:
        raise ValueError(f"unknown topics {unknown}: the topics are {list(TOPICS)}")
    TAUGHT.update(places)
    VERDICTS.update(verdict_fixes())
    REPEATS.update(repeat_fixes())


def taught(*topics):
    """' (where the fix is taught)' for topics, or '' where that is not known."""
    places = [TAUGHT[topic] for topic in topics if topic in TAUGHT]
    return f" ({', '.join(places)})" if places else ""


def verdict_fixes():
    """The word a row's verdict starts with -> what it means, what fixes it."""
    return {
        "ok": ("the effects counted as in the clean run", ""),
        "DUPLICATE": (
            "an effect counted more often than in the clean run: the recovery ran its node again",
            "give the effect an idempotency key derived from the operation (for a tool call, its "
            "call id), the same on every attempt, sent to a service that honours it"
            + taught("keyed fix", "key source"),
        ),
        "MISSING": (
            "an effect counted less often than in the clean run: a crash here loses it",
            "record the intent before the request and reconcile after a crash" + taught("ledger"),
        ),
        "FAILED": ("the resume raised", "read its error: the thread cannot be finished as saved"),
        "not reached": ("the run never came to this point: no verdict", ""),
    }


def repeat_fixes():
    """A repeated request's kind -> its words, what it means and fixes, in a sentence."""
    return {
        NO_KEY: (
            "REPEATED WITHOUT A KEY",
            "sent again with no Idempotency-Key: a new effect at any service. Send a key derived "
            "from the operation (for a tool call, its call id)" + taught("keyed fix", "key source"),
        ),
        NEW_KEY: (
            "REPEATED UNDER A NEW KEY",
            "sent again under another key: the client mints a key per attempt (a uuid4 per "
            "request, as some vendor SDKs do), so the service takes it for a new request. Derive "
            "the key from the operation or the tool call id and pass it to the client"
            + taught("key source"),
        ),
        SAME_KEY: (
            "resent with its key",
            "the same key again: absorbed by a provider that honours it, for as long as it "
            "remembers the key" + taught("key expiry"),
        ),
        IN_FLIGHT: (
            "in flight at the kill, sent again",
            "the crashed run sent it and died before the answer; the resume sent it again. Your "
            "observer says whether it happened twice" + taught("lost answer"),
        ),
        MODEL: (MODEL_AGAIN, "a model call made again: it costs, it changes nothing outside"),
    }


VERDICTS = verdict_fixes()  # rebuilt in place by teach(): html.py reads them
REPEATS = repeat_fixes()

CLEAN_RUN = {  # why a clean run repeated an effect -> its topic in TAUGHT
    "after an interrupt": "interrupt",
    "RetryPolicy": "retry",
}


def row_fixes(row):
    """What to do about a row, one sentence per finding (none for an ok row)."""
    where = f"node {row.node}" + (f", {'; '.join(row.tools)}" if row.tools else "")
    fixes = []
    for word, effects in (("DUPLICATE", row.duplicates()), ("MISSING", row.missing())):
        for effect in effects:
            meaning, fix = VERDICTS[word]
            fixes.append(f"{word} {effect} ({where}): {meaning}; {fix}")
    for repeat in row.requests:
        if repeat["repeat"] in (NO_KEY, NEW_KEY):
            words, fix = REPEATS[repeat["repeat"]]
            fixes.append(f"{words}: {repeat['endpoint']} ({where}): {fix}")
    return fixes


def clean_fix(why):
    """The fix for a repeat the clean run made (a node re-run after an interrupt, a retry)."""
    for cause, topic in CLEAN_RUN.items():
        if cause in why:
            return "make the node's effect idempotent, or move it out of the node" + taught(topic)
    return ""
