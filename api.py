"""The ticket receiver: the outside world that the workflow changes.

A small HTTP service (standard library only) that creates tickets and honours an
Idempotency-Key. The first request with a key creates a ticket; a repeat of the same request
gets the same ticket back; the same key with a different body is refused (409). The whole
idea is in TicketStore.create: the lookup and the insert share one transaction on a UNIQUE
column, and the ticket is committed before the answer is written. A caller that dies after
the commit and before it reads the answer (the crash window) can only find its ticket again
by sending the same key.

    GET  /health                 {"ok": true}
    GET  /tickets[?key=KEY]      {"tickets": [{"ticket_id", "key", "payload"}]}
    POST /tickets                body {"title": "..."}, optional Idempotency-Key
                                 201 created / 200 replayed / 409 key reused /
                                 400-414 bad input / 503 busy or full, retry the same key
Every answer is JSON; every error has an "error" field that says what to do. openapi.yaml
describes them all (kept true by tests).

Configuration (environment, read in main()):
    RECEIVER_DB                  data/receiver/receiver.sqlite
    HOST                         127.0.0.1 (compose sets 0.0.0.0)
    PORT                         8000
    RECEIVER_BUSY_TIMEOUT_S      2 (seconds to wait for the database before a 503)
    RECEIVER_REQUEST_TIMEOUT_S   5 (seconds a client has to send its whole request)
    RECEIVER_MAX_CONNECTIONS     256 (connections served at once; more get a quick 503)
"""
# lab-only: begin
#   RECEIVER_LAB_FAULTS          "" (off). "lost-ack" turns on a teaching fault (see the lab
#                                section at the end). Never set it in a real service.
# lab-only: end

import argparse
import io
import json
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
import time
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

SCHEMA = """CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,
    payload TEXT NOT NULL
)"""
BUSY_TIMEOUT_S = 2.0  # seconds to wait for the database before answering 503; twice this is
#                       still under the workflow's 5 s request timeout, so the client hears
#                       "busy, retry" instead of timing out with the outcome unknown.


