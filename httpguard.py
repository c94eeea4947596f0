"""A hardened http.server for small JSON services: standard library only.

Python's http.server trusts its client: a client that trickles its request a byte at a time
holds a thread for ever, an unread body turns the answer into a connection reset, a burst of
connections starts a thread each without bound, and a bare CR inside a header line starts a new
header (its parser, email.parser, takes CR for a line break). This module closes those holes and
leaves the routes to the service:

    class Handler(GuardedHandler):
        routes = {"/things": "GET, HEAD, POST"}
        def get(self, path): return 200, {"things": [...]}
        def post(self, path): body = self.read_body(); ...; return 201, {...}

    GuardedServer((host, port), Handler, request_timeout_s, max_connections).serve_forever()

Every answer is JSON, unless a route returns a Body of another content type. A route refuses a
request by raising ClientError(status, message, code=...), whose message tells the client what
to do (and whose code, when given, lets a program tell refusals of one status apart); an
exception type listed in the handler's `unavailable_errors` (a database that is locked or gone)
becomes a 503, with Retry-After unless the handler's `retryable(error)` says a retry cannot help;
any other exception a 500. Nothing here knows what the service stores.

A body is read as JSON with parse_json_body (a 400 that says why for bytes that are not UTF-8,
not JSON, or nested deeper than the parser's recursion limit). A webhook is signed and checked as
the Standard Webhooks specification says (standardwebhooks.com): headers webhook-id,
webhook-timestamp and webhook-signature, "v1," and the base64 HMAC-SHA256 of
"ID.TIMESTAMP.BODY" under a secret "whsec_" + base64 key bytes (signed_headers; the endpoint
that takes them computes signature() again and compares). While a secret is replaced, the
sender signs with each of several (webhook_keys) and the endpoint accepts any.
"""

import base64
import binascii
import hashlib
import hmac
import io
import json
import re
import socket
import sys
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import urlsplit

REQUEST_TIMEOUT_S = 5.0  # seconds for a whole request, headers and body
MAX_CONNECTIONS = 256  # connections served at once, a thread each (its stack mostly virtual
#                        memory, reserved, not used); one more gets a quick 503 instead.
LISTEN_BACKLOG = 128  # connections the kernel queues while threads are busy: a burst of
#                       clients connecting at once must queue, not be reset (http.server: 5)
REFUSE_READ_S = 0.05  # seconds the accepting thread waits for a refused client's request
REFUSE_READ_BYTES = 65536  # bytes of it read at most before the 503 (one recv)
LINGER_S = 1.0  # seconds to drain an unread oversized body after its 413 before closing
MAX_LINGER_BYTES = 1 << 20  # bytes drained at most; a client sending more is cut off
# A Content-Length's digits: str.isdigit() would also accept "²" or "٣".
CONTENT_LENGTH_DIGITS = re.compile(r"[0-9]+")
# A header line's control characters but tab (RFC 9110 5.5: a field value is visible
# characters, spaces and tabs); CR and LF among them once the line's own ending is cut off: a
# bare CR must not start a header.
CONTROL_CHARACTER = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
RETRY_HINT = "retry the same request, with the same Idempotency-Key"
BUSY_BODY = json.dumps({"error": f"too many connections; {RETRY_HINT}, in a moment"}).encode()
TOO_MANY_CONNECTIONS = (  # written by the accepting thread itself, so it is prepared once
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BUSY_BODY), BUSY_BODY)
)


MIN_SECRET_BYTES = 24  # Standard Webhooks' symmetric secret: "At least 24 bytes (192 bits)"
DEFAULT_WEBHOOK_SECRET = "whsec_c3RhdGVmdWwtYWdlbnQtbGFiIHdlYmhvb2tzLCBsYWIgb25seQ=="  # the
#   WEBHOOK_SECRET of both sides unless set: public, so it proves nothing; set your own


