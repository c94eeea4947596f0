"""The ledger in Postgres (ledger.Ledger's statements, on a psycopg 3 connection): for workers
that share one database. ledger.open_ledger picks it for a postgresql:// URL."""

import os
import re
import socket
from contextlib import contextmanager, suppress

from ledger import LEASE_S, InFlight, Ledger
from ledger_tables import ADDED_COLUMNS, POSTGRES_SCHEMA

TRIGGER = re.compile(r"CREATE OR REPLACE TRIGGER (\w+) .*? ON (\w+)", re.S)


class PostgresLedger(Ledger):
    """The same ledger in Postgres, on a connection the caller opened (psycopg 3, dict rows).

    A claim inserts with ON CONFLICT DO NOTHING and then locks the row FOR UPDATE: a SELECT ...
    FOR UPDATE alone locks no row that does not exist yet, so two workers could both miss it."""

    db = None  # the caller's connection, not opened here

    def __init__(self, conn, lease_s=LEASE_S):
        self.db, self.lease_s = conn, lease_s  # the lease: its owner shown; the lock decides
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        # Only what is missing: CREATE TRIGGER and ALTER TABLE (even with IF NOT EXISTS) lock
        # their table against writes, and a worker starting beside one that writes a receipt
        # deadlocked with it (the INSERT waited for the trigger's table, the ALTER for effects).
        with self.transaction():
            self.sql("SELECT pg_advisory_xact_lock(hashtext('effect ledger schema'))")
            for statement in POSTGRES_SCHEMA:
                if (trigger := TRIGGER.match(statement)) and self.has_trigger(*trigger.groups()):
                    continue
                self.sql(statement)
            for column, kind in ADDED_COLUMNS:
                if not self.has_column("effects", column):
                    kind = kind.replace("REAL", "DOUBLE PRECISION")
                    self.sql(f"ALTER TABLE effects ADD COLUMN {column} {kind}")

    def has_trigger(self, name, table):
        found = "SELECT 1 FROM pg_trigger WHERE tgname = ? AND tgrelid = to_regclass(?)"
        return self.sql(found, (name, table)).fetchone() is not None

    def has_column(self, table, column):
        found = (
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? AND column_name = ?"
        )
        return self.sql(found, (table, column)).fetchone() is not None

    def close(self):
        pass  # the caller's connection: the caller closes it

    @contextmanager
    def performing(self, key):
        """The key's session advisory lock, held from the claim to the receipt: a row found
        requested does not say whether its sender is alive (a worker whose lease another one
        took over may still be sending), the lock does: Postgres drops it with the session of a
        process that died. Taken: InFlight, and nothing is sent. A session's own lock is
        reentrant, so two performers need two connections."""
        ids = ("effect ledger", key)
        taken = "SELECT pg_try_advisory_lock(hashtext(?), hashtext(?)) AS taken"
        if not self.sql(taken, ids).fetchone()["taken"]:
            raise InFlight(key)
        try:
            yield
        finally:
            with suppress(Exception):  # a lost session has dropped the lock already
                self.sql("SELECT pg_advisory_unlock(hashtext(?), hashtext(?))", ids)

    @contextmanager
    def transaction(self):
        with self.db.transaction():
            yield

    def sql(self, statement, args=()):
        return self.db.execute(statement.replace("?", "%s"), args)

    def row(self, key, lock=False):
        lock_it = " FOR UPDATE" if lock else ""
        return self.sql("SELECT * FROM effects WHERE key = ?" + lock_it, (key,)).fetchone()
