"""The HTTP observer: every request a graph's run sends, recorded by the process that sends it.

While the drill runs (and `replay`), the process's `http.client.HTTPConnection` (which urllib
and requests/urllib3 send through) and the transports of httpx and httpx2 write each request
to a log just before it goes out: method, host, path, query, a digest of the body,
Idempotency-Key, and the thread of the graph run that sent it (LangGraph's `get_config()` in
the node's context). The log is a file opened for appending, so the requests of a crash child
outlive its SIGKILL, and forked children inherit the patches. A request sent outside any graph
run (an observer asking its service) has no thread and is not recorded.

Per crash point the drill compares each run's POST and PATCH requests with the clean run's, by
endpoint (method, path and query, the run's thread id taken out of them and of the body): sent
again without a key, sent again under another key, or sent again with its key (harmless where
the service honours it). A repeat the observer did not count as a duplicate is a finding of its
own. `observe="http"` makes the requests themselves the effects: an endpoint's count is its
requests without a key plus its distinct keys.
"""

import fnmatch
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from effectdrill.errors import safe
from effectdrill.kinds import EFFECT, MODEL, classify, query_template
from effectdrill.resent import (  # noqa: F401 - outbound's names too
    FINDINGS,
    IN_FLIGHT,
    NEW_KEY,
    NO_KEY,
    SAME_KEY,
    by_endpoint,
    effect_requests,
    keys,
    model_repeats,
    repeated_requests,
    requests_table,
    summary_words,
    totals_line,
)

KEY_HEADER = "idempotency-key"  # compared case-insensitively, as HTTP header names are
LOG_NAME = "requests.jsonl"
THREAD_MARK = "{thread}"  # what a run's thread id becomes in a recorded path


@dataclass(frozen=True)
class Request:
    thread: str
    method: str
    host: str
    path: str
    key: str | None
    answered: bool = True  # False: no answer came before the process died (in flight)
    query: str = ""  # the query string, the run's thread id taken out (like the path)
    body: str | None = None  # a digest of the body, the thread id taken out (None: unread)
    kind: str = EFFECT  # EFFECT, READ or MODEL (kinds.py)
    operation: str = ""  # a GraphQL request's operation ("mutation closeIssue")

    @property
    def endpoint(self):
        """Its name (kinds.py): method, path, the query's steady values, a GraphQL operation."""
        query = query_template(self.query)
        named = f"{self.method} {self.path}" + (f"?{query}" if query else "")
        return safe(named + (f" ({self.operation})" if self.operation else ""))


