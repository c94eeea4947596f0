"""The ticket receiver: the outside world that the workflow changes.

A small HTTP service (standard library only) that creates tickets and honours an
Idempotency-Key. The first request with a key creates a ticket; a repeat of the same request
gets the same ticket back; the same key with a different body is refused (409). The whole idea
is in TicketStore.keyed: the lookup and the insert share one transaction on a UNIQUE column, and
the ticket is committed before the answer is written. A caller that dies after the commit and
before it reads the answer (the crash window) can only find its ticket again by sending the
same key, or by looking the key up (GET /tickets?key=).

    GET  /health                 200 {"ok": true}; 503 once the database file was deleted,
                                 or once the receiver met damage in it
    GET  /metrics                200, the Prometheus text format: tickets created, replays,
                                 key conflicts, keys pruned, answers by status, durations
    GET  /tickets[?key=KEY]      200 {"tickets": [{"ticket_id", "key", "payload"}]}, in id order
    POST /tickets                body {"title": "..."} (1-200 characters), optional
                                 Idempotency-Key (1-200 visible ASCII characters):
                                 201 {"ticket_id", "created": true}   a new ticket
                                 200 {"ticket_id", "created": false}  the same key and body again
                                 409 {"code": "key_conflict"} the key was used for another
                                 body: send a new key
Every answer but /metrics is JSON, HEAD is GET without the body, and every refusal has an
"error" field that says what to do (a 409 also a "code" for programs). A 503 with Retry-After:
1 (database busy, too many connections, disk full) asks for the same request with the same key
again; a 503 without it means the database file is damaged and an operator must act. Every
answer is counted in /metrics before its first byte is written.

What it stands on, each a file of its own: receiverdb.py (the SQLite connection and its
transactions), keyretention.py (how long a key is honoured), httpguard.py (a hardened
http.server), receivermetrics.py (/metrics), receiversettings.py (the environment's settings:
`python api.py --help` lists them). Another service grows from this one without changing it: a
subclass of TicketStore adds its tables (SCHEMA, COLUMNS, KEYED) and methods, a subclass of
Handler its routes (routes, make, get, post) and counters, and main(store=..., handler=...)
serves them.
"""

import argparse
import json
import os
import re
import signal
import sqlite3
import sys
import time
from urllib.parse import parse_qs, urlsplit

import keyretention
import tracing
from failpoints import fail
from httpguard import Body, ClientError, GuardedHandler, parse_json_body
from keyretention import forget_expired, rows_with_keys
from receiverdb import UNUSABLE, ReceiverDatabase, StoreDamaged
from receivermetrics import PROMETHEUS_TEXT
from receiversettings import EXIT_INTERRUPTED, SETTINGS_HELP, ConfigError, open_server

TICKETS = """CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,  -- NULL: sent without a key, or its key was pruned
    payload TEXT NOT NULL,
    created_at REAL  -- Unix time of the commit
)"""
POINTS = ("before-commit", "after-commit")  # this program's failpoints
COUNTERS = {  # name -> its help text; a service with more routes adds its own
    "tickets_created": "POSTs that created a ticket (answered 201).",
    "idempotent_replays": "POSTs answered 200 with what their key made before.",
    "key_conflicts": "POSTs refused 409: a key sent again with another body.",
    **keyretention.COUNTERS,
}


