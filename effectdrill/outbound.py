"""The HTTP observer: every request a graph's run sends, recorded by the process that sends it.

While the drill runs (and `replay`), the process's `http.client.HTTPConnection` (which urllib
and requests/urllib3 send through) and the transports of httpx and httpx2 write each request
to a log just before it goes out: method, host, path, Idempotency-Key, and the thread of the
graph run that sent it (LangGraph's `get_config()` in the node's context). The log is a file
opened for appending, so the requests of a crash child outlive its SIGKILL, and forked
children inherit the patches. A request sent outside any graph run (an observer asking its
service) has no thread and is not recorded.

Per crash point the drill compares each run's POST and PATCH requests with the clean run's, by
endpoint (method and path): sent again without a key, sent again under another key, or sent
again with its key (harmless where the service honours it). A repeat the observer did not count
as a duplicate is a finding of its own. `observe="http"` makes the requests themselves the
effects: an endpoint's count is its requests without a key plus its distinct keys.
"""

import fnmatch
import importlib
import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

KEY_HEADER = "idempotency-key"  # compared case-insensitively, as HTTP header names are
# RFC 9110 section 9.2.2: GET, HEAD, OPTIONS and TRACE are safe, PUT and DELETE idempotent; a
# repeat of POST or PATCH is a new effect unless the service deduplicates it.
EFFECT_METHODS = ("POST", "PATCH")
LOG_NAME = "requests.jsonl"
THREAD_MARK = "{thread}"  # what a run's thread id becomes in a recorded path
NO_KEY, NEW_KEY, SAME_KEY = "no key", "new key", "same key"  # what a repeat carried
IN_FLIGHT = "in flight"  # more only by a request the kill left without its answer
FINDINGS = (NO_KEY, NEW_KEY)  # the repeats that make a new effect at a key-honouring service


@dataclass(frozen=True)
class Request:
    thread: str
    method: str
    host: str
    path: str
    key: str | None
    answered: bool = True  # False: no answer came before the process died (in flight)

    @property
    def endpoint(self):
        return f"{self.method} {self.path}"


class RequestLog:
    """The requests recorded during one drill or replay, per thread (see the module's doc)."""

    def __init__(self, path, ignore=()):
        self.path = path
        self.ignore = tuple(ignore)  # hosts or host/path prefixes left out (a model API, say)

    def record(self, method, host, target, key):
        thread = run_thread()
        if thread is None:
            return
        path = urlsplit(target).path if "://" in target else target.split("?", 1)[0]
        if any(ignored(f"{host}{path}", pattern) for pattern in self.ignore):
            return
        # The run's thread id (and what the graph made from it, a message id "msg-{thread}")
        # differs run to run: taken out, the same request of two runs is one endpoint.
        path = (path or "/").replace(str(thread), THREAD_MARK)
        sent = uuid.uuid4().hex[:16]
        self.write(["sent", sent, str(thread), method.upper(), host, path, key])
        return sent

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
        sent, answered = {}, set()
        for line in lines:
            try:
                entry = json.loads(line)
                if entry[0] == "answered":
                    answered.add(entry[1])
                elif entry[0] == "sent" and entry[2] == thread:
                    sent[entry[1]] = Request(*entry[2:])
            except (ValueError, TypeError, IndexError):
                continue
        return [replace(r, answered=i in answered) for i, r in sent.items()]

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
        totals = dict.fromkeys(FINDINGS, 0) | {"not counted": 0, "recorded": 0}
        for thread in clean_threads.values():
            totals["recorded"] += len(effect_requests(self.requests(thread)))
        for row in report.rows:
            clean = self.requests(clean_threads[row.durability])
            runs = [self.requests(run.thread) for run in row.judged()]
            totals["recorded"] += sum(len(effect_requests(sent)) for sent in runs)
            row.requests = repeats(clean, runs, counted=bool(row.duplicates()))
            for repeat in row.requests:
                if repeat["repeat"] in FINDINGS:
                    totals[repeat["repeat"]] += 1
                    totals["not counted"] += not repeat["counted"]
        report.requests = totals


def repeats(clean, runs, counted):
    """The endpoints a row's runs sent more often than the clean run, and with what key."""
    found = []
    clean_by = by_endpoint(clean)
    runs_by = [by_endpoint(sent) for sent in runs]
    endpoints = dict.fromkeys(e for sent in runs_by for e in sent)
    for endpoint in endpoints:
        before = clean_by.get(endpoint, [])
        sent = [s.get(endpoint, []) for s in runs_by]
        if not any(len(s) > len(before) for s in sent):
            continue
        if not any(len([r for r in s if r.answered]) > len(before) for s in sent):
            found.append(repeat_entry(endpoint, sent, before, IN_FLIGHT, True))
            continue  # more only with a request the kill left unanswered: it may never have
        unkeyed = [sum(r.key is None for r in s) for s in sent]
        distinct = [len(keys(s)) for s in sent]
        if any(n > sum(r.key is None for r in before) for n in unkeyed):
            kind = NO_KEY
        elif any(n > len(keys(before)) for n in distinct):
            kind = NEW_KEY
        else:
            kind = SAME_KEY
        found.append(repeat_entry(endpoint, sent, before, kind, counted or kind == SAME_KEY))
    return found


