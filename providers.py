"""A provider: a service your effects change, declared once (Provider("API", url=...)), and its
HTTP client: JSON in and out, the key as Idempotency-Key, a refused connection or a busy 503
tried again, and what its error answers mean for an effect (HttpAnswers). Its settings come from
the environment under one rule, NAME being the provider's name:
    {NAME}_URL        its address (a scheme, a host, a port)
    {NAME}_TIMEOUT_S  seconds to wait for one answer (default 5)
    {NAME}_ATTEMPTS   tries of a request whose connection was refused (default 4; a host name
                      that does not resolve: at most 2); a busy 503 gets twice as many (8)
    {NAME}_TOKEN      "" (none); else sent as `Authorization: Bearer TOKEN`, never printed
"""

import dataclasses
import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import tracing
from exitcodes import EXIT_NO_ANSWER, EXIT_USAGE, NoAnswer, Unreachable, UserError

TIMEOUT_S = 5.0  # a provider's default; the receiver answers in milliseconds: 5 s means gone
ATTEMPTS = 4  # tries of a request whose connection was refused: 0.25, 0.5, 1 s apart,
RETRY_DELAY_S = 0.25  # enough for a receiver that is starting or restarting
MAX_RETRY_DELAY_S = 2.0  # the delays double up to this
BUSY_TRIES_PER_ATTEMPT = 2  # a 503 (busy) gets twice ATTEMPTS tries, each after the receiver's
#   busy timeout (api.py BUSY_TIMEOUT_S, 2 s) and the delay (0.25 s doubling to 2 s): about 26 s,
#   past a 10 s lock another program holds on the receiver's file (a backup, an sqlite3 shell).
#   Past it the receiver is down in effect, nothing was committed, and the line names the resume.
SETTLE_S = 60.0  # a provider's default settle_s: it commits what it accepted within it, or never


class HttpClient:
    """A provider's HTTP client: JSON in and out, the key as Idempotency-Key, a refused
    connection or a busy 503 tried again. Plain urllib: commands that use only this load fast.
    Subclass it with your provider's calls (workflow.TicketClient); Provider.client builds it."""

    schemes = ("http", "https")  # what {NAME}_URL may say (checked_url)

    def __init__(self, url, timeout_s=TIMEOUT_S, attempts=ATTEMPTS, headers=None, name="API"):
        self.url, self.timeout_s, self.attempts = url.rstrip("/"), timeout_s, attempts
        self.name = name  # the provider's: its settings are {name}_URL, ...
        self.label = name  # how a line names it (Provider.label: "the receiver" for API)
        self.headers = dict(headers or {})  # sent with every request

    def call(self, path, payload=None, key=None):
        """One request, tried again after a refused connection (attempts tries) or a 503 that
        says when to retry (twice as many: the receiver is there, waiting for its database):
        neither committed. A 503 without Retry-After (a damaged database) is not retried."""
        delays, refused, busy = retry_delays(), 0, 0
        while True:
            try:
                return self.send(path, payload, key)
            except Unreachable as error:
                refused += 1
                # A name that does not resolve (Compose's DNS knows no stopped service) costs a
                # lookup per try: one more try covers a restart, not four lookups of a gone host.
                unnamed = isinstance(getattr(error.__cause__, "reason", None), socket.gaierror)
                if refused >= (min(self.attempts, UNRESOLVED_TRIES) if unnamed else self.attempts):
                    raise
            except urllib.error.HTTPError as error:  # 503: busy, the transaction rolled back
                busy += 1
                retry = error.code == 503 and error.headers.get("Retry-After") is not None
                if not retry or busy >= self.attempts * BUSY_TRIES_PER_ATTEMPT:
                    raise
            time.sleep(next(delays))

    def send(self, path, payload, key):
        request = urllib.request.Request(self.url + path, headers=self.headers)
        if payload is not None:
            request.data = json.dumps(payload).encode()
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Idempotency-Key", key)
        try:
            with (
                tracing.outgoing(request, key) as span,  # tracing on: traceparent sent with it
                urllib.request.urlopen(request, timeout=self.timeout_s) as response,
            ):
                span.set_attribute("http.response.status_code", response.status)
                return json.load(response)
        except urllib.error.HTTPError as error:
            error.provider = self.name  # the receiver answered: main() prints http_error
            raise
        except urllib.error.URLError as error:
            # urllib raises URLError for an OSError while it connects and while it sends the
            # request (AbstractHTTPHandler.do_open, urllib/request.py): only a connection that
            # was never made proves nothing left; a timeout or a reset while sending may not.
            if not isinstance(error.reason, NEVER_CONNECTED):
                raise NoAnswer(
                    f"no answer from {self.label} at {self.url} ({error.reason}); "
                    "the request may or may not have taken effect",
                    EXIT_NO_ANSWER,
                ) from error
            raise Unreachable(
                f"cannot reach {self.label} at {self.url} ({error.reason}); start it, "
                f"or set {self.name}_URL to where it listens",
                EXIT_NO_ANSWER,
            ) from error
        except (OSError, http.client.HTTPException) as error:  # sent, then no answer
            raise NoAnswer(
                f"no answer from {self.label} at {self.url} ({error}); "
                "the request may or may not have taken effect",
                EXIT_NO_ANSWER,
            ) from error