class TicketStore:
    """One SQLite connection behind a lock: SQLite has one writer at a time anyway."""

    def create(self, key, canonical):
        """Return (ticket_id, created), or raise ClientError(409) for a reused key.

        The lookup and the insert share one BEGIN IMMEDIATE transaction (it takes the write
        lock first), so two requests with the same key cannot both miss the lookup and both
        insert. COMMIT returns before the caller writes its answer.
        """
        with self.transaction():
            prior = None
            if key is not None:
                prior = self.db.execute(
                    "SELECT id, payload FROM tickets WHERE operation_key = ?", (key,)
                ).fetchone()
            if prior is None:
                cursor = self.db.execute(
                    "INSERT INTO tickets (operation_key, payload) VALUES (?, ?)", (key, canonical)
                )
                return cursor.lastrowid, True
            if prior[1] == canonical:
                return prior[0], False
            raise ClientError(
                409,
                f"Idempotency-Key {key!r} was already used for ticket {prior[0]} "
                "with a different body; send a new key for a new operation",
            )

    def tickets(self, key=None):
        sql = "SELECT id, operation_key, payload FROM tickets"
        args = ()
        if key is not None:
            sql, args = sql + " WHERE operation_key = ?", (key,)
        with self.locked():
            rows = self.db.execute(sql + " ORDER BY id", args).fetchall()
        return [{"ticket_id": i, "key": k, "payload": json.loads(p)} for i, k, p in rows]

    # helpers

    def __init__(self, path, busy_timeout_s=BUSY_TIMEOUT_S):
        self.lock, self.busy_timeout_s = threading.Lock(), busy_timeout_s
        self.db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # WAL with synchronous=FULL: an acknowledged ticket survives a power cut, at one
        # sync of the WAL file per commit (the rollback journal needs four: see the README).
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        if sys.platform == "darwin":  # macOS fsync() does not reach the platter; F_FULLFSYNC does
            self.db.execute("PRAGMA fullfsync=ON")
        self.db.execute(SCHEMA)

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT under the lock; any exception rolls back."""
        with self.locked():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT may have rolled back already
                    self.db.execute("ROLLBACK")
                raise

    @contextmanager
    def locked(self):
        """Hold the connection's lock, waiting at most the busy timeout for it.

        Reads and writes share the one connection, so a read waits behind a write here. While
        one request waits for a database that another process has locked, the others queue
        here; with the bound, a request waits at most twice the busy timeout (here, then in
        SQLite) before its 503.
        """
        if not self.lock.acquire(timeout=self.busy_timeout_s):
            raise sqlite3.OperationalError("waited too long for the ticket store")
        try:
            yield
        finally:
            self.lock.release()

    def close(self, wait_s=0.2):
        """Close unless a request holds the connection; the process is exiting either way."""
        if self.lock.acquire(timeout=wait_s):  # SIGTERM must not wait out a locked database
            self.db.close()
            self.lock.release()


class Handler(BaseHTTPRequestHandler):
    server_version = "TicketReceiver/1.0"
    routes = {"/health": "GET, HEAD", "/tickets": "GET, HEAD, POST"}

    def post(self, path):
        body = self.read_body()
        # Whitespace around a header value is not part of it (RFC 9110, 5.5).
        key = parse_key([v.strip(" \t") for v in self.headers.get_all("Idempotency-Key", [])])
        canonical = parse_ticket(body)
        try:
            ticket_id, created = self.server.store.create(key, canonical)
        except ClientError:
            self.log_line(f"conflict key={key}")
            raise
        self.log_line(f"{'created' if created else 'replayed'} key={key} ticket={ticket_id}")
        # The ticket is committed BEFORE the answer is written. A crash from here on leaves
        # a ticket the caller never heard about: the effect gap. Only the key lets the
        # caller's retry find it again instead of creating a second one.
        if self.server.lab_faults.drop_answer(self):  # lab-only
            return None, None  # lab-only
        return (201 if created else 200), {"ticket_id": ticket_id, "created": created}

    def get(self, path):
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if path == "/health":
            return 200, {"ok": True}
        if set(query) - {"key"}:
            raise ClientError(400, "the only query parameter is ?key=IDEMPOTENCY-KEY")
        key = parse_key(query.get("key"), where="?key=")
        return 200, {"tickets": self.server.store.tickets(key)}

    # One place maps every outcome to an HTTP answer.
    def handle_request(self, action):
        try:
            path = urlsplit(self.path).path
            allowed = self.routes.get(path)
            if allowed is None:
                raise ClientError(404, f"no such path {path!r}; try /tickets")
            if self.command not in allowed.split(", "):
                raise ClientError(405, f"{path} accepts {allowed}", {"Allow": allowed})
            status, value = action(path)
        except ClientError as error:
            status, value = error.status, {"error": error.message}
            self.extra_headers.update(error.headers)
            if self.command == "POST" and status != 409:
                self.log_line(f"rejected {status}: {error.message}")
        except sqlite3.Error as error:  # locked past the busy timeout, disk full, I/O error...
            self.log_line(f"unavailable: {error}")
            status, value = (
                503,
                {"error": "ticket store busy or unavailable; retry with the same Idempotency-Key"},
            )
            self.extra_headers["Retry-After"] = "1"
        except TimeoutError:
            status, value = 408, {"error": f"request not received within {self.timeout_s:g} s"}
            self.close_connection = True
        except ConnectionError:
            self.close_connection = True  # the client left: nobody to answer
            return
        except Exception as error:  # a bug: still answer, rather than drop the connection
            self.log_line(f"internal error: {error!r}")
            status, value = 500, {"error": "internal error; retry with the same Idempotency-Key"}
            self.close_connection = True
        if value is not None:
            self.discard_unread_body()
            self.respond(status, value)

    # helpers: HTTP plumbing and the limits that keep a slow or hostile client small

    # http.server assumes HTTP/0.9 until it has parsed a version, and 0.9 answers have no
    # status line: a malformed request line would get a bare body that no client can read.
    default_request_version = "HTTP/1.0"

    def setup(self):
        super().setup()
        self.timeout_s = self.server.request_timeout_s
        self.rfile.close()  # replaced: its reads would each get a fresh timeout
        # One deadline for the whole request, not per read: a client trickling a byte a
        # second would otherwise hold its thread for ever.
        raw = DeadlineReader(self.connection, time.monotonic() + self.timeout_s)
        self.rfile = io.BufferedReader(raw)
        self.extra_headers, self.body_read, self.linger = {}, False, False

    def respond(self, status, value):
        self.connection.settimeout(self.timeout_s)  # the reads may have left it near zero
        data = json.dumps(value, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, header in self.extra_headers.items():
            self.send_header(name, header)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self):
        self.handle_request(self.get)

    def do_POST(self):
        self.handle_request(self.post)

    def do_other(self):
        self.handle_request(lambda path: None)  # known paths get 405, others 404

    do_HEAD = do_GET  # respond() leaves the body out
    # Methods http.server does not find here get its 501 (send_error), as RFC 9110 asks.
    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = do_other

    def read_body(self):
        if self.headers.get("Transfer-Encoding"):
            raise ClientError(411, "send the body with a Content-Length, not chunked")
        length = self.content_length()
        if length > MAX_BODY_BYTES:
            raise ClientError(413, f"body larger than {MAX_BODY_BYTES} bytes")
        self.body_read = True
        body = self.rfile.read(length)
        if len(body) != length:
            raise ClientError(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def content_length(self):
        values = self.headers.get_all("Content-Length") or []
        if not values:
            raise ClientError(411, "send a Content-Length header")
        if len(values) > 1:  # two lengths: which one frames the body is up to each parser
            raise ClientError(400, "send Content-Length once")
        if not DIGITS.fullmatch(values[0].strip()):  # also refuses "-1", "+1", "1e3"
            raise ClientError(400, "Content-Length must be a non-negative whole number")
        return int(values[0])

    def discard_unread_body(self):
        # Hanging up on unread bytes makes the kernel send a reset, which can destroy our
        # answer before the client reads it: read a small unread body now, and after an
        # answer to a large one, stop sending and read what is left (finish() below).
        if self.body_read or not self.headers:
            return
        self.body_read = True
        try:
            if self.content_length() <= MAX_BODY_BYTES:
                self.rfile.read(self.content_length())
                return
        except (ClientError, OSError):
            pass
        self.linger, self.close_connection = True, True

    def finish(self):
        super().finish()
        if self.linger:  # the answer is sent: half-close, then drain until the client hangs up
            try:
                self.connection.shutdown(socket.SHUT_WR)
                self.connection.settimeout(LINGER_S)
                drained = 0
                while drained < MAX_LINGER_BYTES and (chunk := self.connection.recv(65536)):
                    drained += len(chunk)
            except OSError:
                pass

    def log_line(self, text):
        sys.stderr.write(f"receiver: {text}\n")

    def log_message(self, format, *args):
        pass  # one decision line per POST (log_line) instead of an access log

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (a malformed request line, 414, 501, 505, ...)
        self.close_connection = True
        self.extra_headers = {"Connection": "close"}
        self.respond(code, {"error": message or self.responses.get(code, ("error",))[0]})


class TicketServer(ThreadingHTTPServer):
    """A thread per connection, at most max_connections of them."""

    request_queue_size = 128  # connections the kernel queues while threads are busy: a
    #                           room of 64 learners at once must queue, not be reset (default 5)
    daemon_threads = True  # SIGTERM must not wait for a stalled client

    def __init__(self, address, store, request_timeout_s, max_connections):
        super().__init__(address, Handler)
        self.store, self.request_timeout_s = store, request_timeout_s
        self.slots = threading.BoundedSemaphore(max_connections)
        self.lab_faults = LabFaults(frozenset())  # lab-only

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):  # full: answer at once, start no thread
            # Read what the client has sent first: closing on unread bytes would reset the
            # connection and could destroy the answer before the client reads it.
            request.settimeout(REFUSE_READ_S)
            with suppress(OSError):  # nothing sent yet (a timeout), or the client left
                request.recv(MAX_BODY_BYTES)
            with suppress(OSError):
                request.sendall(FULL_ANSWER)  # small: it fits the socket's send buffer
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        if isinstance(sys.exception(), ConnectionError):
            return  # the client hung up before reading its answer: no traceback for that
        super().handle_error(request, client_address)


class ClientError(Exception):
    """A request we refuse: the status and a message that tells the client what to do."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each allowed only the time left until one deadline."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline = sock, deadline

    def readable(self):
        return True

    def readinto(self, buffer):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


