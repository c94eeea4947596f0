"""The services for the tests, as real processes on free loopback ports, data in temp folders:
api.py (the ticket provider, API_URL), and a stand-in provider this file serves itself
(`python tests/service.py`) for what api.py cannot play: a provider that takes no key and
is looked up by a reference, one that commits late, one without a lookup whose own count is the
only evidence. It keeps what it made in memory, for the life of its process.

    POST /THINGS        a JSON object: 201 {"id": N, "THING_id": N, **body}, made under the path
                        (/payments: payment_id). With STANDIN_KEYED=1 an Idempotency-Key is
                        honoured as the IETF Idempotency-Key draft says: its body again gets
                        200 and the first answer, or 409 while the first is still being
                        processed (in progress); another body 422 {"error", "code"}
    GET  /THINGS?F=V    {"THINGS": [answers]}: what was made under the path whose body has F
                        equal to V (GET /payments?reference=R: the charges made for R)
    GET  /made?FIELD=V  what was made, as {"made": [{"id", "path", "key", "body"}]}, only
                        those whose body has FIELD equal to V (key=V: the Idempotency-Key),
                        and "handled": how many POSTs it has made or refused (not those held)
    GET  /health        200 {"ok": true}
    SMTP on SMTP_PORT   (when set) each message taken is a thing under /smtp, its id the
                        message's Message-ID

Its settings: PORT (0: any), STANDIN_KEYED ("": no key honoured), FAILPOINTS: before-commit
(a POST received and not yet made, held once per body: a resend passes) and after-commit (made,
its answer not yet written), e.g. before-commit=pause(PATH) for a provider that commits late.
"""

import email
import json
import os
import re
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the folder with api.py and workflow.py
START_DEADLINE_S = 60.0  # a hang guard: a service answers /health in under a second (unless busy)
RUN_TIMEOUT_S = 120.0  # seconds for one workflow.py command (LangGraph imports in about 1 s)
POLL_S = 0.01  # seconds between two looks at a condition a test waits for
STANDIN_POINTS = ("before-commit", "after-commit")


