"""The effects of the graphs below, in one SQLite file (EFFECTS_DB): a row per effect.

record(effect, thread) appends a row, as a service without an idempotency key would;
record(effect, thread, key) is INSERT OR IGNORE on (effect, thread, key), a service that keeps
one answer per key. observe(thread) counts each effect of one thread.
"""

import os
import sqlite3
from contextlib import closing


def record(effect, thread, key=None):
    with closing(connect()) as db, db:
        db.execute(
            "INSERT OR IGNORE INTO effects (effect, thread, key) VALUES (?, ?, ?)",
            (effect, thread, key),
        )


def observe(thread):
    with closing(connect()) as db:
        rows = db.execute(
            "SELECT effect, COUNT(*) FROM effects WHERE thread = ? GROUP BY effect", (thread,)
        )
        return dict(rows.fetchall())


def connect():
    db = sqlite3.connect(os.environ["EFFECTS_DB"])
    # A NULL key never equals another: unkeyed rows are all kept.
    db.execute(
        "CREATE TABLE IF NOT EXISTS effects (effect, thread, key, UNIQUE (effect, thread, key))"
    )
    return db