# helpers: input validation

MAX_BODY_BYTES = 4096  # bytes: the largest valid body (200 title characters, each outside the
#                        BMP and escaped as a 12-byte surrogate pair) is ~2.4 KiB; anything
#                        bigger is not a ticket.
MAX_TITLE_CHARS = 200  # characters: a ticket title, not a document.
MAX_KEY_CHARS = 200  # characters: room for "case-id:step:intent:version" keys or a hash.
KEY_PATTERN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_CHARS}}}")  # visible ASCII, so
#                        keys print, log and compare the same everywhere.
DIGITS = re.compile(r"[0-9]+")  # a Content-Length; str.isdigit() would also accept "²" or "٣".
REQUEST_TIMEOUT_S = 5.0  # seconds for a whole request, headers and body; loopback needs ms.
MAX_CONNECTIONS = 256  # connections served at once, a thread each (~8 MiB virtual, little
#                        resident); one more gets FULL_ANSWER at once instead of a thread.
REFUSE_READ_S = 0.05  # seconds the accepting thread waits for a refused client's request
LINGER_S = 1.0  # seconds to drain an unread oversized body after its 413 before closing
MAX_LINGER_BYTES = 1 << 20  # bytes drained at most; a client sending more is cut off
FULL_BODY = b'{"error": "too many connections; retry with the same key in a moment"}'
FULL_ANSWER = (  # written by the accepting thread itself, so it is prepared once
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(FULL_BODY), FULL_BODY)
)