class RequestLog:
    """The requests recorded during one drill or replay, per thread (see the module's doc)."""

    def __init__(self, path, ignore=()):
        self.path = path
        self.ignore = tuple(ignore)  # hosts or host/path prefixes left out (a model API, say)
        self.pending = {}  # sent id -> (method, host, path): this process's requests

    def record(self, method, host, target, key, body=None):
        """Request `target` (a path with its query, or a URL) is about to go out: its id, or
        None when it belongs to no graph run or is ignored. body: bytes or str, if known."""
        thread = graph_run_thread()
        if thread is None:
            return
        parts = urlsplit(target if "://" in target else f"//host{target}")
        if any(ignored(f"{host}{parts.path}", pattern) for pattern in self.ignore):
            return
        # The run's thread id (and what the graph made from it, a message id "msg-{thread}")
        # differs run to run: taken out of the path, the query and the body, the same request
        # of two runs is one request.
        path, query = (mark(part, thread) for part in (parts.path or "/", parts.query))
        sent = uuid.uuid4().hex[:16]
        entry = [str(thread), method.upper(), host, path, key, query, digest(body, thread)]
        self.write(["sent", sent, *entry, *classify(method, host, path, body)])
        self.pending[sent] = (method, host, path)  # classified again once its body is sent
        return sent

    def body(self, sent, body):
        """The body of request `sent`, sent after its headers (urllib3 sends it so)."""
        thread = graph_run_thread()
        if sent is not None and thread is not None:
            kind = classify(*self.pending.get(sent, ("POST", "", "")), body)
            self.write(["body", sent, digest(body, thread), *kind])

    def answered(self, sent):
        """The answer to request `sent` (record's id) came: it was not in flight at a kill."""
        if sent is not None:
            self.write(["answered", sent])

    def write(self, entry):
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())  # one write: whole or absent
        finally:
            os.close(fd)

    def requests(self, thread):
        try:
            with open(self.path, encoding="utf-8") as log:
                lines = log.read().splitlines()
        except FileNotFoundError:
            return []
        sent, answered, bodies = {}, set(), {}
        for line in lines:
            try:
                entry = json.loads(line)
                if entry[0] == "answered":
                    answered.add(entry[1])
                elif entry[0] == "body":
                    bodies[entry[1]] = {"body": entry[2], "kind": entry[3], "operation": entry[4]}
                elif entry[0] == "sent" and entry[2] == thread:
                    sent[entry[1]] = Request(
                        *entry[2:7],
                        query=entry[7],
                        body=entry[8],
                        kind=entry[9],
                        operation=entry[10],
                    )
            except (ValueError, TypeError, IndexError):
                continue
        return [replace(r, answered=i in answered, **bodies.get(i, {})) for i, r in sent.items()]

    def effects(self, thread):
        """{endpoint: requests without a key + distinct keys} of the thread's POST and PATCH."""
        counts = {}
        for endpoint, sent in by_endpoint(self.requests(thread)).items():
            counts[endpoint] = sum(r.key is None for r in sent) + len(keys(sent))
        return counts

    def observe(self, thread):
        """The observer of `--observe http`: the requests are the effects."""
        return self.effects(thread)

    def annotate(self, report, clean_threads):
        """Give each row its repeated requests and the report their totals (report.requests)."""
        totals = dict.fromkeys(FINDINGS, 0) | {"not counted": 0, "recorded": 0, MODEL: 0}
        for thread in clean_threads.values():
            totals["recorded"] += len(effect_requests(self.requests(thread)))
        for row in report.rows:
            clean = self.requests(clean_threads[row.durability])
            runs = [self.requests(run.thread) for run in row.judged()]
            totals["recorded"] += sum(len(effect_requests(sent)) for sent in runs)
            row.requests = repeated_requests(clean, runs, counted=bool(row.duplicates()))
            row.requests += model_repeats(clean, runs)
            for repeat in row.requests:
                totals[MODEL] += repeat["repeat"] == MODEL
                if repeat["repeat"] in FINDINGS:
                    totals[repeat["repeat"]] += 1
                    totals["not counted"] += not repeat["counted"]
        report.requests = totals


# helpers


def ignored(where, pattern):
    """--http-ignore: a prefix of host:port/path ("api.openai.com:443/v1"), or a glob
    ("*:443/v1/*", fnmatch: "*" also matches "/")."""
    return where.startswith(pattern) or fnmatch.fnmatchcase(where, pattern)


def mark(text, thread):
    """`text` with the run's thread id taken out: what two runs' requests share."""
    return text.replace(str(thread), THREAD_MARK)


def digest(body, thread):
    """A short digest of a request's body with the run's thread id taken out, or None."""
    if isinstance(body, bytes | bytearray | memoryview):
        body = bytes(body).decode("utf-8", errors="replace")
    if not isinstance(body, str):
        return None  # a file or a stream: not read here
    return hashlib.sha256(mark(body, thread).encode()).hexdigest()[:16]


def graph_run_thread():
    """The thread id of the graph run this code runs in, or None outside any run."""
    try:
        from langgraph.config import get_config

        return get_config().get("configurable", {}).get("thread_id")
    except (ImportError, RuntimeError):
        return None


