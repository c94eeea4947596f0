"""Where this repository's labs teach each fix the drill advises (effectdrill/advice.py). Not
copied into the starter, which has no labs: its drill gives the fixes without these pointers."""

TAUGHT = {
    "keyed fix": "labs/02-the-keyed-fix.md",
    "key source": "labs/05-where-the-key-comes-from.md",
    "lost answer": "labs/06-the-lost-acknowledgement.md",
    "interrupt": "labs/07-the-approval-that-runs-twice.md",
    "key expiry": "labs/14-the-key-that-expired.md",
    "ledger": "labs/15-the-ledger.md",
    "retry": "labs/17-the-retry-langgraph-made-for-you.md",
}