class DuplicateName(ValueError):
    """A JSON object that names a field twice: which value counts is up to each parser."""


def unique_names(pairs):
    seen = set()
    for name, _ in pairs:
        if name in seen:
            raise DuplicateName(json.dumps(name, ensure_ascii=True))
        seen.add(name)
    return dict(pairs)


def parse_ticket(body):
    """Validate a POST body; return its canonical JSON (sorted keys, no spaces)."""
    try:
        payload = json.loads(body.decode("utf-8"), object_pairs_hook=unique_names)
    except UnicodeDecodeError:
        raise ClientError(400, "body is not valid UTF-8") from None
    except RecursionError:
        raise ClientError(400, 'body is nested too deeply; send {"title": "..."}') from None
    except DuplicateName as error:
        raise ClientError(400, f"body names {error} twice; send it once") from None
    except ValueError:
        raise ClientError(400, 'body is not valid JSON; send {"title": "..."}') from None
    if not isinstance(payload, dict):
        raise ClientError(400, 'body must be a JSON object like {"title": "..."}')
    if set(payload) != {"title"}:
        raise ClientError(400, 'body must have exactly one field, "title"')
    title = payload["title"]
    if not isinstance(title, str) or not 1 <= len(title) <= MAX_TITLE_CHARS:
        raise ClientError(400, f"title must be a string of 1-{MAX_TITLE_CHARS} characters")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell half a UTF-16 pair ("\ud800"): not a character
        raise ClientError(400, "title has a lone surrogate escape; send real characters") from None
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


# helpers: the command line

EXIT_CONFIG, EXIT_CANNOT_LISTEN = 2, 3  # a bad setting / RECEIVER_DB; the port is taken


class ConfigError(Exception):
    """A setting that cannot work: one line on stderr, exit EXIT_CONFIG or as given."""

    def __init__(self, message, exit_code=EXIT_CONFIG):
        super().__init__(message)
        self.exit_code = exit_code