class TicketStore(ReceiverDatabase):
    """The tickets, in one SQLite file (receiverdb.ReceiverDatabase: one connection, one writer).

    SCHEMA, COLUMNS and KEYED say which tables it makes, what they hold and which are keyed by
    an operation key (table: noun); a subclass extends them for tables of its own."""

    SCHEMA = (TICKETS,)
    COLUMNS = {"tickets": {"id", "operation_key", "payload", "created_at"}}
    KEYED = {"tickets": "ticket"}

    def keyed(self, table, key, canonical, columns=None, check=None):
        """Return (id, created) of the row in table that key made, or of a new one; raise
        KeyConflict (409) for a key made for another body.

        The lookup and the insert share one BEGIN IMMEDIATE transaction (it takes the write
        lock first), so two requests with the same key cannot both miss the lookup and both
        insert. COMMIT returns before the caller writes its answer. check(), when given, runs
        in the same transaction before a new row is made, and may refuse it (a ClientError).
        """
        columns = columns or {}
        with self.transaction():
            prior = None
            if key is not None:
                forget_expired(self, table, key)  # a key past the retention is not honoured
                prior = self.db.execute(
                    f"SELECT id, payload FROM {table} WHERE operation_key = ?", (key,)
                ).fetchone()
            if prior is None:
                if check is not None:
                    check()
                names = ", ".join(["operation_key", "payload", "created_at", *columns])
                marks = ", ".join("?" * (3 + len(columns)))
                cursor = self.db.execute(
                    f"INSERT INTO {table} ({names}) VALUES ({marks})",
                    (key, canonical, time.time(), *columns.values()),
                )
                return cursor.lastrowid, True
            if prior[1] == canonical:
                return prior[0], False
            raise KeyConflict(
                409,
                f"Idempotency-Key {key!r} was already used for {self.KEYED[table]} {prior[0]} "
                "with a different body; send a new key for a new operation",
            )

    def create(self, key, canonical):
        """A ticket: (ticket_id, created)."""
        return self.keyed("tickets", key, canonical)

    def tickets(self, key=None):
        """All tickets, or the one made with key; a key past the retention shows as null."""
        rows = rows_with_keys(self, "tickets", "payload", key)
        return [{"ticket_id": i, "key": k, "payload": json.loads(p)} for i, k, p in rows]

    # helpers

    def create_tables(self):
        super().create_tables()
        keyretention.index_keys_by_age(self)


class Handler(GuardedHandler):
    """The routes; httpguard.GuardedHandler turns their results and refusals into answers.

    A keyed POST goes through post(): the key read, make() called, the result counted and
    logged, then the answer. A subclass adds a keyed route by extending routes and make()."""

    routes = {"/health": "GET, HEAD", "/tickets": "GET, HEAD, POST", "/metrics": "GET, HEAD"}

    @tracing.serves  # with TRACE: a span, joined to the caller's by its traceparent header
    def post(self, path):
        body = self.read_body()
        # Whitespace around a header value is not part of it (RFC 9110, 5.5).
        key = parse_key([v.strip(" \t") for v in self.headers.get_all("Idempotency-Key", [])])
        noun = self.server.store.KEYED[path.lstrip("/")]
        tracing.note({tracing.KEY: key})
        # Read, not yet made: a request still at the provider (a test holds it here, once per
        # body, to kill its sender there; a resend under the key passes and finds the key).
        fail("before-commit", once_per=(key, body))  # body: the bytes read
        try:
            made, created = self.make(path, key, body)
        except KeyConflict:
            tracing.note({"receiver.conflict": True})
            self.server.metrics.add("key_conflicts")
            self.log_line(f"conflict key={key}")
            raise
        self.server.metrics.add(f"{noun}s_created" if created else "idempotent_replays")
        tracing.note({"receiver.replay": not created, f"{noun}.id": made})
        self.log_line(f"{'created' if created else 'replayed'} key={key} {noun}={made}")
        # The ticket is committed BEFORE the answer is written. A crash from here on leaves
        # a ticket the caller never heard about: the effect gap. Only the key lets the
        # caller's retry find it again instead of creating a second one.
        fail("after-commit")
        return (201 if created else 200), {f"{noun}_id": made, "created": created}

    def make(self, path, key, body):
        """What a keyed POST to path makes, or made before under key: (id, created)."""
        return self.server.store.create(key, parse_ticket(body))

    def get(self, path):
        if path == "/health":
            self.server.store.check_usable()  # up, serving RECEIVER_DB, no damage met in it
            return 200, {"ok": True}
        if path == "/metrics":
            return 200, Body(PROMETHEUS_TEXT, self.server.metrics.render().encode())
        return 200, {"tickets": self.server.store.tickets(self.query_key())}

    def query_key(self):
        """The ?key= of a GET, or None; any other query parameter is refused (400)."""
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if set(query) - {"key"}:
            raise ClientError(400, "the only query parameter is ?key=IDEMPOTENCY-KEY")
        return parse_key(query.get("key"), where="?key=")

    # helpers

    counters = COUNTERS  # what /metrics counts (receivermetrics.Metrics)
    log_prefix = "receiver"
    max_body_bytes = 4096  # bytes: the largest valid body (200 title characters, each outside
    #                        the BMP and escaped as a 12-byte surrogate pair) is ~2.4 KiB;
    #                        anything bigger is not a ticket.

    unavailable_errors = (sqlite3.Error,)  # locked past the busy timeout, disk full, deleted...

    def unavailable(self, error):
        if isinstance(error, UNUSABLE):
            if error.first:  # one line in the log, however many requests meet it
                self.log_line(f"unavailable: {error}")
            return str(error)
        self.log_line(f"unavailable: {error}")
        return "ticket store busy or unavailable; retry with the same Idempotency-Key"

    def retryable(self, error):
        return not isinstance(error, StoreDamaged)  # no retry mends a damaged file

    def refused(self, error):
        if self.command == "POST" and not isinstance(error, KeyConflict):  # post() logs those
            self.log_line(f"rejected {error.status}: {error.message}")


