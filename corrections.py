"""A person's answer corrected: a key confirmed on a person's word (reconcile --confirmed KEY=ID)
given another id (reconcile --correct KEY=ID). The receipt is never overwritten: a correction is
a row of its own in effect_corrections (who, when, the id it replaces and the new one, the new
answer), hashed like a receipt and never changed or deleted; the ledger reads a receipt through
its latest correction (Ledger.receipt). settling.py checks a correction; this file records it.
Standard library only."""

import getpass
import json
import os
import time

from ledger_tables import digest_of, integrity_fault

BY_A_PERSON = "settled: confirmed (a person"  # how a confirmation on a person's word begins
LOOKED_UP = ", looked up"  # in its how when the provider's lookup gave the id (settling.py)


def corrected(ledger, key, receipt):
    """receipt as its corrections leave it: the latest one's external_id and answer, and
    "corrections", every one oldest first ({was, now, who}). A correction that fails its
    integrity hash: Damaged. A ledger made before corrections existed has none."""
    try:
        rows = ledger.sql(
            "SELECT * FROM effect_corrections WHERE key = ? ORDER BY id", (key,)
        ).fetchall()
    except Exception as error:  # a read-only ledger older than the table (SQLite, Postgres)
        if "effect_corrections" not in str(error):
            raise
        return receipt
    if not rows:
        return receipt
    from ledger import Damaged  # ledger.py reads its receipts through this file

    for row in rows:
        fields = [key, *(row[c] for c in ("was_id", "external_id", "answer", "who"))]
        if (why := integrity_fault(fields, row["integrity"])) is not None:
            raise Damaged(f"a correction of {key!r} does not match its integrity hash: {why}")
    listed = [{"was": r["was_id"], "now": r["external_id"], "who": r["who"]} for r in rows]
    latest = rows[-1]
    answer = json.loads(latest["answer"])
    return {
        **receipt,
        "external_id": latest["external_id"],
        "answer": answer,
        "corrections": listed,
    }


def correct(ledger, key, answer, external_id, how):
    """Record a correction of key's confirmed answer (the caller holds the key's lock and has
    checked it): the answer and id the ledger reads from now on, who gave it (their login) and
    how; a transition confirmed -> confirmed says it in the key's history. The id it replaces."""
    answer_json = json.dumps(answer, sort_keys=True, separators=(",", ":"))
    who = f"{login()}: {how}"
    with ledger.transaction():
        was = ledger.receipt(key)["external_id"]
        fields = [key, was, str(external_id), answer_json, who]
        ledger.sql(
            "INSERT INTO effect_corrections (key, was_id, external_id, answer, who, integrity, "
            "at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, was, str(external_id), answer_json, who, digest_of(fields), time.time()),
        )
        how = f"corrected: {was} -> {external_id} ({who})"
        ledger.move_locked(key, "confirmed", "confirmed", how)
    return was


def corrections(ledger):
    """[(key, was, now, who)] of every correction in the ledger, oldest first."""
    try:
        rows = ledger.sql(
            "SELECT key, was_id, external_id, who FROM effect_corrections ORDER BY id"
        ).fetchall()
    except Exception as error:  # a read-only ledger older than the table
        if "effect_corrections" not in str(error):
            raise
        return []
    return [(r["key"], r["was_id"], r["external_id"], r["who"]) for r in rows]


def by_a_person(ledger, key):
    """How key was confirmed, if on a person's word (reconcile --confirmed), else None."""
    confirmed = [how for _, to, how in ledger.history(key) if to == "confirmed"]
    return confirmed[0] if confirmed and confirmed[0].startswith(BY_A_PERSON) else None


def correctable(ledger, key):
    """Whether key's answer is a person's to correct with an id of their own: confirmed on their
    word, and not checked by the provider's lookup (then the provider's id is the only one a
    correction could name, and it names it already)."""
    how = by_a_person(ledger, key)
    return how is not None and LOOKED_UP not in how


def login():
    """The person's login name (LOGNAME, USER, or the password database), else their uid."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no name in its passwd file
        return f"uid {os.getuid()}"