def setting(environ, name, default, kind=float, low=0, high=float("inf")):
    """The variable's value, which must lie strictly between low and high."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low < value < high:
        what = "a whole number" if kind is int else "a number"
        limits = f"above {low:g}" + (f" and below {high:g}" if high < float("inf") else "")
        raise ConfigError(f"{name}={text!r} must be {what} {limits}")
    return value


def open_server(environ):
    """Read the settings, open the store and the listening socket; ConfigError if one fails."""
    db_path = environ.get("RECEIVER_DB", "data/receiver/receiver.sqlite")
    host = environ.get("HOST", "127.0.0.1")
    port = setting(environ, "PORT", 8000, int, -1, 65536)
    busy_timeout_s = setting(environ, "RECEIVER_BUSY_TIMEOUT_S", BUSY_TIMEOUT_S)
    request_timeout_s = setting(environ, "RECEIVER_REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S)
    max_connections = setting(environ, "RECEIVER_MAX_CONNECTIONS", MAX_CONNECTIONS, int)
    faults = lab_faults(environ)  # lab-only
    try:
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        store = TicketStore(db_path, busy_timeout_s)
    except (OSError, sqlite3.Error) as error:
        raise ConfigError(f"RECEIVER_DB {db_path!r} cannot be used: {error}") from None
    try:
        server = TicketServer((host, port), store, request_timeout_s, max_connections)
    except OSError as error:
        store.close()
        reason = error.strerror or str(error)
        hint = "stop what uses it, or set PORT to a free one" if port else "check HOST"
        raise ConfigError(
            f"cannot listen on {host}:{port} ({reason}); {hint}", EXIT_CANNOT_LISTEN
        ) from None
    server.lab_faults = LabFaults(faults)  # lab-only
    return server, f"listening on {host}:{server.server_port}, tickets in {db_path}"


def main(argv=None):
    argparse.ArgumentParser(
        prog="api.py",
        description="The ticket receiver. It takes no arguments: settings come from the "
        "environment.",
        epilog=__doc__[__doc__.index("Configuration") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    try:
        server, where = open_server(os.environ)
    except ConfigError as error:
        print(f"receiver: {error}", file=sys.stderr)
        return error.exit_code
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds serve_forever below
    print(f"receiver: {where}", file=sys.stderr)
    server.lab_faults.warn()  # lab-only
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.store.close()
        print("receiver: stopped", file=sys.stderr)
    return 0


# lab-only: begin
# --- lab only: the teaching fault ------------------------------------------------------------
# Lab 06 needs a receiver that commits a ticket and then never answers (a lost acknowledgement).
# It takes RECEIVER_LAB_FAULTS=lost-ack on the server *and* a Lab-Lost-Ack: TOKEN header on the
# request; each token loses its answer once, so the caller's retry is answered. The spent tokens
# live in memory only: a restart arms every token again. `make starter` drops this section.

KNOWN_FAULTS = {"lost-ack"}
LOST_ACK_HEADER = "Lab-Lost-Ack"


def lab_faults(environ):
    faults = {f for f in environ.get("RECEIVER_LAB_FAULTS", "").split(",") if f}
    if faults - KNOWN_FAULTS:
        raise ConfigError(f"unknown RECEIVER_LAB_FAULTS {sorted(faults - KNOWN_FAULTS)}")
    return frozenset(faults)


class LabFaults:
    def __init__(self, faults):
        self.faults, self.lock, self.spent_tokens = faults, threading.Lock(), set()

    def warn(self):
        if self.faults:
            print(f"receiver: WARNING lab faults on: {sorted(self.faults)}", file=sys.stderr)

    def drop_answer(self, handler):
        """True (and the connection closes unanswered) the first time a token is seen."""
        token = handler.headers.get(LOST_ACK_HEADER)
        if token is None or "lost-ack" not in self.faults:
            return False
        with self.lock:
            if token in self.spent_tokens:
                return False
            self.spent_tokens.add(token)
        handler.log_line(f"lost-ack fault: dropping the answer for token={token}")
        handler.close_connection = True
        return True


# lab-only: end

if __name__ == "__main__":
    sys.exit(main())
