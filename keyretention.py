"""How long a receiver honours an idempotency key, and the pruner that forgets older ones.

RECEIVER_KEY_RETENTION_S unset: keys are kept for ever. Set: a key is honoured for that many
seconds after its row was made; an older key is not, pruned yet or not, so a request with it is
a new one. A pruner thread forgets keys past the retention now and then (their rows stay).
Standard library only; it works on a receiverdb.ReceiverDatabase.
"""

import math
import sqlite3
import sys
import threading
import time

from receiverdb import UNUSABLE

COUNTERS = {"keys_pruned": "Keys forgotten past RECEIVER_KEY_RETENTION_S (their tickets stay)."}
KEY_AGE_INDEX = """CREATE INDEX IF NOT EXISTS {table}_keys_by_age ON {table} (created_at)
    WHERE operation_key IS NOT NULL"""
EXPIRED = "IFNULL(created_at < ?, 0)"  # SQL: the row's key is past the retention (? = cutoff)
PRUNE_EVERY_S = 60.0  # seconds between prunes at most (less when the retention is shorter)
PRUNE_BATCH = 500  # keys forgotten per transaction; requests take their turn between batches


def index_keys_by_age(store):
    """An index by age of each keyed table's keys, for the pruner."""
    for table in store.KEYED:
        store.db.execute(KEY_AGE_INDEX.format(table=table))


def cutoff(store):
    """Keys made before this Unix time are past the retention (-inf: kept for ever)."""
    return -math.inf if store.retention_s is None else time.time() - store.retention_s


def forget_expired(store, table, key):
    """Inside a transaction: forget key now if it is past the retention."""
    if store.retention_s is not None:
        store.counted_on_commit["keys_pruned"] += store.db.execute(
            f"UPDATE {table} SET operation_key = NULL WHERE operation_key = ? AND {EXPIRED}",
            (key, cutoff(store)),
        ).rowcount


def rows_with_keys(store, table, columns, key=None):
    """(id, key, columns...) of every row of table, or of the one made with key, in id order;
    a key past the retention shows as None."""
    sql = f"SELECT id, CASE WHEN {EXPIRED} THEN NULL ELSE operation_key END, {columns} "
    sql, args = sql + f"FROM {table}", (cutoff(store),)
    if key is not None:
        sql, args = sql + f" WHERE operation_key = ? AND NOT {EXPIRED}", (*args, key, *args)
    with store.locked():
        return store.db.execute(sql + " ORDER BY id", args).fetchall()


def prune(store):
    """Forget every key past the retention, PRUNE_BATCH to a transaction; return how many.

    The rows stay: only their keys go, so the same key makes a new row."""
    pruned = 0
    for table in store.KEYED:
        while True:
            with store.transaction():
                batch = store.db.execute(
                    f"UPDATE {table} SET operation_key = NULL WHERE id IN (SELECT id FROM "
                    f"{table} WHERE operation_key IS NOT NULL AND {EXPIRED} LIMIT ?)",
                    (cutoff(store), PRUNE_BATCH),
                ).rowcount
                store.counted_on_commit["keys_pruned"] += batch
            pruned += batch
            if batch < PRUNE_BATCH:
                break
    return pruned


def start_pruner(store):
    """With a retention, a thread that prunes now and then, and its one log line; the Event
    that stops it."""
    stop = threading.Event()
    if (retention_s := store.retention_s) is not None:
        every_s = min(retention_s, PRUNE_EVERY_S)
        threading.Thread(target=prune_forever, args=(store, every_s, stop), daemon=True).start()
        print(f"receiver: keys kept {retention_s:g} s, pruned every {every_s:g} s", file=sys.stderr)
    return stop


def prune_forever(store, every_s, stop):
    """The pruner's thread: prune now and then until stop is set; a failure is one log line."""
    while not stop.wait(every_s):
        try:
            if pruned := prune(store):
                keys = "key" if pruned == 1 else "keys"
                print(f"receiver: pruned {pruned} {keys} past the retention", file=sys.stderr)
        except UNUSABLE as error:  # the requests say so too; one line however many meet it
            if error.first:
                print(f"receiver: unavailable: {error}", file=sys.stderr)
        except sqlite3.Error as error:  # busy, say: the next round tries again
            print(f"receiver: pruning failed: {error}", file=sys.stderr)