NEVER_CONNECTED = (ConnectionRefusedError, socket.gaierror)  # no connection: nothing was sent
UNRESOLVED_TRIES = 2  # tries of a host name that does not resolve (each lookup can take 1 s)


def refusal(error):
    """api.py's refusals (RECEIVER_ANSWERS.refused): a business 4xx answer's JSON body, its
    409 (a key used for another body) too: the receiver refused the request and made nothing,
    and the key is spent. Else None: a 5xx or no answer (it may have committed), an answer that
    says the request went to the wrong place or was not let in (did_nothing), or one that is not
    JSON (another server)."""
    return RECEIVER_ANSWERS.refused(error)


def did_nothing(error):
    """True for an error that proves the request made nothing and the key is still free, at
    api.py (RECEIVER_ANSWERS.not_sent): the connection was refused (Unreachable), or an
    answer that it reached no route or was not let in (DID_NOTHING: a wrong API_URL, a missing
    credential, a limit: fix it, then resume), or a 503 (its transaction rolled back)."""
    return RECEIVER_ANSWERS.not_sent(error)


DID_NOTHING = {401, 403, 404, 405, 408, 429}


@dataclasses.dataclass(frozen=True)
class HttpAnswers:
    """What an HTTP provider's error answers mean for an effect, declared once per provider
    (Provider.answers); whatever is neither is unknown: it may have been made, or may still be.

    not_sent(error): the only proof nothing was done, so the key is free (released): a refused
    connection (no byte left), or a status in did_nothing (no route, not let in, a limit).
    refused(error): a business no, with the provider's JSON reason ({"status", **body}): made
    nothing, the key is spent, and it is final (failed: the one outcome to compensate for).
    A status in in_progress is never a refusal: the IETF Idempotency-Key draft (draft-ietf-
    httpapi-idempotency-key-header, "Error Scenarios") answers 409 to a retry "while the
    original request is still being processed" and 422 to a key reused with another body.
    A 5xx, a timeout, a reset, Ctrl-C: unknown (Effect.perform)."""

    did_nothing: frozenset = frozenset(DID_NOTHING)
    in_progress: frozenset = frozenset({409})

    def not_sent(self, error):
        answered = isinstance(error, urllib.error.HTTPError) and error.code in self.did_nothing
        return answered or isinstance(error, Unreachable)

    def refused(self, error):
        if not isinstance(error, urllib.error.HTTPError) or error.code in self.in_progress:
            return None
        if error.code in self.did_nothing or not 400 <= error.code < 500:
            return None
        return json_reason(error)


