"""The ledger's tables, in SQLite and in Postgres, and a receipt's integrity hash: how it is
made (plain sha256, or HMAC-SHA256 under LEDGER_RECEIPT_KEY) and checked. ledger.py writes them."""

import hashlib
import hmac
import json
import sqlite3
import time

KEYED = "hmac-sha256:"  # how a receipt's integrity hash made with LEDGER_RECEIPT_KEY begins
RECEIPTS = {"key": None, "unkeyed": "refuse"}  # key_receipts() sets them, from a program's main()


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY,  -- the idempotency key: one row per effect
    effect TEXT NOT NULL,  -- its declaration's name (ticket, refund, email, ...)
    thread TEXT,  -- the LangGraph thread that asked for it
    request TEXT NOT NULL,  -- canonical JSON of what is sent
    request_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    note TEXT,  -- why it is in this state
    refusal TEXT,  -- the provider's answer when it said no (state failed)
    attempts INTEGER NOT NULL DEFAULT 1,
    updated_at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_extras (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL REFERENCES effects (key),
    external_id TEXT NOT NULL,  -- a second thing the provider made under the key: undo it
    answer TEXT NOT NULL,
    how TEXT NOT NULL,
    at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_transitions (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL REFERENCES effects (key),
    from_state TEXT,
    to_state TEXT NOT NULL,
    how TEXT NOT NULL,
    at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_receipts (
    key TEXT PRIMARY KEY REFERENCES effects (key),
    external_id TEXT NOT NULL,  -- the provider's id for what it made
    answer TEXT NOT NULL,  -- the provider's answer, canonical JSON
    request_hash TEXT NOT NULL,
    integrity TEXT NOT NULL,  -- digest_of key, effect, request hash, external id, answer
    at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS effect_corrections (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL REFERENCES effects (key),
    was_id TEXT NOT NULL,  -- the id the key's answer named before: a person's word, mistaken
    external_id TEXT NOT NULL,  -- the id a person corrected it to: what the ledger reads now
    answer TEXT NOT NULL,  -- the corrected answer, canonical JSON
    who TEXT NOT NULL,  -- the person (their login) and the command
    integrity TEXT NOT NULL,  -- digest_of key, both ids, answer, who
    at REAL NOT NULL
)""",
    """CREATE TRIGGER IF NOT EXISTS receipts_are_kept BEFORE UPDATE ON effect_receipts
BEGIN SELECT RAISE(ABORT, 'a receipt is never overwritten'); END""",
    """CREATE TRIGGER IF NOT EXISTS receipts_stay BEFORE DELETE ON effect_receipts
BEGIN SELECT RAISE(ABORT, 'a receipt is never deleted'); END""",
    """CREATE TRIGGER IF NOT EXISTS corrections_are_kept BEFORE UPDATE ON effect_corrections
BEGIN SELECT RAISE(ABORT, 'a correction is never overwritten'); END""",
    """CREATE TRIGGER IF NOT EXISTS corrections_stay BEFORE DELETE ON effect_corrections
BEGIN SELECT RAISE(ABORT, 'a correction is never deleted'); END""",
)


ADDED_COLUMNS = (  # added to effects since it was first made: ALTER TABLE where missing
    ("sent_at", "REAL"),  # when the last request under the key may have left
    ("owner", "TEXT"),  # the lease's holder: host:pid:ledger
    ("lease_until", "REAL"),  # past it, a holder still alive keeps nobody out
    ("authorized", "TEXT"),  # what authorized its last send (Effect.authorize), or NULL
)

POSTGRES_SCHEMA = (
    *(
        statement.replace("REAL", "DOUBLE PRECISION").replace(
            "id INTEGER PRIMARY KEY", "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        )
        for statement in SCHEMA
        if statement.startswith("CREATE TABLE")
    ),
    """CREATE OR REPLACE FUNCTION effect_receipts_are_kept() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'a receipt is never overwritten or deleted'; END $$""",
    """CREATE OR REPLACE TRIGGER receipts_are_kept BEFORE UPDATE OR DELETE ON effect_receipts
FOR EACH STATEMENT EXECUTE FUNCTION effect_receipts_are_kept()""",
    """CREATE OR REPLACE FUNCTION effect_corrections_are_kept() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'a correction is never overwritten or deleted'; END $$""",
    """CREATE OR REPLACE TRIGGER corrections_are_kept BEFORE UPDATE OR DELETE ON effect_corrections
FOR EACH STATEMENT EXECUTE FUNCTION effect_corrections_are_kept()""",
)


def wal(conn, timeout_s):
    """PRAGMA journal_mode=WAL, waiting out another process that is making the same new file:
    SQLite answers "database is locked" at once there, without its busy wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def key_receipts(key="", unkeyed="refuse"):
    """LEDGER_RECEIPT_KEY and LEDGER_RECEIPT_UNKEYED, for the receipts this process writes and
    reads (a program's main() calls it; the defaults are the settings' own).

    No key (the default): a receipt's integrity hash is a plain sha256 of what it records (its
    key, effect, request hash, the provider's id and answer). It catches a receipt damaged, or
    edited by hand without its hash: not a forger, who can compute a sha256 as well as we can.
    A key: the hash is an HMAC-SHA256 under it, written as "hmac-sha256:<hex>". Someone who can
    write the ledger but does not know the key (a shared database, a copy restored from
    elsewhere) can neither forge a receipt nor change one; they can still delete rows, or put
    back an older copy of the whole file. A plain receipt is then refused, since a forger can
    write one too; one written before the key was set is read only with unkeyed="accept"
    (LEDGER_RECEIPT_UNKEYED=accept), for as long as such receipts may be read."""
    if unkeyed not in ("refuse", "accept"):
        raise ValueError(f"LEDGER_RECEIPT_UNKEYED={unkeyed!r} must be refuse or accept")
    RECEIPTS.update(key=key.encode() if key else None, unkeyed=unkeyed)


def digest_of(fields):
    """The integrity hash of a receipt's fields: keyed when LEDGER_RECEIPT_KEY is set."""
    text = json.dumps(fields, separators=(",", ":")).encode()
    if RECEIPTS["key"] is None:
        return hashlib.sha256(text).hexdigest()
    return KEYED + hmac.new(RECEIPTS["key"], text, hashlib.sha256).hexdigest()


def integrity_fault(fields, integrity):
    """Why integrity is not the hash of fields this process may accept (key_receipts), or None."""
    text = json.dumps(fields, separators=(",", ":")).encode()
    if integrity.startswith(KEYED):
        if RECEIPTS["key"] is None:
            why = "it was written with LEDGER_RECEIPT_KEY, which is not set here: set it"
        else:
            expected = KEYED + hmac.new(RECEIPTS["key"], text, hashlib.sha256).hexdigest()
            if hmac.compare_digest(expected, integrity):
                return None
            why = "changed or forged, or written under another LEDGER_RECEIPT_KEY"
    elif RECEIPTS["key"] is not None and RECEIPTS["unkeyed"] != "accept":
        why = (
            "it has no LEDGER_RECEIPT_KEY hash (forged, or written before the key was set: "
            "LEDGER_RECEIPT_UNKEYED=accept reads those)"
        )
    elif hmac.compare_digest(hashlib.sha256(text).hexdigest(), integrity):
        return None
    else:
        why = "changed or damaged since it was written"
    return why
