"""Talk to a real receiver the way clients do: raw bytes on a socket, one connection each.

Raw sockets, because the malformed requests these tests send (two Content-Lengths, a body
shorter than announced, bytes that are not UTF-8 in a header) are what a well-behaved
client library refuses to produce.
"""

import json
import socket
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tools.local import ROOT

REPLY_DEADLINE_S = 10.0  # seconds for a whole answer; the receiver answers in milliseconds
TITLE = "Check supplier configuration"


@dataclass
class Reply:
    status: int
    headers: dict  # lower-case name -> value
    body: bytes

    def json(self):
        return json.loads(self.body)


def port_of(server):
    return urlsplit(server.url).port


def exchange(server, data, half_close=True, timeout=REPLY_DEADLINE_S):
    """Send raw request bytes on a new connection and read the answer to its end.

    half_close: tell the server nothing more is coming (a body shorter than its
    Content-Length is then seen as short, not as a client that is still sending).
    """
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return read_reply(sock, expect_body=not data.startswith(b"HEAD "))


def read_reply(sock, expect_body=True):
    answer = b""
    while chunk := sock.recv(65536):  # HTTP/1.0: the receiver closes after its answer
        answer += chunk
    if not answer:
        raise ConnectionError("the receiver closed the connection without answering")
    return read_reply_from(answer, expect_body)


def read_reply_from(answer, expect_body=True):
    """A Reply from an answer's bytes."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if expect_body and len(body) < int(headers.get("content-length", 0)):
        raise ConnectionError(f"the answer was cut short: {answer!r}")
    return Reply(int(status_line.split(" ")[1]), headers, body)


def request(server, method, target, body=None, headers=(), **kwargs):
    """A well-formed request; body may be bytes or a value to send as JSON."""
    return exchange(server, request_bytes(method, target, body, headers), **kwargs)


def request_bytes(method, target, body=None, headers=()):
    """The bytes of a well-formed HTTP/1.0 request, as request() sends them."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    lines = [f"{method} {target} HTTP/1.0".encode()]
    for name, value in headers:
        lines.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        )
    if body is not None:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def read_head(sock):
    """An answer's status and headers, read up to the blank line after them (not to the
    connection's end): (status, {lower-case name: value})."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # a byte at a time: nothing past the head is taken from the socket
        if not chunk:
            raise ConnectionError(f"the connection ended inside the answer's head: {head!r}")
        head += chunk
    reply = read_reply_from(head, expect_body=False)
    return reply.status, reply.headers


def post(server, title=TITLE, key=None, **kwargs):
    headers = [] if key is None else [("Idempotency-Key", key)]
    return request(server, "POST", "/tickets", {"title": title}, headers, **kwargs)


def tickets(server, key=None):
    """The receiver's tickets (all, or the one with this key), as a list of dicts."""
    target = "/tickets" if key is None else f"/tickets?key={key}"
    reply = request(server, "GET", target)
    assert reply.status == 200, reply
    return reply.json()["tickets"]


def assert_error(reply, status, *words, code=None):
    """A JSON answer with this status whose "error" says why, in (at least) these words, and
    whose "code" is code, when one is given."""
    assert reply.status == status, reply
    assert reply.headers.get("content-type") == "application/json", reply
    if code is not None:
        assert reply.json().get("code") == code, reply
    error = reply.json()["error"]
    missing = [word for word in words if word.lower() not in error.lower()]
    assert not missing, f"error {error!r} does not mention {missing}"


def garble(db_path):
    """Damage a stopped receiver's database as a failing disk might: every page after the first
    (the file header and the schema) overwritten with 0xff bytes. Returns the pages garbled."""
    with closing(sqlite3.connect(db_path, isolation_level=None)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file, none in a WAL
        page = db.execute("PRAGMA page_size").fetchone()[0]
        roots = [root for (root,) in db.execute("SELECT rootpage FROM sqlite_master")]
    assert min(roots) > 1, "a table or index on the first page would be garbled with it"
    data = Path(db_path).read_bytes()
    Path(db_path).write_bytes(data[:page] + b"\xff" * (len(data) - page))
    return len(data) // page - 1


def run_api(env, *args):
    """python -m labs.receiver ARGS to its end (it must end by itself: a bad setting, --help)."""
    return subprocess.run(
        [sys.executable, "-m", "labs.receiver", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