def repeat_entry(endpoint, sent, before, kind, counted):
    return {
        "endpoint": endpoint,
        "hosts": sorted({r.host for s in sent for r in s}),
        "sent": [len(s) for s in sent],
        "in_flight": [sum(not r.answered for r in s) for s in sent],
        "clean": len(before),
        "without_key": [sum(r.key is None for r in s) for s in sent],
        "keys": [len(keys(s)) for s in sent],
        "repeat": kind,
        "counted": counted,
    }


def table(report):
    """The requests block of the drill's table: one line per endpoint a crash point resent."""
    lines = [["durability", "point", "request", "sent", "keys", "repeat"]]
    for row in report.rows:
        for repeat in getattr(row, "requests", []):
            clean = repeat["clean"]
            words = {
                NO_KEY: "REPEATED WITHOUT A KEY",
                NEW_KEY: "REPEATED UNDER A NEW KEY",
                SAME_KEY: "resent with its key",
                IN_FLIGHT: "in flight at the kill, sent again",
            }[repeat["repeat"]]
            if not repeat["counted"]:
                words += ", NOT COUNTED by the observer"
            lines.append(
                [
                    row.durability,
                    row.point,
                    repeat["endpoint"],
                    f"{' '.join(map(str, repeat['sent']))} (clean {clean})",
                    " ".join(map(str, repeat["keys"])),
                    words,
                ]
            )
    if len(lines) == 1:
        return ""
    if len({line[0] for line in lines[1:]}) == 1:
        lines = [line[1:] for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    body = "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
    title = "requests sent again (POST and PATCH; http.client and httpx)"
    return f"{title}\n{body}\n{totals_line(report.requests)}"


def totals_line(totals):
    """The requests block's last line: how many repeats of each kind the crash points made."""
    return (
        f"requests: {totals[NO_KEY]} repeated without a key, {totals[NEW_KEY]} under a new "
        f"key, {totals['not counted']} not counted by the observer"
    )


def summary_words(totals):
    """', N requests ...' for the summary line when a repeat went uncounted, else ''."""
    if not totals or not totals["not counted"]:
        return ""
    return f", {totals['not counted']} repeated requests not counted by the observer"


# helpers


def ignored(where, pattern):
    """--http-ignore: a prefix of host:port/path ("api.openai.com:443/v1"), or a glob
    ("*:443/v1/*", fnmatch: "*" also matches "/")."""
    return where.startswith(pattern) or fnmatch.fnmatchcase(where, pattern)


def run_thread():
    """The thread id of the graph run this code runs in, or None outside any run."""
    try:
        from langgraph.config import get_config

        return get_config().get("configurable", {}).get("thread_id")
    except (ImportError, RuntimeError):
        return None


def effect_requests(sent):
    return [r for r in sent if r.method in EFFECT_METHODS]


def by_endpoint(sent):
    grouped = {}
    for request in effect_requests(sent):
        grouped.setdefault(request.endpoint, []).append(request)
    return grouped


def keys(sent):
    return {r.key for r in sent if r.key is not None}


@contextmanager
def recording(ignore=()):
    """A RequestLog in a temporary folder, with http.client and httpx patched to feed it."""
    folder = tempfile.mkdtemp(prefix="effectdrill-http-")
    log = RequestLog(os.path.join(folder, LOG_NAME), ignore)
    try:
        with patched(log):
            yield log
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def patched(log):
    """http.client.HTTPConnection and httpx's (and httpx2's) transports record to `log`;
    restored after."""
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
        self._effectdrill_request = [method, url, None]
        return putrequest(self, method, url, *args, **kwargs)

    def recording_putheader(self, header, *values):
        pending = getattr(self, "_effectdrill_request", None)
        name = header.decode("latin-1") if isinstance(header, bytes) else str(header)
        if pending is not None and name.lower() == KEY_HEADER and values:
            value = values[0]
            pending[2] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        return putheader(self, header, *values)

    def recording_endheaders(self, *args, **kwargs):
        pending = self.__dict__.pop("_effectdrill_request", None)
        if pending is not None:  # before the headers go out: a kill after still counts it
            host = f"{self.host}:{self.port}"
            self._effectdrill_sent = log.record(pending[0], host, pending[1], pending[2])
        return endheaders(self, *args, **kwargs)

    def recording_getresponse(self, *args, **kwargs):
        answer = getresponse(self, *args, **kwargs)
        log.answered(self.__dict__.pop("_effectdrill_sent", None))
        return answer

    getresponse = connection.getresponse
    patch(connection, "putrequest", recording_putrequest)
    patch(connection, "putheader", recording_putheader)
    patch(connection, "endheaders", recording_endheaders)
    patch(connection, "getresponse", recording_getresponse)
    for httpx in installed_httpx():
        patch_httpx(httpx, log, patch)
    try:
        yield log
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)


def installed_httpx():
    """httpx, and httpx2 (its successor, which openai 3.x and langsmith send through), where
    installed: their transports have the same names and arguments."""
    found = []
    for name in ("httpx", "httpx2"):
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


def record_httpx(log, request):
    url = request.url
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    return log.record(
        request.method, f"{url.host}:{port}", url.path, request.headers.get(KEY_HEADER)
    )
