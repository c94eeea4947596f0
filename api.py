"""The ticket receiver: the outside world that the workflow changes.

A small HTTP service (standard library only) that creates tickets and honours
an Idempotency-Key: the first request with a key creates a ticket, a repeat of
the same request gets the same ticket back, and the same key with a different
body is refused. It is the half of the effect gap that a checkpoint cannot see.

    GET  /health                 {"ok": true}
    GET  /tickets[?key=KEY]      {"tickets": [{"ticket_id", "key", "payload"}]}
    POST /tickets                body {"title": "..."}, optional Idempotency-Key
                                 201 created / 200 replayed / 409 key reused /
                                 400-413 bad input / 503 busy, retry same key
    HEAD is GET without the body; other methods on these paths get 405 with Allow,
    methods http.server does not know 501. Every answer is JSON; every error has an
    "error" field that says what to do. openapi.yaml describes it all (kept true by tests).

Configuration (environment, read in main()):
    RECEIVER_DB                data/receiver/receiver.sqlite
    HOST                       127.0.0.1 (compose sets 0.0.0.0)
    PORT                       8000
    RECEIVER_BUSY_TIMEOUT_S    2 (seconds to wait for the database before a 503)
    RECEIVER_SOCKET_TIMEOUT_S  5 (seconds a client may stall mid-request before a 408)
    RECEIVER_LAB_FAULTS        "" (off). "lost-ack" turns on a teaching fault: see
                               Handler.drop_response_once. Never set it in a real service.
"""

import json
import os
import re
import signal
import sqlite3
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

MAX_BODY_BYTES = 4096  # bytes: the largest valid body (200 titles chars, each a
#                        6-byte \uXXXX escape) is ~1.2 KiB; anything bigger is not a ticket.
MAX_TITLE_CHARS = 200  # characters: a ticket title, not a document.
MAX_KEY_CHARS = 200  # characters: room for "case-id:step:intent:version" keys or a hash.
KEY_PATTERN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_CHARS}}}")  # visible ASCII, so
#                        keys print, log and compare the same everywhere.
SOCKET_TIMEOUT_S = 5.0  # seconds a client may stall mid-request before we hang up;
#                         each connection has its own thread, so a staller blocks only itself.
LISTEN_BACKLOG = 128  # connections the kernel queues while threads are busy: a room of
#                       learners (64 clients at once) must queue, not be reset (default: 5).
BUSY_TIMEOUT_S = 2.0  # seconds to wait for the database before answering 503; twice this is
#                       still under the workflow's 5 s request timeout, so the client hears
#                       "busy, retry" instead of timing out with the outcome unknown.
DIGITS = re.compile(r"[0-9]+")  # a Content-Length; str.isdigit() would also accept "²" or "٣".
LAB_FAULTS = {"lost-ack"}  # the only fault switch this receiver knows.
LOST_ACK_HEADER = "Lab-Lost-Ack"  # value: a token; the first POST carrying it loses its answer.

SCHEMA = """CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY,
    operation_key TEXT UNIQUE,
    payload TEXT NOT NULL
)"""


