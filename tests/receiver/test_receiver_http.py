"""The receiver's HTTP boundary, as a client sees it, against a real labs/receiver.py process.

Every bad request must get a JSON answer whose "error" says why (4xx; 501 and 505 where
HTTP itself names what is unsupported), must create no ticket, and must leave the
receiver serving. Good requests get 201 (created), 200 (the same request again) or 409
(the key was used for another body). openapi.yaml is checked against the same process:
every status the receiver can send must be in it, every answer it documents is provoked
and validated with jsonschema, and schemathesis fuzzes the receiver from it.
"""

import ast
import http.server
import inspect
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

import pytest
import yaml
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, ValidationError
from prometheus_client.parser import text_string_to_metric_families
from receiver_helpers import TITLE, assert_error, exchange, garble, post, request, tickets
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tools.local import ROOT, ReceiverProcess, free_port, lab_env

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

STALL_TIMEOUT_S = 1.0  # the receiver's per-connection timeout in this module: a stall test
#                        waits it out, and 1 s is still ample for any loopback request here
BUSY_TIMEOUT_S = 0.3  # its wait for a locked database before a 503 (default 2 s)
VALID = json.dumps({"title": TITLE}).encode()
AUTO = object()  # post_bytes: send the body's real length
PROPERTY = settings(max_examples=examples(100), deadline=None)  # 100 requests: about a second


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One receiver for the module: starting a process per case would dominate the runtime."""
    tmp = tmp_path_factory.mktemp("http")
    env = lab_env(
        tmp / "data",
        free_port(),
        RECEIVER_REQUEST_TIMEOUT_S=str(STALL_TIMEOUT_S),
        RECEIVER_BUSY_TIMEOUT_S=str(BUSY_TIMEOUT_S),
    )
    receiver = ReceiverProcess(env, log_path=tmp / "receiver.log").start()
    yield receiver
    receiver.stop()


def fresh_key():
    return f"test:{uuid.uuid4()}"


def post_bytes(body=VALID, headers=(), length=AUTO, target=b"/tickets"):
    """A raw POST; length: AUTO, None (no Content-Length) or a list of header values."""
    lines = [b"POST " + target + b" HTTP/1.0", *headers]
    lengths = [b"%d" % len(body)] if length is AUTO else length or []
    lines += [b"Content-Length: " + value for value in lengths]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def title_body(title):
    return json.dumps({"title": title}).encode()


BAD_REQUESTS = {  # id -> (raw request, status, words the error must use)
    "no Content-Length": (post_bytes(length=None), 411, ["Content-Length"]),
    "non-numeric Content-Length": (post_bytes(length=[b"ten"]), 400, ["Content-Length"]),
    "negative Content-Length": (post_bytes(length=[b"-1"]), 400, ["non-negative"]),
    "signed Content-Length": (post_bytes(length=[b"+41"]), 400, ["whole number"]),
    "non-ASCII digit Content-Length": (post_bytes(length=[b"\xb2"]), 400, ["Content-Length"]),
    "oversized Content-Length": (post_bytes(length=[b"4097"]), 413, ["4096 bytes"]),
    "Content-Length of 5000 digits": (post_bytes(length=[b"9" * 5000]), 413, ["4096 bytes"]),
    "oversized body": (post_bytes(title_body("x" * 5000)), 413, ["4096 bytes"]),
    "Content-Length twice": (post_bytes(length=[b"41", b"41"]), 400, ["once"]),
    "chunked body": (
        post_bytes(b"0\r\n\r\n", [b"Transfer-Encoding: chunked"], length=None),
        411,
        ["Content-Length", "chunked"],
    ),
    "body shorter than Content-Length": (
        post_bytes(length=[b"%d" % (len(VALID) + 10)]),
        400,
        ["ended after 41 of 51 bytes"],
    ),
    "not JSON": (post_bytes(b"title=Check"), 400, ["not valid JSON"]),
    "invalid UTF-8": (post_bytes(b'{"title": "\xff\xfe"}'), 400, ["UTF-8"]),
    "JSON array": (post_bytes(b'["title"]'), 400, ["JSON object"]),
    "JSON string": (post_bytes(b'"title"'), 400, ["JSON object"]),
    "JSON null": (post_bytes(b"null"), 400, ["JSON object"]),
    "extra field": (post_bytes(b'{"title": "a", "priority": 1}'), 400, ["exactly one", "title"]),
    "missing field": (post_bytes(b"{}"), 400, ["exactly one", "title"]),
    "misspelt field": (post_bytes(b'{"Title": "a"}'), 400, ['"title"']),
    "field twice": (post_bytes(b'{"title": "a", "title": "b"}'), 400, ['"title" twice']),
    "empty title": (post_bytes(title_body("")), 400, ["1-200 characters"]),
    "title too long": (post_bytes(title_body("x" * 201)), 400, ["1-200 characters"]),
    "title a number": (post_bytes(b'{"title": 7}'), 400, ["string"]),
    "title null": (post_bytes(b'{"title": null}'), 400, ["string"]),
    "title NaN": (post_bytes(b'{"title": NaN}'), 400, ["string"]),
    "title an object": (post_bytes(b'{"title": {"text": "a"}}'), 400, ["string"]),
    "title a lone surrogate": (post_bytes(b'{"title": "a\\ud800"}'), 400, ["surrogate"]),
    "deeply nested JSON": (post_bytes(b"[" * 2000 + b"]" * 2000), 400, ["nested too deeply"]),
    "deeply nested title": (
        post_bytes(b'{"title": ' + b"[" * 1500 + b"]" * 1500 + b"}"),
        400,
        ["nested too deeply"],
    ),
    "empty key": (post_bytes(headers=[b"Idempotency-Key: "]), 400, ["Idempotency-Key", "1-200"]),
    "key too long": (post_bytes(headers=[b"Idempotency-Key: " + b"k" * 201]), 400, ["1-200"]),
    "key with a space": (post_bytes(headers=[b"Idempotency-Key: case 1"]), 400, ["no spaces"]),
    "key in UTF-8": (post_bytes(headers=["Idempotency-Key: café".encode()]), 400, ["ASCII"]),
    "key with a control character": (
        post_bytes(headers=[b"Idempotency-Key: case\x01one"]),
        400,
        ["'Idempotency-Key'", "control character (0x01)"],
    ),
    "bare CR in a header": (
        post_bytes(headers=[b"X-Note: hello\rIdempotency-Key: injected"]),
        400,
        ["'X-Note'", "bare CR (0x0d)"],
    ),
    "NUL in a header": (post_bytes(headers=[b"X-Note: a\x00b"]), 400, ["control character"]),
    "DEL in a header": (post_bytes(headers=[b"X-Note: a\x7fb"]), 400, ["control character"]),
    "bare CR ending a header": (post_bytes(headers=[b"X-Note: a\r"]), 400, ["bare CR"]),
    "key sent twice": (
        post_bytes(headers=[b"Idempotency-Key: k1", b"Idempotency-Key: k1"]),
        400,
        ["once, not 2 times"],
    ),
    "unknown path": (post_bytes(target=b"/ticket"), 404, ["'/ticket'", "paths: /health, /tickets"]),
    "unknown GET path": (b"GET /admin HTTP/1.0\r\n\r\n", 404, ["/admin"]),
    "empty ?key=": (b"GET /tickets?key= HTTP/1.0\r\n\r\n", 400, ["?key="]),
    "?key= twice": (b"GET /tickets?key=a&key=b HTTP/1.0\r\n\r\n", 400, ["once"]),
    "other query parameter": (b"GET /tickets?all=1 HTTP/1.0\r\n\r\n", 400, ["only query"]),
    "?key= not UTF-8": (b"GET /tickets?key=%FF HTTP/1.0\r\n\r\n", 400, ["visible ASCII"]),
    "?key= raw byte 0xff": (b"GET /tickets?key=\xff HTTP/1.0\r\n\r\n", 400, ["visible ASCII"]),
    "?key= in UTF-8": (b"GET /tickets?key=caf%C3%A9 HTTP/1.0\r\n\r\n", 400, ["ASCII"]),
    "malformed request line": (b"NONSENSE\r\n\r\n", 400, ["request"]),
    "unknown HTTP version": (b"GET /tickets HTTP/9.9\r\n\r\n", 505, ["version"]),
    "header line too long": (
        b"GET /tickets HTTP/1.0\r\nX-Note: " + b"a" * 70_000 + b"\r\n\r\n",
        431,
        ["too long"],
    ),
    "too many headers": (
        b"GET /tickets HTTP/1.0\r\n" + b"X-N: 1\r\n" * 101 + b"\r\n",
        431,
        ["headers"],
    ),
}


@pytest.mark.parametrize("raw,status,words", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_bad_request_gets_a_json_error_that_says_why_and_creates_nothing(
    server, raw, status, words
):
    before = len(tickets(server))
    assert_error(exchange(server, raw), status, *words)
    assert len(tickets(server)) == before
    assert request(server, "GET", "/health").json() == {"ok": True}


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("DELETE", "/tickets", "GET, HEAD, POST"),
        ("PUT", "/tickets", "GET, HEAD, POST"),
        ("PATCH", "/tickets", "GET, HEAD, POST"),
        ("POST", "/health", "GET, HEAD"),
        ("OPTIONS", "/health", "GET, HEAD"),
    ],
)
def test_a_known_path_refuses_other_methods_with_405_and_allow(server, method, path, allow):
    before = len(tickets(server))
    reply = request(server, method, path, body=VALID)
    assert_error(reply, 405, path, allow)
    assert reply.headers["allow"] == allow
    assert len(tickets(server)) == before


def test_a_bare_cr_in_a_header_starts_no_header(server):
    """http.server's parser (email.parser) takes a bare CR for a line break: the injected key
    would make a ticket. RFC 9112 2.2: refused, before any header is read as a key."""
    key = fresh_key()
    raw = post_bytes(headers=[b"X-Note: hello\rIdempotency-Key: " + key.encode()])
    assert_error(exchange(server, raw), 400, "bare CR")
    assert tickets(server, key) == []
    assert request(server, "GET", "/health").json() == {"ok": True}


def test_a_tab_and_bytes_past_ascii_in_a_header_value_are_allowed(server):
    """RFC 9110 5.5: a field value may hold tabs and obs-text (0x80-0xff); only controls are out."""
    key = fresh_key()
    raw = post_bytes(headers=[b"X-Note: a\tb\xe9", f"Idempotency-Key: {key}".encode()])
    assert exchange(server, raw).status == 201
    assert len(tickets(server, key)) == 1


def test_an_unknown_method_gets_501_as_json(server):
    # RFC 9110: a method the server does not know at all is 501, not 405.
    assert_error(exchange(server, b"BREW /tickets HTTP/1.0\r\n\r\n"), 501, "BREW")


def test_head_is_get_without_the_body(server):
    post(server, key=fresh_key())
    get, head = request(server, "GET", "/tickets"), request(server, "HEAD", "/tickets")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-length"] == str(len(get.body))
    assert request(server, "HEAD", "/nowhere").status == 404


def test_a_stalled_upload_is_answered_408_and_creates_nothing(server):
    key = fresh_key()
    # Headers and half the body, then silence (the socket stays open for writing).
    raw = post_bytes(headers=[f"Idempotency-Key: {key}".encode()])[: -len(VALID) // 2]
    assert_error(exchange(server, raw, half_close=False), 408, f"within {STALL_TIMEOUT_S:g} s")
    assert tickets(server, key) == []
    assert request(server, "GET", "/health").status == 200


def test_a_late_request_line_or_header_block_gets_no_answer_only_a_close(server):
    """Only a late body gets the 408: http.server reads the request line and the headers itself
    and, when a read times out, closes the connection without a word
    (BaseHTTPRequestHandler.handle_one_request)."""

    def first_bytes(raw):
        with socket.create_connection(("127.0.0.1", int(server.env["PORT"])), timeout=10) as sock:
            sock.sendall(raw)  # then silence, the socket still open for writing
            return sock.recv(65536)  # b"": the receiver closed the connection, unanswered

    late = [b"POST /tickets HTT", post_bytes(headers=[b"X-Note: not end"])[: -4 - len(VALID)]]
    with ThreadPoolExecutor(len(late)) as pool:  # both wait out the timeout at once
        assert list(pool.map(first_bytes, late)) == [b""] * len(late)


def test_first_post_creates_and_the_same_request_returns_the_same_ticket(server):
    key = fresh_key()
    first = post(server, key=key)
    assert first.status == 201
    ticket_id = first.json()["ticket_id"]
    assert first.json() == {"ticket_id": ticket_id, "created": True}
    again = post(server, key=key)
    assert (again.status, again.json()) == (200, {"ticket_id": ticket_id, "created": False})
    assert tickets(server, key) == [
        {"ticket_id": ticket_id, "key": key, "payload": {"title": TITLE}}
    ]


def test_replays_compare_canonical_json_not_bytes(server):
    """Spacing, escapes and a trailing newline do not make a different request."""
    key = fresh_key()
    spellings = [
        b'{"title":"Ab \xc3\xa9"}',
        b'{ "title" : "Ab \xc3\xa9" }\n',
        b'{"title": "\\u0041b \\u00e9"}',
        b'\t{"title":\r\n"Ab \\u00E9"}',
    ]
    replies = [
        request(server, "POST", "/tickets", body, [("Idempotency-Key", key)]) for body in spellings
    ]
    assert [r.status for r in replies] == [201, 200, 200, 200]
    assert len({r.json()["ticket_id"] for r in replies}) == 1
    assert tickets(server, key)[0]["payload"] == {"title": "Ab é"}


def test_the_same_key_with_another_body_is_409_and_changes_nothing(server):
    key = fresh_key()
    ticket_id = post(server, key=key).json()["ticket_id"]
    before = len(tickets(server))
    reply = post(server, "Another title", key=key)
    assert_error(reply, 409, key, f"ticket {ticket_id}", "new key", code="key_conflict")
    assert len(tickets(server)) == before
    assert tickets(server, key)[0]["payload"] == {"title": TITLE}
    assert post(server, key=key).status == 200  # the original request still replays


def test_without_a_key_every_post_is_a_new_ticket(server):
    first, second = post(server), post(server)
    assert (first.status, second.status) == (201, 201)
    assert first.json()["ticket_id"] != second.json()["ticket_id"]


def test_whitespace_around_the_key_header_is_not_part_of_the_key(server):
    key = fresh_key()
    ticket_id = post(server, key=key).json()["ticket_id"]
    reply = request(server, "POST", "/tickets", VALID, [("Idempotency-Key", f" \t{key}  ")])
    assert (reply.status, reply.json()["ticket_id"]) == (200, ticket_id)


def test_get_tickets_lists_all_in_id_order_and_key_selects_one(server):
    keys = [fresh_key() for _ in range(3)]
    ids = [post(server, f"title {i}", key=key).json()["ticket_id"] for i, key in enumerate(keys)]
    listed = tickets(server)
    assert [t["ticket_id"] for t in listed] == sorted(t["ticket_id"] for t in listed)
    by_key = {t["key"]: t["ticket_id"] for t in listed if t["key"] in keys}
    assert by_key == dict(zip(keys, ids, strict=True))
    assert tickets(server, keys[1]) == [
        {"ticket_id": ids[1], "key": keys[1], "payload": {"title": "title 1"}}
    ]
    assert tickets(server, fresh_key()) == []


def test_every_answer_but_metrics_is_json_with_a_true_content_length(server):
    for reply in [
        request(server, "GET", "/health"),
        post(server, key=fresh_key()),
        exchange(server, post_bytes(b"{")),
        exchange(server, b"BREW / HTTP/1.0\r\n\r\n"),
    ]:
        assert reply.headers["content-type"] == "application/json"
        assert int(reply.headers["content-length"]) == len(reply.body)
        json.loads(reply.body)


def test_the_failpoint_token_does_nothing_unless_the_failpoint_is_on(server):
    reply = request(server, "POST", "/tickets", VALID, [("Failpoint-Token", "t1")])
    assert reply.status == 201


def test_before_answer_drop_answer_commits_then_hangs_up_once_per_token(tmp_path):
    env = lab_env(tmp_path / "data", free_port(), FAILPOINTS="before-answer=drop-answer")
    log = tmp_path / "receiver.log"
    faulty = ReceiverProcess(env, log_path=log).start()
    try:
        headers = [("Idempotency-Key", "case-9"), ("Failpoint-Token", "token-1")]
        with pytest.raises(ConnectionError):
            request(faulty, "POST", "/tickets", VALID, headers)
        [ticket] = tickets(faulty, "case-9")  # committed, though nobody heard about it
        retry = request(faulty, "POST", "/tickets", VALID, headers)
        assert (retry.status, retry.json()["ticket_id"]) == (200, ticket["ticket_id"])
        assert post(faulty).status == 201  # no token: the point does not fire
        faulty.stop()
        faulty.start()  # the spent tokens were in memory: a restart arms token-1 again
        with pytest.raises(ConnectionError):
            request(faulty, "POST", "/tickets", VALID, headers)
    finally:
        faulty.stop()
    lines = log.read_text().splitlines()
    assert "receiver: WARNING failpoints on: before-answer=drop-answer" in lines[1], lines
    dropped = "receiver: before-answer failpoint: dropping the answer (token=token-1)"
    assert lines.count(dropped) == 2, lines


# ---- properties: whatever a client sends, an answer, and a ticket only for a valid request


def ticket_title(value):
    """The title if value is a valid ticket body, else None (the receiver's rules, restated)."""
    if not isinstance(value, dict) or set(value) != {"title"}:
        return None
    title = value["title"]
    if not isinstance(title, str) or not 1 <= len(title) <= 200:
        return None
    if any(0xD800 <= ord(c) <= 0xDFFF for c in title):
        return None
    return title


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
surrogate = st.integers(0xD800, 0xDFFF).map(chr)
titles = st.text(max_size=210) | st.tuples(st.text(max_size=4), surrogate).map("".join)
bodies = (
    json_values
    | st.fixed_dictionaries({"title": titles})
    | st.fixed_dictionaries({"title": titles}, optional={"x": json_values})
)


@PROPERTY
@given(value=bodies)
def test_any_json_body_is_stored_exactly_when_valid_and_read_back_unchanged(server, value):
    key = fresh_key()
    reply = request(
        server, "POST", "/tickets", json.dumps(value).encode(), [("Idempotency-Key", key)]
    )
    if ticket_title(value) is None:
        assert_error(reply, 400)
        assert tickets(server, key) == []
    else:
        assert reply.status == 201, reply
        assert tickets(server, key)[0]["payload"] == value


@PROPERTY
@given(body=st.binary(max_size=600))
def test_any_bytes_body_gets_an_answer_and_a_ticket_only_if_201(server, body):
    key = fresh_key()
    reply = exchange(server, post_bytes(body, [f"Idempotency-Key: {key}".encode()]))
    assert reply.status in (201, 400), reply
    if reply.status == 400:
        assert_error(reply, 400)
    assert len(tickets(server, key)) == (reply.status == 201)


header_values = st.binary(max_size=210).map(lambda v: v.replace(b"\n", b""))  # one line each
CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # RFC 9110 5.5: not in a header value
header_names = st.text(
    st.sampled_from([chr(c) for c in range(0x21, 0x7F) if c != ord(":")]), min_size=1
)


@PROPERTY
@given(value=header_values | st.text("!~abc", max_size=210).map(str.encode))
def test_any_key_header_is_accepted_exactly_when_1_to_200_visible_ascii(server, value):
    valid = re.fullmatch(rb"[\x21-\x7e]{1,200}", value.strip(b" \t"))
    title = f"property {uuid.uuid4()}"  # a new body: a reused key can only be a 409, not a 200
    reply = exchange(server, post_bytes(title_body(title), [b"Idempotency-Key: " + value]))
    if valid:
        assert reply.status in (201, 409), reply
    elif CONTROL.search(value):
        assert_error(reply, 400, "'Idempotency-Key'", "control character but tab")
    else:
        assert_error(reply, 400, "Idempotency-Key")
        assert not [t for t in tickets(server) if t["payload"]["title"] == title]


@PROPERTY
@given(
    name=header_names.map(str.encode),
    value=header_values,
)
def test_any_extra_header_leaves_a_valid_post_valid(server, name, value):
    if name.lower() in (b"content-length", b"idempotency-key", b"transfer-encoding"):
        return  # these three carry meaning; other tests cover them
    key = fresh_key()
    reply = exchange(
        server, post_bytes(headers=[f"Idempotency-Key: {key}".encode(), name + b": " + value])
    )
    if CONTROL.search(value):  # a bare CR, or another control character but tab
        assert_error(reply, 400, "control character but tab")
        assert tickets(server, key) == []
    else:
        assert reply.status == 201, reply
        assert len(tickets(server, key)) == 1


@PROPERTY
@given(query=st.binary(max_size=60).map(lambda q: re.sub(rb"[\r\n]", b"", q)))
def test_any_query_gets_200_with_tickets_or_a_json_400(server, query):
    reply = exchange(server, b"GET /tickets?" + query + b" HTTP/1.0\r\n\r\n")
    if reply.status == 200:
        assert isinstance(reply.json()["tickets"], list)
    else:
        assert_error(reply, 400)


# ---- openapi.yaml: every status the receiver can send is documented, every documented answer
# is provoked here and its body validated with jsonschema, and schemathesis fuzzes the receiver

OPENAPI = yaml.safe_load((ROOT / "openapi.yaml").read_text())
SPEC_URI = "urn:stateful-agent-lab:openapi.yaml"  # a name for the $ref resolver, not a location
REGISTRY = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(OPENAPI))
ANY = "x-answers-to-any-request"  # openapi.yaml: answers any request can get
SCHEMATHESIS_EXAMPLES = 30  # per operation: about 140 requests in all, 7-12 s here
SCHEMATHESIS_DEADLINE_S = 600  # seconds: a hang guard (a hung run fails instead of stalling the
#                             suite), not a speed bound: at load 18 a healthy run passed 120 s