NO_SUCH_PATH = "no such path"  # how a 404 for a path no route serves begins: a wrong address


class ClientError(Exception):
    """A request we refuse: the status and a message that tells the client what to do."""

    code = None  # a subclass may name its kind of refusal for programs: the body's "code"

    def __init__(self, status, message, headers=None, code=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}
        self.code = code or self.code


def parse_json_body(body, example, object_pairs_hook=None, hook_errors=()):
    """The JSON value in body (bytes); ClientError(400) that says why it is not one. A body
    nested deeper than Python's recursion limit is refused as such, never a RecursionError.
    hook_errors: what object_pairs_hook raises, passed on for the caller to word."""
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=object_pairs_hook)
    except UnicodeDecodeError:
        raise ClientError(400, "body is not valid UTF-8") from None
    except RecursionError:
        raise ClientError(400, f"body is nested too deeply; send {example}") from None
    except hook_errors:
        raise
    except ValueError:
        raise ClientError(400, f"body is not valid JSON; send {example}") from None


def webhook_key(secret):
    """The HMAC key of a Standard Webhooks secret, "whsec_" + base64; ValueError if it is not,
    or if it is shorter than the spec's symmetric secret: "At least 24 bytes (192 bits)"."""
    encoded = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith("whsec_") or not key:
        raise ValueError("a webhook secret is whsec_ and the base64 of at least 24 random bytes")
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"a secret of {len(key)} bytes is too short: Standard Webhooks asks for at least "
            f"{MIN_SECRET_BYTES} random bytes (192 bits) under its whsec_"
        )
    return key


def webhook_keys(setting):
    """The keys of WEBHOOK_SECRET: one secret, or several space-separated while one replaces
    another (the spec's zero-downtime rotation: sign with each, accept any); ValueError says
    which is not one."""
    secrets = setting.split()
    if not secrets:
        raise ValueError("a webhook secret is whsec_ and the base64 of at least 24 random bytes")
    keys = []
    for number, secret in enumerate(secrets, 1):
        try:
            keys.append(webhook_key(secret))
        except ValueError as error:
            raise ValueError(
                f"secret {number} of {len(secrets)}: {error}" if len(secrets) > 1 else str(error)
            ) from None
    return tuple(keys)