def main(
    argv=None,
    store=TicketStore,
    handler=Handler,
    known=POINTS,
    prog="api.py",
    doc=None,
    epilog=SETTINGS_HELP,
):
    """Serve until SIGTERM or Ctrl-C; the exit code. A service built on this one passes its own
    store and handler classes, its failpoints (known), and for --help its name, docstring and
    settings (epilog)."""
    doc = doc or __doc__
    argparse.ArgumentParser(
        prog=prog,
        description=f"{doc.splitlines()[0]} It takes no arguments: settings come from the "
        "environment.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    try:
        server, where, points = open_server(os.environ, store, handler, known)
    except ConfigError as error:
        print(f"receiver: {error}", file=sys.stderr)
        return error.exit_code
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds serve_forever below
    print(f"receiver: {where}", file=sys.stderr)
    stop_pruning = keyretention.start_pruner(server.store)
    if points:
        on = ", ".join(f"{name}={action}" for name, action in points.items())
        print(f"receiver: WARNING failpoints on: {on}; never in a real service", file=sys.stderr)
    code = 0
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    finally:
        stop_pruning.set()
        server.server_close()
        server.store.close()
        print("receiver: stopped", file=sys.stderr)
    return code


# helpers


class KeyConflict(ClientError):
    """A key sent again with another body (409): counted as key_conflicts."""

    code = "key_conflict"


MAX_TITLE_CHARS = 200  # characters: a ticket title, not a document.
MAX_KEY_CHARS = 200  # characters: space for "case-id:step:intent:version" keys or a hash.
KEY_PATTERN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_CHARS}}}")  # visible ASCII, so
#                        keys print, log and compare the same everywhere.


class DuplicateName(ValueError):
    """A JSON object that names a field twice: which value counts is up to each parser."""


def unique_names(pairs):
    """json's object_pairs_hook: the object, or DuplicateName for a field named twice."""
    seen = set()
    for name, _ in pairs:
        if name in seen:
            raise DuplicateName(json.dumps(name, ensure_ascii=True))
        seen.add(name)
    return dict(pairs)


def parse_ticket(body):
    """Validate a POST /tickets body; return its canonical JSON (sorted keys, no spaces)."""
    title = parse_object(body, '{"title": "..."}', "title")["title"]
    if not isinstance(title, str) or not 1 <= len(title) <= MAX_TITLE_CHARS:
        raise ClientError(400, f"title must be a string of 1-{MAX_TITLE_CHARS} characters")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell half a UTF-16 pair ("\ud800"): not a character
        raise ClientError(400, "title has a lone surrogate escape; send real characters") from None
    return canonical({"title": title})


def parse_object(body, example, *fields):
    """The JSON object in body, which must have exactly these fields."""
    try:
        payload = parse_json_body(body, example, unique_names, DuplicateName)
    except DuplicateName as error:
        raise ClientError(400, f"body names {error} twice; send it once") from None
    if not isinstance(payload, dict):
        raise ClientError(400, f"body must be a JSON object like {example}")
    if set(payload) != set(fields):
        names = " and ".join(f'"{name}"' for name in fields)
        what = "one field" if len(fields) == 1 else "the fields"
        raise ClientError(400, f"body must have exactly {what}, {names}")
    return payload


def canonical(payload):
    """Sorted keys, no spaces: the same body however it was spelled."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_key(values, where="Idempotency-Key"):
    """None when absent; the key when exactly one valid key was sent."""
    if not values:
        return None
    if len(values) > 1:
        raise ClientError(400, f"send {where} once, not {len(values)} times")
    if not KEY_PATTERN.fullmatch(values[0]):
        raise ClientError(
            400, f"{where} must be 1-{MAX_KEY_CHARS} visible ASCII characters (no spaces)"
        )
    return values[0]


if __name__ == "__main__":
    sys.exit(main())