class ClientError(Exception):
    """A request we refuse: the status and a message that tells the client what to do."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class TicketStore:
    """One SQLite connection behind a lock: SQLite has one writer at a time anyway."""

    def __init__(self, path, busy_timeout_s=BUSY_TIMEOUT_S):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.lock, self.busy_timeout_s = threading.Lock(), busy_timeout_s
        self.db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # WAL: one fsync per commit instead of three, and readers never wait for the writer.
        # synchronous=FULL keeps that fsync, so an acknowledged ticket survives a power cut.
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(SCHEMA)

    def close(self):
        with self.lock:  # waits for the transaction in flight, if any
            self.db.close()

    @contextmanager
    def locked(self):
        """Hold the connection's lock, waiting at most the busy timeout for it.

        While one request waits for a database that another process has locked, the
        others queue here; without a bound each would wait its own busy timeout in turn.
        With it a request waits at most twice the busy timeout (here, then in SQLite).
        """
        if not self.lock.acquire(timeout=self.busy_timeout_s):
            raise sqlite3.OperationalError("waited too long for the ticket store")
        try:
            yield
        finally:
            self.lock.release()

    def tickets(self, key=None):
        sql = "SELECT id, operation_key, payload FROM tickets"
        args = ()
        if key is not None:
            sql, args = sql + " WHERE operation_key = ?", (key,)
        with self.locked():
            rows = self.db.execute(sql + " ORDER BY id", args).fetchall()
        return [{"ticket_id": i, "key": k, "payload": json.loads(p)} for i, k, p in rows]

    def create(self, key, canonical):
        """Return (ticket_id, created), or raise ClientError(409) for a reused key.

        The lookup and the insert share one BEGIN IMMEDIATE transaction, so two
        requests with the same key cannot both miss the lookup and both insert.
        """
        with self.locked():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                prior = None
                if key is not None:
                    prior = self.db.execute(
                        "SELECT id, payload FROM tickets WHERE operation_key = ?", (key,)
                    ).fetchone()
                if prior is None:
                    cursor = self.db.execute(
                        "INSERT INTO tickets (operation_key, payload) VALUES (?, ?)",
                        (key, canonical),
                    )
                    result = (cursor.lastrowid, True)
                elif prior[1] == canonical:
                    result = (prior[0], False)
                else:
                    raise ClientError(
                        409,
                        f"Idempotency-Key {key!r} was already used for ticket {prior[0]} "
                        "with a different body; send a new key for a new operation",
                    )
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT may have rolled back already
                    self.db.execute("ROLLBACK")
                raise
        return result


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


class Handler(BaseHTTPRequestHandler):
    server_version = "TicketReceiver/1.0"
    # http.server assumes HTTP/0.9 until it has parsed a version, and 0.9 answers have no
    # status line: a malformed request line would get a bare body that no client can read.
    default_request_version = "HTTP/1.0"
    routes = {"/health": "GET, HEAD", "/tickets": "GET, HEAD, POST"}

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
        except sqlite3.Error as error:  # locked or busy for longer than BUSY_TIMEOUT_S
            self.log_line(f"unavailable: {error}")
            status, value = 503, {"error": "ticket store busy; retry with the same Idempotency-Key"}
            self.extra_headers["Retry-After"] = "1"
        except TimeoutError:
            status, value = 408, {"error": f"request not received within {self.timeout:g} s"}
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

    def setup(self):
        self.timeout = self.server.socket_timeout_s  # super().setup() applies it to the socket
        super().setup()
        self.extra_headers, self.body_read = {}, False

    def respond(self, status, value):
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

    def get(self, path):
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if path == "/health":
            return 200, {"ok": True}
        if set(query) - {"key"}:
            raise ClientError(400, "the only query parameter is ?key=IDEMPOTENCY-KEY")
        key = parse_key(query.get("key"), where="?key=")
        return 200, {"tickets": self.server.store.tickets(key)}

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
        if self.drop_response_once():
            return None, None
        return (201 if created else 200), {"ticket_id": ticket_id, "created": created}

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
        # Hanging up on unread bytes makes the kernel send a reset, which can destroy
        # our answer before the client reads it; so read a small unread body first.
        if self.body_read or not self.headers:
            return
        self.body_read = True
        try:
            length = self.content_length()
            if length <= MAX_BODY_BYTES:
                self.rfile.read(length)
        except (ClientError, OSError):
            pass

    def drop_response_once(self):
        """Teaching fault: commit, then hang up without answering (a lost acknowledgement).

        Needs RECEIVER_LAB_FAULTS=lost-ack on the server *and* a Lab-Lost-Ack token on
        the request; each token loses its answer once, so the caller's retry is answered.
        """
        token = self.headers.get(LOST_ACK_HEADER)
        if token is None or "lost-ack" not in self.server.faults:
            return False
        with self.server.fault_lock:
            if token in self.server.spent_tokens:
                return False
            self.server.spent_tokens.add(token)
        self.log_line(f"lost-ack fault: dropping the answer for token={token}")
        self.close_connection = True
        return True

    def log_line(self, text):
        sys.stderr.write(f"receiver: {text}\n")

    def log_message(self, format, *args):
        pass  # one decision line per POST (log_line) instead of an access log

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (malformed request line, 501 for unknown methods, ...)
        self.close_connection = True
        self.extra_headers = {"Connection": "close"}
        self.respond(code, {"error": message or self.responses.get(code, ("error",))[0]})


class TicketServer(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True  # SIGTERM must not wait for a stalled client

    def __init__(self, address, store, faults=frozenset(), socket_timeout_s=SOCKET_TIMEOUT_S):
        super().__init__(address, Handler)
        self.store, self.faults, self.socket_timeout_s = store, faults, socket_timeout_s
        self.fault_lock, self.spent_tokens = threading.Lock(), set()

    def handle_error(self, request, client_address):
        if isinstance(sys.exception(), ConnectionError):
            return  # the client hung up before reading its answer: no traceback for that
        super().handle_error(request, client_address)


def main():
    db_path = os.environ.get("RECEIVER_DB", "data/receiver/receiver.sqlite")
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    busy_timeout_s = float(os.environ.get("RECEIVER_BUSY_TIMEOUT_S", BUSY_TIMEOUT_S))
    socket_timeout_s = float(os.environ.get("RECEIVER_SOCKET_TIMEOUT_S", SOCKET_TIMEOUT_S))
    faults = {f for f in os.environ.get("RECEIVER_LAB_FAULTS", "").split(",") if f}
    if faults - LAB_FAULTS:
        sys.exit(f"receiver: unknown RECEIVER_LAB_FAULTS {sorted(faults - LAB_FAULTS)}")
    store = TicketStore(db_path, busy_timeout_s)
    try:
        server = TicketServer((host, port), store, frozenset(faults), socket_timeout_s)
    except OSError as error:
        store.close()
        sys.exit(f"receiver: cannot listen on {host}:{port}: {error.strerror}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds serve_forever below
    print(f"receiver: listening on {host}:{port}, tickets in {db_path}", file=sys.stderr)
    if faults:
        print(f"receiver: WARNING lab faults on: {sorted(faults)}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
        print("receiver: stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