def signature(key, message_id, timestamp, body):
    """v1,<base64 HMAC-SHA256 of "ID.TIMESTAMP.BODY">: the spec's webhook-signature."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signed_headers(keys, message_id, body, now=None):
    """The three headers that sign body as the webhook message_id, now (Unix seconds), with
    each of keys (one key's bytes, or several: their signatures space-separated)."""
    keys = (keys,) if isinstance(keys, bytes) else keys
    timestamp = str(int(time.time() if now is None else now))
    return {
        "webhook-id": message_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": " ".join(signature(k, message_id, timestamp, body) for k in keys),
    }


class Body(NamedTuple):
    """A route's answer that is not JSON (a Prometheus text page, for one)."""

    content_type: str
    data: bytes


class GuardedHandler(BaseHTTPRequestHandler):
    """Routes get(path) and post(path) return (status, JSON value), or hang_up()."""

    routes = {}  # path -> the methods it accepts, e.g. "GET, HEAD, POST"
    log_prefix = "server"  # log_line's first word
    max_body_bytes = 4096  # a longer Content-Length is refused (413) before it is read
    unavailable_errors = ()  # exception types answered 503 (with Retry-After: 1 if retryable)

    def get(self, path):
        """A route's GET (and HEAD); a service that has none lists none in routes."""
        raise NotImplementedError(path)

    def post(self, path):
        """A route's POST."""
        raise NotImplementedError(path)

    def unavailable(self, error):
        """Log one of unavailable_errors; return the 503's "error": what the client should do."""
        self.log_line(f"unavailable: {error}")
        return f"service busy or unavailable; {RETRY_HINT}"

    def retryable(self, error):
        """Whether a retry of the same request may succeed: the 503 then has Retry-After: 1."""
        return True

    def handle_request(self, action):
        """One place maps every outcome to an HTTP answer."""
        try:
            path = urlsplit(self.path).path
            allowed = self.routes.get(path)
            if allowed is None:
                raise ClientError(
                    404, f"{NO_SUCH_PATH} {path!r}; the paths: {', '.join(self.routes)}"
                )
            if self.command not in allowed.split(", "):
                raise ClientError(405, f"{path} accepts {allowed}", {"Allow": allowed})
            status, value = action(path)
        except ClientError as error:
            status, value = error.status, {"error": error.message}
            if error.code:
                value["code"] = error.code
            self.extra_headers.update(error.headers)
            self.refused(error)
        except self.unavailable_errors as error:  # locked past a timeout, disk full, I/O error...
            status, value = 503, {"error": self.unavailable(error)}
            if self.retryable(error):
                self.extra_headers["Retry-After"] = "1"
        except TimeoutError:
            status, value = 408, {"error": f"request not received within {self.timeout_s:g} s"}
            self.close_connection = True
        except ConnectionError:
            self.close_connection = True  # the client left: nobody to answer
            return
        except Exception as error:  # a bug: still answer, rather than drop the connection
            self.log_line(f"internal error: {error!r}")
            status, value = 500, {"error": f"internal error; {RETRY_HINT}"}
            self.close_connection = True
        if value is not None:
            self.discard_unread_body()
            self.respond(status, value)

    def refused(self, error):
        """Called for each ClientError answered; a service may log it."""

    def hang_up(self):
        """A route's return value for no answer at all: the connection just closes."""
        self.close_connection = True
        return None, None

    def read_body(self):
        """The request's body, framed by one valid Content-Length of at most max_body_bytes."""
        if self.headers.get("Transfer-Encoding"):
            raise ClientError(411, "send the body with a Content-Length, not chunked")
        length = self.content_length()
        if length > self.max_body_bytes:
            raise ClientError(413, f"body larger than {self.max_body_bytes} bytes")
        self.body_read = True
        body = self.rfile.read(length)
        if len(body) != length:
            raise ClientError(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def log_line(self, text):
        sys.stderr.write(f"{self.log_prefix}: {text}\n")

    def head_written(self):
        """Called once an answer's status line and headers are written, before its body; the
        answer is counted already (on_answer). A service may hold here (a test's failpoint):
        a client that has the status then finds it counted."""

    # helpers

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
        self.rfile = RequestReader(raw)
        self.extra_headers, self.body_read, self.linger = {}, False, False
        self.began = time.monotonic()

    def respond(self, status, value):
        self.connection.settimeout(self.timeout_s)  # the reads may have left it near zero
        if not isinstance(value, Body):
            value = Body("application/json", json.dumps(value, sort_keys=True).encode())
        self.send_response(status)
        self.send_header("Content-Type", value.content_type)
        self.send_header("Content-Length", str(len(value.data)))
        for name, header in self.extra_headers.items():
            self.send_header(name, header)
        # Counted before a byte of it is written: a client that has its answer and then asks
        # for the counts finds this answer among them.
        self.server.on_answer(status, time.monotonic() - self.began)
        self.end_headers()
        self.head_written()
        if self.command != "HEAD":
            self.wfile.write(value.data)

    def parse_request(self):
        # http.server reads the header lines here; RequestReader checks each line as it is
        # read, and ends the header block at a bad one, so it never reaches the parser.
        self.rfile.checking = True
        try:
            parsed = super().parse_request()
        finally:
            self.rfile.checking = False
        if parsed and self.rfile.refusal:
            self.linger = True  # the rest of the request is unread: drain it after the 400
            self.send_error(400, self.rfile.refusal)
            return False
        return parsed

    def do_GET(self):
        self.handle_request(self.get)

    def do_POST(self):
        self.handle_request(self.post)

    def do_other(self):
        self.handle_request(lambda path: None)  # known paths get 405, others 404

    do_HEAD = do_GET  # respond() leaves the body out
    # Methods http.server does not find here get its 501 (send_error), as RFC 9110 asks.
    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = do_other

    def content_length(self):
        values = self.headers.get_all("Content-Length") or []
        if not values:
            raise ClientError(411, "send a Content-Length header")
        if len(values) > 1:  # two lengths: which one frames the body is up to each parser
            raise ClientError(400, "send Content-Length once")
        if not CONTENT_LENGTH_DIGITS.fullmatch(values[0].strip()):  # refuses "-1", "+1", "1e3"
            raise ClientError(400, "Content-Length must be a non-negative whole number")
        if len(values[0].strip()) > 18:  # bounded before int(): 5,000 digits are its ValueError
            raise ClientError(413, f"body larger than {self.max_body_bytes} bytes")
        return int(values[0])

    def discard_unread_body(self):
        # Hanging up on unread bytes makes the kernel send a reset, which can destroy our
        # answer before the client reads it: read a small unread body now, and after an
        # answer to a large one, stop sending and read what is left (finish() below).
        if self.body_read or not self.headers:
            return
        self.body_read = True
        try:
            if self.content_length() <= self.max_body_bytes:
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

    def log_message(self, format, *args):
        pass  # the service logs its decisions (log_line) instead of an access log

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (a malformed request line, 414, 501, 505, ...)
        self.close_connection = True
        self.extra_headers = {"Connection": "close"}
        self.respond(code, {"error": message or self.responses.get(code, ("error",))[0]})


class GuardedServer(ThreadingHTTPServer):
    """A thread per connection, at most max_connections of them; one more gets a quick 503.

    on_answer(status, seconds), if given, is called for each answer just before its first byte is
    written, with the time since the connection was accepted: a service counts its answers there,
    so a client never holds an answer that the counts do not include yet.
    """

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True  # SIGTERM must not wait for a stalled client
    block_on_close = False  # nor server_close(): its threads are not joined

    def __init__(self, address, handler, request_timeout_s, max_connections, on_answer=None):
        super().__init__(address, handler)
        self.request_timeout_s = request_timeout_s
        self.slots = threading.BoundedSemaphore(max_connections)
        self.on_answer = on_answer or (lambda status, seconds: None)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):  # full: answer at once, start no thread
            began = time.monotonic()
            # Read what the client has sent first: closing on unread bytes would reset the
            # connection and could destroy the answer before the client reads it.
            request.settimeout(REFUSE_READ_S)
            with suppress(OSError):  # nothing sent yet (a timeout), or the client left
                request.recv(REFUSE_READ_BYTES)
            self.on_answer(503, time.monotonic() - began)  # counted before it is sent
            with suppress(OSError):
                request.sendall(TOO_MANY_CONNECTIONS)  # small: it fits the send buffer
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


class RequestReader(io.BufferedReader):
    """The request's bytes; while `checking` (the header lines), a line with a control character
    other than tab (a bare CR among them) is not handed on: readline returns the end of the
    header block instead, and `refusal` says why, for a 400 (RFC 9112, 2.2)."""

    checking, refusal = False, None

    def readline(self, size=-1):
        line = super().readline(size)
        if not self.checking or self.refusal:
            return line
        content = line[:-2] if line.endswith(b"\r\n") else line.removesuffix(b"\n")  # its end
        if bad := CONTROL_CHARACTER.search(content):
            name = content.partition(b":")[0][:40].decode("latin-1")
            what = "a bare CR" if bad[0] == b"\r" else "a control character"
            self.refusal = (
                f"header {name!r} holds {what} (0x{bad[0][0]:02x}); send each header on a line "
                "of its own, ended by CRLF, with no control character but tab"
            )
            return b"\r\n"
        return line


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