def pointer(*parts):
    return pointer_join("#", *parts)


def pointer_join(ref, *parts):
    return "/".join([ref, *(str(p).replace("~", "~0").replace("/", "~1") for p in parts)])


def node_at(ref):
    node = OPENAPI
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def documented_response(ref):
    """The response object at ref and its own pointer, following a $ref."""
    response = node_at(ref)
    if "$ref" in response:  # siblings such as description only annotate the reference
        ref = response["$ref"]
        response = node_at(ref)
    return response, ref


def validate(value, schema_ref):
    """jsonschema (JSON Schema 2020-12, the dialect of OpenAPI 3.1) with openapi.yaml's $refs."""
    Draft202012Validator({"$ref": SPEC_URI + schema_ref}, registry=REGISTRY).validate(value)


def posted_twice(server):
    key = fresh_key()
    post(server, key=key)
    return post(server, key=key)


def reused_key(server):
    key = fresh_key()
    post(server, key=key)
    return post(server, "Another title", key=key)


def while_locked(server):
    """A POST while another process holds the database's write lock: 503 after the busy wait."""
    holder = sqlite3.connect(server.env["RECEIVER_DB"], isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        return post(server, key=fresh_key())
    finally:
        holder.close()


def without_the_table(method, table="tickets"):
    """A read while another process has renamed the table: a SQLite error, so 503."""

    def provoke(server):
        other = sqlite3.connect(server.env["RECEIVER_DB"], isolation_level=None)
        try:
            other.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
            return request(server, method, f"/{table}")
        finally:
            other.execute(f"ALTER TABLE {table}_away RENAME TO {table}")
            other.close()

    return provoke


def a_ticket(server):
    reply = post(server, key=fresh_key())
    assert reply.status == 201, reply
    return reply.json()["ticket_id"]


def refund(server, ticket_id, key=None):
    headers = [] if key is None else [("Idempotency-Key", key)]
    return request(server, "POST", "/refunds", {"ticket_id": ticket_id}, headers)


def reserve(server, ticket_id, seats, key=None):
    headers = [] if key is None else [("Idempotency-Key", key)]
    return request(
        server, "POST", "/reservations", {"ticket_id": ticket_id, "seats": seats}, headers
    )


def refunded_twice(server):
    key, ticket_id = fresh_key(), a_ticket(server)
    refund(server, ticket_id, key)
    return refund(server, ticket_id, key)


def refund_key_reused(server):
    key = fresh_key()
    refund(server, a_ticket(server), key)
    return refund(server, a_ticket(server), key)


def progress_key_reused(server):
    key, ticket_id = [("Idempotency-Key", fresh_key())], a_ticket(server)
    request(server, "POST", "/progress", {"ticket_id": ticket_id, "statuses": ["opened"]}, key)
    return request(
        server, "POST", "/progress", {"ticket_id": ticket_id, "statuses": ["resolved"]}, key
    )


def on_a_receiver_of_its_own(provoke):
    """provoke(receiver) on a fresh receiver: the module's may have no seats left by then."""

    def provoked(server):
        env = dict(server.env, PORT=str(free_port()))
        env["RECEIVER_DB"] = env["RECEIVER_DB"].replace(".sqlite", f"-{uuid.uuid4()}.sqlite")
        env["API_URL"] = f"http://127.0.0.1:{env['PORT']}"
        fresh = ReceiverProcess(env).start()
        try:
            return provoke(fresh)
        finally:
            fresh.stop()

    return provoked


def reservation_key_reused(server):
    key, ticket_id = fresh_key(), a_ticket(server)
    reserve(server, ticket_id, 2, key)
    return reserve(server, ticket_id, 3, key)


def reserved_twice(server):
    key, ticket_id = fresh_key(), a_ticket(server)
    reserve(server, ticket_id, 2, key)
    return reserve(server, ticket_id, 2, key)


def a_reservation(server):
    """A reservation of one seat, released at once: its seat back, so the module's receiver
    never runs out of seats for the answers that need a reservation."""
    reply = reserve(server, a_ticket(server), 1, fresh_key())
    assert reply.status == 201, reply
    made = reply.json()["reservation_id"]
    request(server, "POST", "/releases", {"reservation_id": made})
    return made


def ship(server, reservation_id, key=None, country="FR"):
    headers = [] if key is None else [("Idempotency-Key", key)]
    body = {"reservation_id": reservation_id, "country": country}
    return request(server, "POST", "/shipments", body, headers)


def release(server, reservation_id, key=None):
    headers = [] if key is None else [("Idempotency-Key", key)]
    return request(server, "POST", "/releases", {"reservation_id": reservation_id}, headers)


def sent_twice(send, other=False):
    """The same key twice: for the same reservation (200), or another one (other: 409)."""

    def provoke(server):
        key, made = fresh_key(), a_reservation(server)
        send(server, made, key)
        return send(server, a_reservation(server) if other else made, key)

    return provoke


def saga_answers():
    """The answers of lab 13's /shipments and /releases: each a keyed route like /refunds."""
    answers = {}
    for path, send in (("/shipments", ship), ("/releases", release)):
        table, target = path.strip("/"), path.encode()
        for method in ("GET", "HEAD"):
            m = method.lower()
            answers[(path, m, "200")] = lambda s, m=method, p=path: request(s, m, p)
            answers[(path, m, "400")] = lambda s, m=method, p=path: request(s, m, p + "?key=a%20b")
            answers[(path, m, "503")] = without_the_table(method, table)
        answers |= {
            (path, "post", "201"): lambda s, send=send: send(s, a_reservation(s), fresh_key()),
            (path, "post", "200"): sent_twice(send),
            (path, "post", "400"): lambda s, t=target: exchange(s, post_bytes(b"{", target=t)),
            (path, "post", "404"): lambda s, send=send: send(s, 2**63 - 1),
            (path, "post", "408"): lambda s, t=target: exchange(
                s, post_bytes(target=t)[:-5], half_close=False
            ),
            (path, "post", "409"): sent_twice(send, other=True),
            (path, "post", "411"): lambda s, t=target: exchange(
                s, post_bytes(length=None, target=t)
            ),
            (path, "post", "413"): lambda s, t=target: exchange(
                s, post_bytes(title_body("x" * 5000), target=t)
            ),
            (path, "post", "503"): post_locked(path),
        }
    no_carrier = lambda s: ship(s, a_reservation(s), country="AQ")  # noqa: E731
    answers[("/shipments", "post", "409")] = (no_carrier, sent_twice(ship, other=True))
    return answers


def post_locked(target):
    """A POST to target while another process holds the database's write lock: 503."""

    def provoke(server):
        ticket_id = a_ticket(server)
        holder = sqlite3.connect(server.env["RECEIVER_DB"], isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            body = {
                "/reservations": {"ticket_id": ticket_id, "seats": 1},
                "/shipments": {"reservation_id": 1, "country": "FR"},
                "/releases": {"reservation_id": 1},
                "/messages": {"to": "someone", "text": "a message"},
                "/webhooks": {"url": "http://127.0.0.1:9/webhook"},
                "/progress": {"ticket_id": ticket_id, "statuses": ["opened"]},
                "/payments": {"reference": "r", "amount": 1},
            }.get(target, {"ticket_id": ticket_id})
            return request(server, "POST", target, body)
        finally:
            holder.close()

    return provoke


def delivered_to_a_subscriber(server):
    """Two events wait for a subscriber; POST /webhooks names one, which gets both (lab 18)."""
    got = []

    class Subscriber(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    ticket_id = a_ticket(server)
    waiting = request(server, "POST", "/progress", {"ticket_id": ticket_id, "statuses": ["opened"]})
    assert waiting.status == 200 and waiting.json()["pending"] == 1, waiting  # no subscriber yet
    subscriber = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Subscriber)
    threading.Thread(target=subscriber.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{subscriber.server_port}/webhook"
        reply = request(server, "POST", "/webhooks?wait=30", {"url": url})
    finally:
        subscriber.shutdown()
        subscriber.server_close()
    assert reply.json() == {"delivered": 1, "pending": 0}, reply
    assert got == waiting.json()["events"], got  # the event as /progress made it, delivered
    for each in got:
        validate(each, pointer("components", "schemas", "Event"))
    return reply


def with_a_row_it_did_not_write(server):
    """A row whose payload is not JSON, written by another process: listing it is a 500."""
    other = sqlite3.connect(server.env["RECEIVER_DB"], isolation_level=None)
    try:
        other.execute("INSERT INTO tickets (operation_key, payload) VALUES (NULL, 'not JSON')")
        return request(server, "GET", "/tickets")
    finally:
        other.execute("DELETE FROM tickets WHERE payload = 'not JSON'")
        other.close()


def past_the_connection_cap(server):
    """A receiver of its own that serves one connection at once, and a second connection."""
    env = dict(server.env, PORT=str(free_port()), RECEIVER_MAX_CONNECTIONS="1")
    env["API_URL"] = f"http://127.0.0.1:{env['PORT']}"
    capped = ReceiverProcess(env).start()
    try:
        # Until the held connection has the slot: the connection start() waited on may hold it
        # a moment after its answer (the slot is freed as its thread ends), and then the held
        # one is refused and closed, and the next is served. Each try opens a new held one.
        for _ in range(100):
            with socket.create_connection(("127.0.0.1", int(env["PORT"])), timeout=10) as held:
                held.sendall(b"GET /tickets HTTP/1.0\r\n")  # being served: its request is not done
                reply = request(capped, "GET", "/health")
                if reply.status == 503:
                    return reply
        raise AssertionError("a second connection was served past RECEIVER_MAX_CONNECTIONS=1")
    finally:
        capped.stop()


def with_the_database_damaged(method, path):
    """A receiver of its own whose database pages were garbled before it started: the first
    request meets the damage (503 without Retry-After), and so does every one after it."""

    def provoke(server):
        env = dict(server.env, PORT=str(free_port()))
        env["RECEIVER_DB"] = env["RECEIVER_DB"].replace(".sqlite", f"-{uuid.uuid4()}.sqlite")
        env["API_URL"] = f"http://127.0.0.1:{env['PORT']}"
        damaged = ReceiverProcess(env).start()  # makes the database: a root page per table
        try:
            damaged.stop()
            garble(env["RECEIVER_DB"])
            damaged.start()
            post(damaged, key="case-1")  # meets the damage; /health says so from then on
            if method == "POST":
                return post(damaged, key="case-new")
            return request(damaged, method, path)
        finally:
            damaged.stop()

    return provoke


def with_the_database_deleted(method, path):
    """A receiver of its own whose data folder is removed while it runs: 503, restart it."""

    def provoke(server):
        data = server.env["RECEIVER_DB"].rsplit("/", 2)[0] + f"/deleted-{uuid.uuid4()}"
        env = dict(server.env, PORT=str(free_port()), RECEIVER_DB=f"{data}/receiver.sqlite")
        env["API_URL"] = f"http://127.0.0.1:{env['PORT']}"
        doomed = ReceiverProcess(env).start()
        try:
            shutil.rmtree(data)
            return request(doomed, method, path)
        finally:
            doomed.stop()

    return provoke


ANSWERS = {  # (path, method, status) documented in openapi.yaml -> a request that gets it (or
    #          a tuple of such requests, one for each kind of that answer)
    ("/health", "get", "200"): lambda s: request(s, "GET", "/health"),
    ("/health", "get", "503"): (
        with_the_database_deleted("GET", "/health"),
        with_the_database_damaged("GET", "/health"),
    ),
    ("/health", "head", "200"): lambda s: request(s, "HEAD", "/health"),
    ("/health", "head", "503"): with_the_database_deleted("HEAD", "/health"),
    ("/metrics", "get", "200"): lambda s: request(s, "GET", "/metrics"),
    ("/metrics", "head", "200"): lambda s: request(s, "HEAD", "/metrics"),
    ("/tickets", "get", "200"): lambda s: request(s, "GET", "/tickets"),
    ("/tickets", "get", "400"): lambda s: request(s, "GET", "/tickets?key=a%20b"),
    ("/tickets", "get", "503"): without_the_table("GET"),
    ("/tickets", "head", "200"): lambda s: request(s, "HEAD", "/tickets"),
    ("/tickets", "head", "400"): lambda s: request(s, "HEAD", "/tickets?key=a%20b"),
    ("/tickets", "head", "503"): without_the_table("HEAD"),
    ("/tickets", "post", "201"): lambda s: post(s, key=fresh_key()),
    ("/tickets", "post", "200"): posted_twice,
    ("/tickets", "post", "400"): lambda s: exchange(s, post_bytes(b"{")),
    ("/tickets", "post", "408"): lambda s: exchange(s, post_bytes()[:-5], half_close=False),
    ("/tickets", "post", "409"): reused_key,
    ("/tickets", "post", "411"): lambda s: exchange(s, post_bytes(length=None)),
    ("/tickets", "post", "413"): lambda s: exchange(s, post_bytes(title_body("x" * 5000))),
    ("/tickets", "post", "503"): (while_locked, with_the_database_damaged("POST", "/tickets")),
    ("/refunds", "get", "200"): lambda s: request(s, "GET", "/refunds"),
    ("/refunds", "get", "400"): lambda s: request(s, "GET", "/refunds?key=a%20b"),
    ("/refunds", "get", "503"): without_the_table("GET", "refunds"),
    ("/refunds", "head", "200"): lambda s: request(s, "HEAD", "/refunds"),
    ("/refunds", "head", "400"): lambda s: request(s, "HEAD", "/refunds?key=a%20b"),
    ("/refunds", "head", "503"): without_the_table("HEAD", "refunds"),
    ("/refunds", "post", "201"): lambda s: refund(s, a_ticket(s), fresh_key()),
    ("/refunds", "post", "200"): refunded_twice,
    ("/refunds", "post", "400"): lambda s: exchange(s, post_bytes(b"{", target=b"/refunds")),
    ("/refunds", "post", "404"): lambda s: refund(s, 2**63 - 1),
    ("/refunds", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/refunds")[:-5], half_close=False
    ),
    ("/refunds", "post", "409"): refund_key_reused,
    ("/refunds", "post", "411"): lambda s: exchange(s, post_bytes(length=None, target=b"/refunds")),
    ("/refunds", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/refunds")
    ),
    ("/refunds", "post", "503"): post_locked("/refunds"),
    ("/reservations", "post", "201"): on_a_receiver_of_its_own(
        lambda s: reserve(s, a_ticket(s), 2, fresh_key())
    ),
    ("/reservations", "post", "200"): on_a_receiver_of_its_own(reserved_twice),
    ("/reservations", "post", "400"): lambda s: reserve(s, 1, 0),
    ("/reservations", "post", "404"): lambda s: reserve(s, 2**63 - 1, 1),
    ("/reservations", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/reservations")[:-5], half_close=False
    ),
    ("/reservations", "post", "409"): (  # "code": no_capacity, then key_conflict
        lambda s: reserve(s, a_ticket(s), 11),
        on_a_receiver_of_its_own(reservation_key_reused),
    ),
    ("/reservations", "post", "411"): lambda s: exchange(
        s, post_bytes(length=None, target=b"/reservations")
    ),
    ("/reservations", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/reservations")
    ),
    ("/reservations", "post", "503"): post_locked("/reservations"),
    ("/reservations", "get", "200"): lambda s: request(s, "GET", "/reservations"),
    ("/reservations", "get", "400"): lambda s: request(s, "GET", "/reservations?key=a%20b"),
    ("/reservations", "get", "503"): without_the_table("GET", "reservations"),
    ("/reservations", "head", "200"): lambda s: request(s, "HEAD", "/reservations"),
    ("/reservations", "head", "400"): lambda s: request(s, "HEAD", "/reservations?key=a%20b"),
    ("/reservations", "head", "503"): without_the_table("HEAD", "reservations"),
    ("/messages", "get", "200"): lambda s: request(s, "GET", "/messages"),
    ("/messages", "get", "400"): lambda s: request(s, "GET", "/messages?key=k"),
    ("/messages", "get", "503"): without_the_table("GET", "messages"),
    ("/messages", "head", "200"): lambda s: request(s, "HEAD", "/messages"),
    ("/messages", "head", "400"): lambda s: request(s, "HEAD", "/messages?key=k"),
    ("/messages", "head", "503"): without_the_table("HEAD", "messages"),
    ("/messages", "post", "201"): lambda s: request(
        s, "POST", "/messages", {"to": "a", "text": "b"}
    ),
    ("/messages", "post", "400"): lambda s: exchange(s, post_bytes(b"{", target=b"/messages")),
    ("/messages", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/messages")[:-5], half_close=False
    ),
    ("/messages", "post", "411"): lambda s: exchange(
        s, post_bytes(length=None, target=b"/messages")
    ),
    ("/messages", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/messages")
    ),
    ("/messages", "post", "503"): post_locked("/messages"),
    ("/payments", "get", "200"): lambda s: request(s, "GET", "/payments?reference=r&settled=1"),
    ("/payments", "get", "400"): lambda s: request(s, "GET", "/payments?settled=0"),
    ("/payments", "get", "503"): without_the_table("GET", "payments"),
    ("/payments", "head", "200"): lambda s: request(s, "HEAD", "/payments"),
    ("/payments", "head", "400"): lambda s: request(s, "HEAD", "/payments?key=k"),
    ("/payments", "head", "503"): without_the_table("HEAD", "payments"),
    ("/payments", "post", "201"): lambda s: request(
        s, "POST", "/payments", {"reference": "r", "amount": 1}
    ),
    ("/payments", "post", "400"): (
        lambda s: exchange(s, post_bytes(b"{", target=b"/payments")),
        lambda s: request(s, "POST", "/payments", {"reference": "r", "amount": 0}),
    ),
    ("/payments", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/payments")[:-5], half_close=False
    ),
    ("/payments", "post", "411"): lambda s: exchange(
        s, post_bytes(length=None, target=b"/payments")
    ),
    ("/payments", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/payments")
    ),
    ("/payments", "post", "503"): post_locked("/payments"),
    ("/webhooks", "post", "200"): on_a_receiver_of_its_own(delivered_to_a_subscriber),
    ("/webhooks", "post", "400"): (
        lambda s: exchange(s, post_bytes(b"{", target=b"/webhooks")),
        lambda s: request(s, "POST", "/webhooks", {"url": "ftp://example.com/hook"}),
    ),
    ("/webhooks", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/webhooks")[:-5], half_close=False
    ),
    ("/webhooks", "post", "411"): lambda s: exchange(
        s, post_bytes(length=None, target=b"/webhooks")
    ),
    ("/webhooks", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/webhooks")
    ),
    ("/webhooks", "post", "503"): post_locked("/webhooks"),
    ("/progress", "post", "200"): lambda s: request(
        s, "POST", "/progress", {"ticket_id": a_ticket(s), "statuses": ["opened", "resolved"]}
    ),
    ("/progress", "post", "400"): (
        lambda s: exchange(s, post_bytes(b"{", target=b"/progress")),
        lambda s: request(s, "POST", "/progress", {"ticket_id": 1, "statuses": ["closed"]}),
    ),
    ("/progress", "post", "409"): lambda s: progress_key_reused(s),
    ("/progress", "post", "404"): lambda s: request(
        s, "POST", "/progress", {"ticket_id": 2**62, "statuses": ["opened"]}
    ),
    ("/progress", "post", "408"): lambda s: exchange(
        s, post_bytes(target=b"/progress")[:-5], half_close=False
    ),
    ("/progress", "post", "411"): lambda s: exchange(
        s, post_bytes(length=None, target=b"/progress")
    ),
    ("/progress", "post", "413"): lambda s: exchange(
        s, post_bytes(title_body("x" * 5000), target=b"/progress")
    ),
    ("/progress", "post", "503"): post_locked("/progress"),
    (ANY, "", "400"): (
        lambda s: exchange(s, b"NONSENSE\r\n\r\n"),
        lambda s: exchange(s, b"GET /health HTTP/1.0\r\nX-Note: a\rIdempotency-Key: b\r\n\r\n"),
    ),
    (ANY, "", "404"): lambda s: request(s, "GET", "/admin"),
    (ANY, "", "405"): lambda s: request(s, "DELETE", "/tickets"),
    (ANY, "", "414"): lambda s: exchange(s, b"GET /" + b"a" * 65536 + b" HTTP/1.0\r\n\r\n"),
    (ANY, "", "431"): lambda s: exchange(s, b"GET / HTTP/1.0\r\n" + b"X-N: 1\r\n" * 101 + b"\r\n"),
    (ANY, "", "500"): with_a_row_it_did_not_write,
    (ANY, "", "501"): lambda s: exchange(s, b"QUERY /tickets HTTP/1.0\r\n\r\n"),
    (ANY, "", "503"): past_the_connection_cap,
    (ANY, "", "505"): lambda s: exchange(s, b"GET /health HTTP/2.0\r\n\r\n"),
}
ANSWERS |= saga_answers()
DOCUMENTED = [
    (path, method, status, pointer("paths", path, method, "responses", status))
    for path, operations in OPENAPI["paths"].items()
    for method, operation in operations.items()
    for status in operation["responses"]
] + [(ANY, "", status, pointer(ANY, status)) for status in OPENAPI[ANY]]


def statuses_api_py_sends():
    """Every status literal the lab's receiver (labs/receiver.py and the lessons' modules it
    serves), api.py (its core) and httpguard.py answer with: ClientError(N, ...) and
    `return/assign N, body`."""
    found = set()
    names = ("labs/keyless_providers.py", "labs/receiver.py", "labs/saga_store.py")
    names += ("labs/webhooks.py",)
    source = "".join((ROOT / name).read_text() for name in (*names, "api.py", "httpguard.py"))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ClientError":
            found.add(node.args[0].value)
        elif isinstance(node, ast.Return | ast.Assign) and getattr(node.value, "elts", None):
            first = node.value.elts[0]
            options = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
            found |= {getattr(o, "value", None) for o in options}
    return {v for v in found if type(v) is int and 100 <= v < 600}  # statuses, not flags


def statuses_http_server_sends():
    """The statuses BaseHTTPRequestHandler sends by itself (send_error(HTTPStatus.X, ...))."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(http.server.BaseHTTPRequestHandler)))
    return {
        HTTPStatus[node.args[0].attr].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "send_error"
        if isinstance(node.args[0], ast.Attribute)
    }


def test_every_status_the_receiver_can_send_is_in_openapi():
    sent = statuses_api_py_sends() | statuses_http_server_sends()
    assert {
        400,
        404,
        405,
        408,
        409,
        411,
        413,
        500,
        503,
    } <= sent  # the walk finds labs/receiver.py's own
    assert {400, 414, 431, 501, 505} <= statuses_http_server_sends()
    assert {int(status) for _, _, status, _ in DOCUMENTED} == sent


def test_openapi_documents_exactly_the_answers_we_can_provoke():
    assert {(p, m, s) for p, m, s, _ in DOCUMENTED} == set(ANSWERS)


def test_openapi_schemas_are_valid_json_schema():
    for schema in OPENAPI["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_the_validator_refuses_what_the_spec_forbids():
    """The checks below can fail: a wrong value or an undocumented field is caught."""
    schema_ref = pointer("components", "schemas", "PostResult")
    validate({"ticket_id": 1, "created": True}, schema_ref)
    for wrong in [
        {"ticket_id": 0, "created": True},
        {"ticket_id": 1},
        {"ticket_id": 1, "created": 1},
    ]:
        with pytest.raises(ValidationError):
            validate(wrong, schema_ref)
    with pytest.raises(ValidationError):
        validate({"ok": False}, pointer("components", "schemas", "Health"))
    conflict = pointer("components", "schemas", "KeyConflict")
    validate({"error": "used", "code": "key_conflict"}, conflict)
    for wrong in [{"error": "used"}, {"error": "used", "code": "no_capacity"}]:
        with pytest.raises(ValidationError):
            validate(wrong, conflict)
    with pytest.raises(ValidationError):  # a 409's code where no code is documented
        validate(
            {"error": "used", "code": "key_conflict"}, pointer("components", "schemas", "Error")
        )


@pytest.mark.parametrize(
    "path,method,status,ref",
    DOCUMENTED,
    ids=[
        f"{m.upper() or 'any request'} {p if m else ''} {s}".replace("  ", " ")
        for p, m, s, _ in DOCUMENTED
    ],
)
def test_the_receiver_answers_as_openapi_documents(server, stalled, path, method, status, ref):
    if status == "408":  # each waits out the request timeout: all of them at once
        answers_as_documented(stalled(path, method), method, status, ref)
        return
    provokers = ANSWERS[path, method, status]
    for provoke in provokers if isinstance(provokers, tuple) else [provokers]:
        answers_as_documented(provoke(server), method, status, ref)


@pytest.fixture(scope="module")
def stalled(server):
    """stalled(path, method): that route's 408 reply. The first call provokes every route's
    408 side by side: each waits out the request timeout, so one at a time they took seconds."""
    stalls = {(p, m): provoke for (p, m, s), provoke in ANSWERS.items() if s == "408"}
    with ThreadPoolExecutor(len(stalls)) as pool:
        replies = {}

        def reply(path, method):
            if not replies:
                replies.update({w: pool.submit(provoke, server) for w, provoke in stalls.items()})
            return replies[path, method].result()

        yield reply


def answers_as_documented(reply, method, status, ref):
    assert reply.status == int(status), reply
    response, ref = documented_response(ref)
    for name, header in response.get("headers", {}).items():
        assert name.lower() in reply.headers or not header["required"], f"{name} missing"
        if name.lower() in reply.headers:
            validate(reply.headers[name.lower()], pointer_join(ref, "headers", name, "schema"))
    if "text/plain" in response.get("content", {}):  # /metrics: Prometheus must parse it
        assert reply.headers["content-type"].startswith("text/plain; version=0.0.4"), reply
        assert list(text_string_to_metric_families(reply.body.decode())), reply
    elif "content" in response:
        assert reply.headers["content-type"] == "application/json", reply
        validate(reply.json(), pointer_join(ref, "content", "application/json", "schema"))
    else:
        assert method == "head" and reply.body == b"", reply


@pytest.mark.long
def test_schemathesis_finds_nothing_the_spec_does_not_allow(server):
    """schemathesis generates requests from openapi.yaml and checks every answer against it.

    tests/schemathesis.toml turns on every check and says why two deliberate answers (501 for
    an unknown method, 413 for an over-long invalid body) are expected.
    """
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(ROOT / "tests" / "schemathesis.toml"),
            "run",
            str(ROOT / "openapi.yaml"),
            "--url",
            server.url,
            "--max-examples",
            str(SCHEMATHESIS_EXAMPLES),
            "--generation-database",
            "none",
            # POST /webhooks makes the receiver POST to the url it names: fuzzed urls would
            # send it after hosts that answer slowly or never. Its answers are provoked above.
            "--exclude-path",
            "/webhooks",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=SCHEMATHESIS_DEADLINE_S,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr
    generated = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert generated and generated[1] == generated[2] and int(generated[1]) > 100, done.stdout