class ServiceTestCase(unittest.TestCase):
    """Each test gets its own api.py (self.url), one service for each other provider
    workflow.py declares (self.urls, by name) and environment for workflow.py (self.env);
    standin() starts a stand-in provider for it. held_at_providers: every provider holds the
    first request of each body it reads before it makes anything (pause at held(NAME))."""

    held_at_providers = False

    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
        self.env.update(
            PORT=str(port),
            API_URL=self.url,
            RECEIVER_DB=str(self.folder / "receiver.sqlite"),
            CHECKPOINT_DB=str(self.folder / "checkpoints.sqlite"),
        )
        env = dict(self.env, FAILPOINTS=self.holding("API"))
        self.receiver = self.serve([HERE / "api.py"], env, "receiver")
        self.urls = self.providers()  # each other provider workflow.py declares: its own

    def held(self, name):
        """The pause file of provider name's before-commit point (held_at_providers)."""
        return self.folder / f"held-{name}"

    def holding(self, name):
        return f"before-commit=pause({self.held(name)})" if self.held_at_providers else ""

    def receiver_with(self, fail):
        """Another api.py, with FAILPOINTS=fail (e.g. after-commit=pause(PATH)), and its
        own data, in place of the first for the rest of the test (self.url, API_URL)."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(self.env, PORT=str(port), FAILPOINTS=fail)
        env["RECEIVER_DB"] = str(self.folder / f"receiver-{port}.sqlite")
        self.serve([HERE / "api.py"], env, f"receiver-{port}")
        self.env.update(PORT=str(port), API_URL=self.url)

    def serve(self, command, env, name):
        """A service process, stopped after the test, once it answers /health at env's PORT."""
        log_path = self.folder / f"{name}.log"
        log = self.enterContext(open(log_path, "wb"))
        process = subprocess.Popen([sys.executable, *map(str, command)], env=env, stderr=log)
        self.addCleanup(process.wait, 10)
        self.addCleanup(process.terminate)
        url = f"http://127.0.0.1:{env['PORT']}"
        self.wait_until(
            lambda: healthy(url) or process.poll() is not None, f"{name} to answer /health"
        )
        self.assertIsNone(process.poll(), f"{name} exited: {log_path.read_text()}")
        return process

    def standin(self, fail="", keyed=False, smtp_port=None):
        """A stand-in provider's URL (see this file's docstring); smtp_port: it takes mail
        there too (SMTP_PORT)."""
        env = dict(self.env, PORT=str(free_port()), FAILPOINTS=fail, STANDIN_KEYED="1" * keyed)
        if smtp_port is not None:
            env["SMTP_PORT"] = str(smtp_port)
        self.serve([Path(__file__)], env, f"standin-{env['PORT']}")
        return f"http://127.0.0.1:{env['PORT']}"

    def providers(self):
        """Every provider workflow.py declares but API (api.py's) pointed at one of its own,
        derived from its declaration: a api.py for one that speaks the receiver's client
        (TicketClient), else a stand-in, keyed as the declaration says (a keyed one answers
        "in progress" while a key's first request is held). Returns {name: its URL}; what they
        made is made_at_providers()."""
        import workflow

        self.others = {}
        for provider in declared_providers():
            if provider.name == "API":
                continue
            if issubclass(provider.client_class, workflow.TicketClient):
                port = free_port()
                env = dict(self.env, PORT=str(port), FAILPOINTS=self.holding(provider.name))
                env["RECEIVER_DB"] = str(self.folder / f"{provider.name}.sqlite")
                self.serve([HERE / "api.py"], env, provider.name)
                url = f"http://127.0.0.1:{port}"
                self.others[provider.name] = (url, made_by_receiver)
            elif "smtp" in getattr(provider.client_class, "schemes", ()):  # mail: over SMTP
                port = free_port()
                url = self.standin(self.holding(provider.name), smtp_port=port)
                self.others[provider.name] = (url, lambda url: len(made(url)))
                self.env[f"{provider.name.upper()}_URL"] = f"smtp://127.0.0.1:{port}"
                continue
            else:
                url = self.standin(self.holding(provider.name), keyed=provider.keyed)
                self.others[provider.name] = (url, lambda url: len(made(url)))
            self.env[f"{provider.name.upper()}_URL"] = url
        return {name: url for name, (url, _) in self.others.items()}

    def made_at_providers(self):
        """How many things every provider made since it started: api.py's and those
        providers() started, each by its own count."""
        return made_by_receiver(self.url) + sum(count(url) for url, count in self.others.values())

    def wait_until(self, condition, what, deadline_s=START_DEADLINE_S):
        """Until condition() is true; a hang guard, not a timing: it fails after deadline_s."""
        deadline = time.monotonic() + deadline_s
        while not condition():
            self.assertLess(time.monotonic(), deadline, f"waited {deadline_s} s for {what}")
            time.sleep(POLL_S)

    def tickets(self, key=None):
        """What the outside world holds: every ticket the receiver has, or those of one key."""
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return get_json(self.url + "/tickets" + query)["tickets"]

    def counted(self, name):
        """One of the receiver's counters (GET /metrics): what it did since it started."""
        return counters(self.url).get(name, 0)

    def workflow(self, *args, fail="", env=None):
        """workflow.py run as a real process to its end (a CompletedProcess)."""
        env = dict(env or self.env, FAILPOINTS=fail)
        return subprocess.run(
            [sys.executable, str(HERE / "workflow.py"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )

    def workflow_started(self, *args, fail="", name="run"):
        """workflow.py started as a real process: (Popen, its stdout file, its stderr file)."""
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(HERE / "workflow.py"), *args],
                env=dict(self.env, FAILPOINTS=fail),
                stdout=stdout,
                stderr=stderr,
            )
        self.addCleanup(process.wait, 10)
        self.addCleanup(lambda: process.poll() is None and process.kill())
        return process, out, err


def events(done):
    """The JSON lines a workflow.py run printed (a CompletedProcess, or its output)."""
    text = done if isinstance(done, str) else done.stdout
    return [json.loads(line) for line in text.splitlines()]


def context(env, ledger=None):
    """What workflow.py's nodes get as runtime.context, made from env as its main() makes it:
    each provider's client, context(...).client_for(effect) the one an effect's send and lookup
    are called with."""
    import workflow

    clients = workflow.Settings.from_environ(env).clients()
    return workflow.Context(clients.get("API"), ledger, clients)


def declared_providers():
    """The providers workflow.py declares: its providers.Provider instances."""
    import providers
    import workflow

    return [v for v in vars(workflow).values() if isinstance(v, providers.Provider)]


def made_by_receiver(url):
    """How many things api.py made since it started (its *_created counters, summed)."""
    return sum(n for name, n in counters(url).items() if name.endswith("_created"))


def counters(url):
    """api.py's counters, {name: value}, from GET /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {m[1]: int(m[2]) for m in re.finditer(r"^receiver_(\w+)_total (\d+)$", text, re.M)}


def made(url, **where):
    """What a stand-in provider made, as it says (GET /made), those matching where only."""
    return get_json(f"{url}/made?{urllib.parse.urlencode(where)}")["made"]


def handled(url):
    """How many POSTs a stand-in provider has made something for, or refused, so far."""
    return get_json(f"{url}/made")["handled"]


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StandInClient:
    """A client of the stand-in provider, for effects a test declares: post(path, body, key)
    and made(**where). gives_up_s: how long it waits for the first POST's answer (later ones,
    and lookups, wait 5 s); first_arrived(): called before any later POST leaves, to wait until
    the first is at the provider. A timeout raises TimeoutError (sent; its outcome unknown), a
    refused connection URLError, an answer of 4xx or 5xx urllib's HTTPError."""

    def __init__(self, url, gives_up_s=5.0, first_arrived=lambda: None):
        self.url, self.waits, self.first_arrived = url, [gives_up_s], first_arrived

    def post(self, path, body, key=None):
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        if key is not None:
            request.add_header("Idempotency-Key", key)
        if not self.waits:
            self.first_arrived()
        wait_s = self.waits.pop() if self.waits else 5.0
        with urllib.request.urlopen(request, timeout=wait_s) as response:
            return json.load(response)

    def made(self, **where):
        return made(self.url, **where)