def json_reason(error):
    """{"status", **the JSON object body} of an HTTPError, or None (not JSON: another server)."""
    if not hasattr(error, "reason_json"):  # read once: a second read gets b""
        try:
            body = json.loads(error.read())
        except ValueError:
            body = None
        error.reason_json = {"status": error.code, **body} if isinstance(body, dict) else None
    return error.reason_json


IETF_ANSWERS = HttpAnswers()  # a provider's default: 409 is "in progress", 422 a refusal
RECEIVER_ANSWERS = HttpAnswers(  # api.py's: its 409 is a key used for another body
    did_nothing=frozenset(DID_NOTHING | {503}),  # (TicketStore.keyed), a refusal; its 503 is
    in_progress=frozenset(),  # a transaction rolled back (busy, or a damaged database): nothing
)


def retry_delays():
    """The waits between tries: RETRY_DELAY_S, doubling, at most MAX_RETRY_DELAY_S."""
    delay = RETRY_DELAY_S
    while True:
        yield delay
        delay = min(delay * 2, MAX_RETRY_DELAY_S)


@dataclasses.dataclass(frozen=True)
class Provider:
    """A service your effects change, declared once: its name (its settings are {NAME}_URL,
    {NAME}_TIMEOUT_S, {NAME}_ATTEMPTS, {NAME}_TOKEN), its client class and their defaults."""

    name: str
    url: str
    client_class: type = HttpClient  # its protocol: HTTP unless it says (mail.SmtpClient)
    timeout_s: float = TIMEOUT_S
    attempts: int = ATTEMPTS
    token: str = dataclasses.field(default="", repr=False)  # a secret: never printed
    # What the ledger may assume of it, for every effect sent to it (effects.Effect):
    keyed: bool = False  # it answers a repeated key with the first result (never a second one)
    settle_s: float = SETTLE_S  # it commits what it accepted within this, or never
    answers: HttpAnswers = IETF_ANSWERS  # which errors mean not sent, refused (else unknown)
    label: str = ""  # how a line names it ("the receiver"); its name by default

    def configured(self, environ):
        """This provider with its settings from environ; a bad value: a UserError naming it."""
        name = self.name.upper()
        url = environ.get(f"{name}_URL", self.url)
        return dataclasses.replace(
            self,
            url=checked_url(f"{name}_URL", url, self.client_class.schemes, self.shown_as),
            timeout_s=number(environ, f"{name}_TIMEOUT_S", self.timeout_s, float),
            attempts=number(environ, f"{name}_ATTEMPTS", self.attempts, int),
            token=environ.get(f"{name}_TOKEN", self.token),
        )

    def client(self, headers=None):
        bearer = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers = {**bearer, **(headers or {})}
        client = self.client_class(self.url, self.timeout_s, self.attempts, headers, self.name)
        client.label = self.shown_as
        return client

    @property
    def shown_as(self):
        return self.label or self.name


def checked_url(name, text, schemes=("http", "https"), provider="the receiver"):
    """text, a URL of one of schemes with a host (and a port that is a number); else a
    UserError."""
    try:
        url = urllib.parse.urlsplit(text)
        url.port  # noqa: B018 (ValueError for a port that is not a number in 0-65535)
    except ValueError:
        url = None
    if url is None or url.scheme not in schemes or not url.hostname:
        raise UserError(
            f"{name} {text!r} is not an address of {provider} ({' or '.join(schemes)}); use a "
            f"scheme, a host and a port, like {schemes[0]}://127.0.0.1:8000",
            EXIT_USAGE,
        )
    return text


def number(environ, name, default, kind):
    text = environ.get(name)
    try:
        value = default if text is None else kind(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise UserError(f"{name}={text!r} must be a positive {kind.__name__}", EXIT_USAGE)
    return value