@contextmanager
def recording_requests(ignore=()):
    """A RequestLog in a temporary folder, with the HTTP clients patched to feed it."""
    folder = tempfile.mkdtemp(prefix="effectdrill-http-")
    log = RequestLog(os.path.join(folder, LOG_NAME), ignore)
    try:
        with patched(log):
            yield log
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def patched(log):
    """http.client.HTTPConnection, httpx's (and httpx2's) transports and aiohttp's client
    record to `log`; restored after."""
    import http.client

    restore = []

    def patch(owner, name, replacement):
        restore.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    connection = http.client.HTTPConnection
    putrequest, putheader, endheaders = (
        connection.putrequest,
        connection.putheader,
        connection.endheaders,
    )

    def recording_putrequest(self, method, url, *args, **kwargs):
        self.__dict__.pop("_effectdrill_body", None)  # the last request's: it sent none
        self._effectdrill_request = [method, url, None]
        return putrequest(self, method, url, *args, **kwargs)

    def recording_putheader(self, header, *values):
        pending = getattr(self, "_effectdrill_request", None)
        name = header.decode("latin-1") if isinstance(header, bytes) else str(header)
        if pending is not None and name.lower() == KEY_HEADER and values:
            value = values[0]
            pending[2] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        return putheader(self, header, *values)

    def recording_endheaders(self, message_body=None, **kwargs):
        pending = self.__dict__.pop("_effectdrill_request", None)
        if pending is not None:  # before the headers go out: a kill after still counts it
            host = f"{self.host}:{self.port}"
            sent = log.record(pending[0], host, pending[1], pending[2], message_body)
            self._effectdrill_sent = sent
        sent_headers = endheaders(self, message_body, **kwargs)
        if pending is not None and message_body is None:  # its body, if any, comes next
            self._effectdrill_body = self._effectdrill_sent
        return sent_headers

    def recording_send(self, data):
        sent = self.__dict__.pop("_effectdrill_body", None)
        if sent is not None:
            log.body(sent, data)
        return send(self, data)

    def recording_getresponse(self, *args, **kwargs):
        answer = getresponse(self, *args, **kwargs)
        log.answered(self.__dict__.pop("_effectdrill_sent", None))
        return answer

    getresponse, send = connection.getresponse, connection.send
    patch(connection, "send", recording_send)
    patch(connection, "putrequest", recording_putrequest)
    patch(connection, "putheader", recording_putheader)
    patch(connection, "endheaders", recording_endheaders)
    patch(connection, "getresponse", recording_getresponse)
    for httpx in installed_httpx():
        patch_httpx(httpx, log, patch)
    if "aiohttp" in sys.modules:  # imported by the graph's modules: importing it costs 0.3 s
        patch_aiohttp(sys.modules["aiohttp"], log, patch)
    try:
        yield log
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)


def installed_httpx():
    """httpx, and httpx2 (its successor, which openai 3.x and langsmith send through), where
    installed: their transports have the same names and arguments."""
    return installed_modules("httpx", "httpx2")


def installed_modules(*names):
    """The modules of `names` that are installed (imported by name: none is a dependency)."""
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            pass
    return found


def patch_httpx(httpx, log, patch):
    """httpx's (or httpx2's) default sync and async transports record to `log`."""
    sync_send = httpx.HTTPTransport.handle_request
    async_send = httpx.AsyncHTTPTransport.handle_async_request

    def handle_request(self, request):
        sent = record_httpx(log, request)
        answer = sync_send(self, request)
        log.answered(sent)
        return answer

    async def handle_async_request(self, request):
        sent = record_httpx(log, request)
        answer = await async_send(self, request)
        log.answered(sent)
        return answer

    patch(httpx.HTTPTransport, "handle_request", handle_request)
    patch(httpx.AsyncHTTPTransport, "handle_async_request", handle_async_request)


def patch_aiohttp(aiohttp, log, patch):
    """aiohttp's ClientRequest.send (the request's head goes out in it) and
    ClientResponse.start (it returns once the answer's head came) record to `log`."""
    send, start = aiohttp.ClientRequest.send, aiohttp.ClientResponse.start
    BytesPayload = importlib.import_module("aiohttp.payload").BytesPayload  # noqa: N806

    async def recording_send(self, conn):
        body = self.body  # a BytesPayload (bytes, a str, json=) is read; a stream is not
        body = body.decode() if isinstance(body, BytesPayload) else body
        url = self.url
        host = f"{url.host}:{url.port}"
        sent = log.record(self.method, host, url.raw_path_qs, self.headers.get(KEY_HEADER), body)
        response = await send(self, conn)
        if sent is not None:
            response._effectdrill_sent = sent
        return response

    async def recording_start(self, connection):
        answer = await start(self, connection)
        log.answered(self.__dict__.pop("_effectdrill_sent", None))
        return answer

    patch(aiohttp.ClientRequest, "send", recording_send)
    patch(aiohttp.ClientResponse, "start", recording_start)


def record_httpx(log, request):
    url = request.url
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    try:
        body = request.content  # read already, unless it is a stream
    except Exception:
        body = None
    target = url.raw_path.decode("ascii", errors="replace")  # the path and the query, as sent
    return log.record(
        request.method, f"{url.host}:{port}", target, request.headers.get(KEY_HEADER), body
    )