# the stand-in provider: `python tests/service.py`


class StandIn(BaseHTTPRequestHandler):
    lock = threading.Lock()
    things = []  # what was made: {"id", "path", "key", "body"}
    handled = 0  # POSTs made or refused
    keyed = False
    processing = set()  # keys whose first request is still being processed

    def do_POST(self):
        from failpoints import fail

        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body, key = json.loads(raw), self.headers.get("Idempotency-Key")
        keyed = self.keyed and key is not None
        with self.lock:
            if keyed and key in self.processing:  # the first is still at the provider
                StandIn.handled += 1
                busy = {"error": "a request with this key is in progress", "code": "in_progress"}
                return self.answer(409, busy)
            first = next((t for t in self.things if keyed and t["key"] == key), None)
            if first is not None:
                StandIn.handled += 1
                if first["body"] != body:
                    conflict = {"error": "key used for another body", "code": "key_conflict"}
                    return self.answer(422, conflict)
                return self.answer(200, answer_of(first))
            if keyed:
                self.processing.add(key)
        try:
            fail("before-commit", once_per=raw)  # received, not made yet (a late commit)
            with self.lock:
                StandIn.handled += 1
                first = {"id": len(self.things) + 1, "path": self.path, "key": key, "body": body}
                self.things.append(first)
        finally:
            with self.lock:
                self.processing.discard(key)
        fail("after-commit")  # made, and its answer not written yet (a lost answer)
        self.answer(201, answer_of(first))

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/health":
            return self.answer(200, {"ok": True})
        where = dict(urllib.parse.parse_qsl(url.query))
        with self.lock:
            found = [t for t in self.things if all(matches(t, k, v) for k, v in where.items())]
            if url.path == "/made":
                return self.answer(200, {"made": found, "handled": self.handled})
            things = url.path.strip("/")  # a provider's own look: GET /payments?reference=R
            found = [answer_of(t) for t in found if t["path"] == url.path]
            self.answer(200, {things: found})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up: what was made stays made
            pass

    def log_message(self, *args):
        pass


def answer_of(thing):
    """What the provider answers about a thing: its id, also as THING_id (/payments:
    payment_id), and the body it was made with."""
    singular = thing["path"].strip("/").split("/")[-1].removesuffix("s")
    return {"id": thing["id"], f"{singular}_id": thing["id"], **thing["body"]}


def matches(thing, field, value):
    return str(thing["key"] if field == "key" else thing["body"].get(field)) == value


class SmtpStandIn(socketserver.StreamRequestHandler):
    """The stand-in's SMTP side (SMTP_PORT): the replies smtplib needs, and each message it
    takes kept as a thing under the path /smtp, its id the message's Message-ID (what a person
    finds in a mailbox and gives reconcile --confirmed KEY=ID)."""

    def handle(self):
        from failpoints import fail

        self.say("220 stand-in")
        while line := self.rfile.readline():
            verb = line[:4].upper()
            if verb == b"DATA":
                self.say("354 end with <CRLF>.<CRLF>")
                raw = b"".join(iter(lambda: self.rfile.readline(), b".\r\n"))
                raw = raw.replace(b"\r\n..", b"\r\n.")  # dot-stuffing undone
                message = email.message_from_bytes(raw)
                fail("before-commit", once_per=raw)  # received, not taken yet
                with StandIn.lock:
                    StandIn.handled += 1
                    body = {"to": message["To"], "message_id": message["Message-ID"]}
                    thing = {"id": message["Message-ID"], "path": "/smtp", "key": None}
                    StandIn.things.append({**thing, "body": body})
                self.say("250 taken")
            elif verb == b"QUIT":
                return self.say("221 bye")
            else:  # EHLO, MAIL, RCPT, RSET, NOOP
                self.say("250 ok")

    def say(self, reply):
        self.wfile.write(reply.encode() + b"\r\n")


def serve_standin():
    sys.path.insert(0, str(HERE))
    import failpoints

    failpoints.configure(os.environ.get("FAILPOINTS", ""), known=STANDIN_POINTS)
    StandIn.keyed = os.environ.get("STANDIN_KEYED", "") == "1"
    if smtp_port := os.environ.get("SMTP_PORT"):  # an SMTP provider's: its other side
        smtp = socketserver.ThreadingTCPServer(("127.0.0.1", int(smtp_port)), SmtpStandIn)
        smtp.daemon_threads = True
        threading.Thread(target=smtp.serve_forever, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "0"))), StandIn)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    serve_standin()
