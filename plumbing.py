"""What workflow.py runs on, the same for any graph: the exit codes and their one-line errors, a
provider's settings and its HTTP client, the checkpointer, reconcile, and the lines that say how
a stopped run goes on. workflow.py (your graph and its effects) imports this file; this file
imports nothing of it.

A provider is a service your effects change, declared once (Provider("API", url=...)); its
settings come from the environment under one rule, NAME being the provider's name:
    {NAME}_URL        its address (a scheme, a host, a port)
    {NAME}_TIMEOUT_S  seconds to wait for one answer (default 5)
    {NAME}_ATTEMPTS   tries of a request that was refused or answered 503 (default 4)
    {NAME}_TOKEN      "" (none); else sent as `Authorization: Bearer TOKEN`, never printed
Every other setting is listed in workflow.py's docstring.
"""

import argparse
import contextlib
import dataclasses
import http.client
import json
import logging
import math
import os
import socket
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import effects
import failpoints
import tracing

TIMEOUT_S = 5.0  # a provider's default; the receiver answers in milliseconds: 5 s means gone
ATTEMPTS = 4  # tries of a request whose connection was refused: 0.25, 0.5, 1 s apart,
RETRY_DELAY_S = 0.25  # enough for a receiver that is starting or restarting
MAX_RETRY_DELAY_S = 2.0  # the delays double up to this
BUSY_TRIES_PER_ATTEMPT = 2  # a 503 (busy) gets twice ATTEMPTS tries: 8, about 26 s. Each one
# costs the receiver's busy timeout (api.py BUSY_TIMEOUT_S, 2 s) before its 503, plus the delay
#   (0.25 s doubling to 2 s): 8 x 2 + 9.75 s. That outlasts a lock another program holds on the
#   receiver's file (a backup, an sqlite3 shell: the review held one 10 s, past the old 9.75 s
#   budget) by more than the lock itself lasted: a load spike can stretch each try. Past it the
#   receiver is down in effect, nothing was committed, and the line names the resume.
EXIT_HTTP_ERROR = 1  # the receiver answered with an error (http_error shows it)
EXIT_USAGE = 2  # a usage or configuration mistake: one line on stderr
EXIT_NO_ANSWER = 3  # the receiver (or a Postgres CHECKPOINT_DB) could not be reached, or a
#                     Postgres CHECKPOINT_DB stopped answering mid-run (a restart)
EXIT_THREAD = 4  # resume or state of an unknown thread, or start of one that exists
EXIT_CHECKPOINT_WRITE = 74  # the SQLite CHECKPOINT_DB cannot be written: read-only, its disk
#                             full, or an open file no longer writable (EX_IOERR); resume once
#                             it can be
EXIT_UNSETTLED = 6  # an effect may have happened and no evidence says not: look, reconcile it
EXIT_LEDGER_DAMAGED = 7  # a ledger row fails its own check (a receipt changed, forged or gone,
#                          effects.Damaged): this code will not use it, and sends nothing for it
EXIT_DRAINED = 75  # stopped cleanly on SIGTERM, checkpoint saved: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_KILLED = 137  # a `kill` failpoint: SIGKILL is signal 9, and a shell reports 128 + 9


class UserError(Exception):
    """A mistake the user can fix: one line on stderr and this exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class Unreachable(UserError):
    """The connection was refused: nothing was sent, so the same request may be tried again."""


class NoAnswer(UserError):
    """The request was sent and no answer came back: it may or may not have taken effect."""


def emit(event, **values):
    """One JSON line, in one write: print() writes the text and its newline apart when output is
    unbuffered, and two processes on one pipe (the drill's child and its resume) could splice."""
    sys.stdout.write(json.dumps({"event": event, **values}, sort_keys=True) + "\n")
    sys.stdout.flush()


def announce(name, action):
    """Say which failpoint fires, before it kills or stops the process."""
    if action == "kill":
        emit("crash", at=name)
    elif action == "term":
        emit("sigterm", at=name)


def thread_config(thread):
    return {"configurable": {"thread_id": thread}}


def require_thread(graph, thread, starting, hint="resume it or pick a new --thread"):
    """start needs a new thread, resume an existing one; the thread's snapshot."""
    snapshot = graph.get_state(thread_config(thread))
    if starting and snapshot.values:
        raise UserError(f"thread {thread!r} already exists; {hint}", EXIT_THREAD)
    if not starting and not snapshot.values:
        raise UserError(f"no thread {thread!r} to resume; check --thread", EXIT_THREAD)
    return snapshot


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


@contextlib.contextmanager
def open_checkpointer(checkpoint_db, saver_class=None):
    """LangGraph's saver for CHECKPOINT_DB, closed on exit: PostgresSaver for a postgresql://
    URL, else SqliteSaver (or saver_class, a SqliteSaver subclass) on that file."""
    if is_postgres(checkpoint_db):
        with open_postgres(checkpoint_db) as saver:
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(checkpoint_db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
    require_checkpoint_file(path)
    with (saver_class or SqliteSaver).from_conn_string(str(path)) as saver:
        yield saver


def require_checkpoint_file(path):
    """Refuse, before SqliteSaver writes a byte (its setup switches the file to WAL and adds its
    tables), a file that holds tables of another program: the receiver's, or anyone's, and a
    table with one of our names whose columns are not ours (`effects` is a common name). The
    file is read on a read-only connection (mode=ro): the check itself writes nothing."""
    if not path.is_file() or path.stat().st_size == 0:
        return  # a new file: SqliteSaver makes it
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        # At least the columns each of our tables was made with: ours may gain more (a
        # migration adds them on open), another program's table of that name lacks some.
        unlike = sorted(
            table
            for table, columns in OUR_COLUMNS.items()
            if table in tables
            and not columns <= {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        )
    finally:
        conn.close()
    foreign = sorted(t for t in tables - set(OUR_COLUMNS) if not t.startswith("sqlite_")) + unlike
    if foreign:
        raise UserError(
            f"CHECKPOINT_DB {str(path)!r} holds tables that are not LangGraph's checkpoints "
            f"({', '.join(foreign)}): another program's database; nothing was written to it. "
            "Point CHECKPOINT_DB at a file of its own",
            EXIT_USAGE,
        )


# The tables that may sit beside the checkpoints, and the columns each has had from the start (a
# subset, not the set). A program that keeps tables of its own there adds them (own_tables).
OUR_COLUMNS = {
    **{table: set() for table in effects.TABLES},  # the ledger's; the ones below, checked
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint", "metadata"},
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"},
    # (SqliteSaver.setup's CREATE TABLEs, langgraph/checkpoint/sqlite/__init__.py)
    "effects": {"key", "effect", "request", "request_hash", "state"},
    "effect_transitions": {"key", "from_state", "to_state"},
    "effect_receipts": {"key", "external_id", "answer", "request_hash"},
}


def own_tables(columns):
    """Count these tables ({name: columns it has had from the start}) as ours too."""
    OUR_COLUMNS.update(columns)


def is_postgres(checkpoint_db):
    return checkpoint_db.startswith(("postgresql://", "postgres://"))


@contextlib.contextmanager
def open_postgres(url):
    """LangGraph's PostgresSaver on one connection, its tables created or migrated."""
    import psycopg  # Postgres users only: commands on SQLite never load it
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    # psycopg logs a lost connection once more as its pipeline closes ("error ignored
    # terminating ..."): main() says it in one line of its own (lost_postgres)
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)

    try:  # the settings PostgresSaver.from_conn_string uses
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as error:  # unreachable (OperationalError), or not a valid URL
        reason = str(error).strip().splitlines()[0]
        code = EXIT_NO_ANSWER if isinstance(error, psycopg.OperationalError) else EXIT_USAGE
        hint = "; CHECKPOINT_DB is set in your environment: unset it for the SQLite default"
        raise UserError(f"cannot open CHECKPOINT_DB ({reason}){hint}", code) from error
    with conn:
        saver = PostgresSaver(conn)
        # setup() creates or migrates the tables; the user must call it (PostgresSaver.setup's
        # docstring). Workers starting together would race on them: one at a time, under an
        # advisory lock. Not a blocking wait for it: setup's CREATE INDEX CONCURRENTLY waits for
        # every open transaction, a waiter's included.
        lock = "SELECT pg_try_advisory_lock(hashtext('langgraph setup')) AS locked"
        while not conn.execute(lock).fetchone()["locked"]:
            time.sleep(0.05)
        saver.setup()
        conn.execute("SELECT pg_advisory_unlock(hashtext('langgraph setup'))")
        yield saver


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
    # What the ledger may assume of it, for every effect sent to it (plumbing.Effect):
    keyed: bool = False  # it answers a repeated key with the first result (never a second one)
    settle_s: float = effects.SETTLE_S  # it commits what it accepted within this, or never
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


@dataclasses.dataclass(frozen=True)
class Effect(effects.Effect):
    """effects.Effect sent to a Provider (the declaration, or its name), whose client performs
    and looks it up. Declared with a Provider, what the effect leaves at its default is the
    provider's: keyed, settle_s, not_sent and refused (its answers)."""

    provider: "Provider | str" = "API"

    def __post_init__(self):
        if not isinstance(self.provider, Provider):
            return
        defaults = {f.name: f.default for f in dataclasses.fields(effects.Effect)}
        given = self.provider
        for name, value in (
            ("keyed", given.keyed),
            ("settle_s", given.settle_s),
            ("not_sent", given.answers.not_sent),
            ("refused", given.answers.refused),
        ):
            if getattr(self, name) is defaults[name]:
                object.__setattr__(self, name, value)


def provider_of(effect):
    """The name of the provider an effect is sent to (an effects.Effect: API's)."""
    provider = getattr(effect, "provider", "API")
    return provider.name if isinstance(provider, Provider) else provider


@dataclasses.dataclass(frozen=True)
class Settings:
    """The environment's settings, checked. providers: the program's, each configured."""

    checkpoint_db: str = "data/workflow/checkpoints.sqlite"
    providers: tuple = ()  # a subclass names its Provider declarations here
    failpoints: str = ""
    trace: str = ""  # TRACE
    lease_s: float = effects.LEASE_S  # LEDGER_LEASE_S: how long a SQLite lease keeps others out
    receipt_key: str = dataclasses.field(default="", repr=False)  # LEDGER_RECEIPT_KEY: a secret
    receipt_unkeyed: str = "refuse"  # LEDGER_RECEIPT_UNKEYED

    @classmethod
    def from_environ(cls, environ):
        """The settings; a bad value is a UserError naming the variable."""
        return cls(
            checkpoint_db=environ.get("CHECKPOINT_DB", cls.checkpoint_db),
            providers=tuple(provider.configured(environ) for provider in cls.providers),
            failpoints=environ.get("FAILPOINTS", ""),
            trace=environ.get("TRACE", ""),
            lease_s=number(environ, "LEDGER_LEASE_S", effects.LEASE_S, float),
            receipt_key=environ.get("LEDGER_RECEIPT_KEY", ""),
            receipt_unkeyed=environ.get("LEDGER_RECEIPT_UNKEYED", cls.receipt_unkeyed),
        )

    def provider(self, name="API"):
        (found,) = [provider for provider in self.providers if provider.name == name]
        return found

    def client(self, headers=None, name="API"):
        return self.provider(name).client(headers)

    def clients(self):
        """{provider name: its client}, for a run's Context."""
        return {provider.name: provider.client() for provider in self.providers}

    api_url = property(lambda self: self.provider().url)  # API's settings, by their old names
    timeout_s = property(lambda self: self.provider().timeout_s)
    attempts = property(lambda self: self.provider().attempts)


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


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        self.exit(
            EXIT_USAGE, f"{self.prog}: {message}{where_it_goes(self, message)} (see --help)\n"
        )


def where_it_goes(parser, message):
    """For "unrecognized arguments": the commands that do take the switch given (a switch of
    `hooks` typed on `start`), or that a split JSON value wants quotes; else ""."""
    words = message.removeprefix("unrecognized arguments: ").split()
    if not message.startswith("unrecognized arguments: "):
        return ""
    if any(w.startswith(("{", "[")) or w.endswith(("}", "]")) for w in words):
        return '; the shell split a JSON value at its spaces: quote it, like \'{"title": "t"}\''
    said = []
    for switch in (w.split("=")[0] for w in words if w.startswith("--")):
        names = [name for name, sub in commands(parser) if switch in sub._option_string_actions]
        shown = names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else [])
        if shown:
            listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
            said.append(f"{switch} is an option of {listed}")
    return f"; {'; '.join(said)}" if said else ""


def commands(parser, prefix=""):
    """(name, parser) of every subcommand under parser, nested ones as "outbox start" (read
    from argparse's own records of them: _subparsers, _option_string_actions)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in getattr(action, "choices", {}).items():
            yield f"{prefix}{name}", sub
            yield from commands(sub, f"{prefix}{name} ")


def reconcile(args, settings):
    """The ledger's open effects: each asked by key where its provider has a lookup, or settled
    as a person says (--confirmed KEY or KEY=ID, --not-sent KEY); then how many are still
    unknown, and any extra effect a provider made under a key (a duplicate to undo). Every
    argument is checked, and every key's lock taken, before anything is written."""
    clients = settings.clients()
    looked_up = {  # each effect's lookup asks its own provider: by its name in the effect
        name: bound(effect, clients[provider_of(effect)]) for name, effect in args.effects.items()
    }
    with (
        open_checkpointer(settings.checkpoint_db),
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
        contextlib.ExitStack() as held,
    ):
        said = settlements(args)
        for key in said:
            require_open(ledger, key)
        if getattr(args, "wait", False):  # --wait: until every named key's settle time is over
            time.sleep(max([settle_left_s(ledger.get(k), looked_up) for k in said], default=0))
        for key in said:  # InFlight while a live process performs it: nothing written yet
            held.enter_context(ledger.performing(key))
        settled = [settle_as_said(ledger, key, *said[key], looked_up) for key in said]
        for key, state, how, answer, external_id in settled:
            ledger.settle(key, how, answer, external_id)
            emit("settled", key=key, state=state)
        if not said:
            for record, now in effects.reconcile(ledger, looked_up, None):
                emit("reconciled", effect=record.effect, key=record.key, now=now, was=record.state)
        unknown, oldest_s = ledger.stuck()
        emit("effects_unknown", count=unknown, oldest_s=round(oldest_s))
        if extras := ledger.extras():  # made and in no receipt: a duplicate to undo
            for key, external_id, how in extras:
                emit("effect_extra", key=key, external_id=external_id, how=how)
            emit("effects_extra", count=len(extras))


def settlements(args):
    """{key: (what the person said, the id they gave or None)}; a key named twice: UserError."""
    said = {}
    for word, given in (("confirmed", args.confirmed), ("not-sent", args.not_sent)):
        for text in given:
            key, _, external_id = text.rpartition("=") if "=" in text else (text, "", "")
            if key in said:
                raise UserError(
                    f"{key!r} is named twice (--{said[key][0]} and --{word}); say once what "
                    "happened to it. Nothing was settled",
                    EXIT_THREAD,
                )
            if word == "not-sent" and external_id:
                raise UserError(
                    f"--not-sent takes a key, not KEY=ID ({text!r}). Nothing was settled",
                    EXIT_USAGE,
                )
            said[key] = (word, external_id or None)
    return said


def bound(effect, client):
    """The effect with its lookup bound to its provider's client (it ignores the one given)."""
    if effect.lookup is None:
        return effect
    return dataclasses.replace(effect, lookup=lambda _, key: effect.lookup(client, key))


def settle_as_said(ledger, key, word, external_id, looked_up):
    """(key, state, how, answer, external_id) to write for one key, checked against what the
    provider holds where it can be asked; UserError (nothing written) where it disagrees."""
    record = ledger.get(key)  # under its lock now
    require_open(ledger, key)
    effect = looked_up.get(record.effect)
    look = "" if effect is None else f" (look with {effect.look_with.format(key=key)})"
    found = None if effect is None or effect.lookup is None else effect.lookup(None, key)
    nothing = ". Nothing was settled"
    if word == "not-sent" and found is not None:
        held = effect.external_id(found)
        raise UserError(
            f"the provider holds {held} under {key!r}: it was sent; reconcile --confirmed "
            f"{key} records it{look}{nothing}",
            EXIT_THREAD,
        )
    if word == "not-sent":  # a person's word: taken once the provider's settle time is over
        require_settled(record, effect, look + nothing)
        return key, "released", "a person: reconcile --not-sent", None, None
    how = "a person: reconcile --confirmed"
    if found is not None:
        if external_id is not None and external_id != str(effect.external_id(found)):
            raise UserError(
                f"the provider holds {effect.external_id(found)} under {key!r}, not "
                f"{external_id}{look}{nothing}",
                EXIT_THREAD,
            )
        return key, "confirmed", f"{how}, looked up", found, effect.external_id(found)
    if effect is not None and effect.lookup is not None:
        raise UserError(
            f"the provider holds nothing under {key!r}: not confirmed{look}; if it never went "
            f"out, --not-sent {key}{nothing}",
            EXIT_THREAD,
        )
    if effect is None or effect.answer_of is None:
        raise UserError(
            f"effect {record.effect!r} of {key!r} is not one this program can record a person's "
            f"answer for; --not-sent {key} if it never went out{nothing}",
            EXIT_THREAD,
        )
    if external_id is None:
        raise UserError(
            f"--confirmed {key} needs the id the provider gave it: --confirmed {key}=ID{look}"
            f"{nothing}",
            EXIT_USAGE,
        )
    try:
        answer = effect.answer_of(external_id)
    except (ValueError, TypeError):
        raise UserError(
            f"{external_id!r} is not an id of {effect.name}{look}{nothing}", EXIT_USAGE
        ) from None
    require_settled(record, effect, look + nothing)  # a person's word, as for --not-sent
    return key, "confirmed", how, answer, effect.external_id(answer)


def settle_left_s(record, looked_up):
    """Seconds until a person's word on record is taken (0: now)."""
    effect = looked_up.get(record.effect)
    settle_s = effects.SETTLE_S if effect is None else effect.settled_after_s
    return max(0.0, settle_s - record.since_sent_s)


def require_settled(record, effect, then):
    """A person's word is taken once the provider's settle time has passed since the last send:
    before it the request may still be at the provider (a client killed or timed out while the
    provider held it) and commit after the person looked. Else a UserError: when to try again."""
    settle_s = effects.SETTLE_S if effect is None else effect.settled_after_s
    if (left_s := settle_left_s(record, {record.effect: effect} if effect else {})) > 0:
        at = time.strftime("%H:%M:%S", time.gmtime(time.time() + left_s))
        raise UserError(
            f"{record.key!r} was last sent {record.since_sent_s:.0f} s ago and "
            f"{effects.where(effect, 'its provider')} may take {settle_s:g} s to commit what it "
            f"accepted: what a person sees now can still change; try again in "
            f"{math.ceil(left_s)} s (at {at} UTC), or add --wait{then}",
            EXIT_THREAD,
        )


def require_open(ledger, key):
    """Only an effect that may be out there is a person's to settle."""
    if not (record := ledger.get(key)) or record.state not in effects.OPEN:
        state = record.state if record else "no such key"
        raise UserError(
            f"effect {key!r} is not open ({state}); reconcile lists the open ones. Nothing was "
            "settled",
            EXIT_THREAD,
        )


UNWRITABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL}  # SQLite's primary result codes
# and the extended ones of an open file that can no longer be written: made immutable (chattr +i
# gives SQLITE_IOERR_WRITE at the commit, seen with SQLite 3.40), or a disk that fails its writes
UNWRITABLE_IO = {
    sqlite3.SQLITE_IOERR_WRITE,
    sqlite3.SQLITE_IOERR_FSYNC,
    sqlite3.SQLITE_IOERR_DIR_FSYNC,
    sqlite3.SQLITE_IOERR_TRUNCATE,
}


def unwritable(error):
    """True for a SQLite error that says the file cannot be written (not: cannot be read)."""
    code = getattr(error, "sqlite_errorcode", 0)
    return (code & 0xFF) in UNWRITABLE or code in UNWRITABLE_IO


def lost_postgres(error):
    """True for psycopg's OperationalError (a connection lost, a server restarting), without
    importing psycopg: commands on SQLite never load it."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(error, psycopg.OperationalError)


def ledger_exit(error):
    """The exit code of an effects.LedgerError."""
    if isinstance(error, effects.Unsettled):
        return EXIT_UNSETTLED
    if isinstance(error, effects.InFlight):  # another live process: as a thread it runs
        return EXIT_THREAD
    if isinstance(error, effects.Damaged):
        return EXIT_LEDGER_DAMAGED
    if isinstance(error, effects.NotText):
        return EXIT_USAGE
    return EXIT_HTTP_ERROR


def run_action(args, make_settings, points):
    """Run the parsed command: its settings (make_settings()), failpoints (the names in
    points), tracing, then args.run(args, settings). Every error a user can meet is one line on
    stderr and its exit code, never a traceback."""
    args.thread_defaulted = isinstance(getattr(args, "thread", None), Defaulted)
    if args.thread_defaulted:
        args.thread = str(args.thread)  # a plain str for the savers' drivers
    settings = Settings()
    try:
        settings = make_settings()
        try:
            failpoints.configure(settings.failpoints, known=points, announce=announce)
            tracing.start(settings.trace, "workflow")
        except (failpoints.FailpointSpecError, tracing.TracingError) as error:
            raise UserError(str(error), EXIT_USAGE) from None
        key_receipts(settings)
        require_text(args)
        return args.run(args, settings) or 0
    except urllib.error.HTTPError as error:  # a provider answered with an error
        return said_http_error(args, settings, error)
    except effects.LedgerError as error:
        print(f"{args.prog}: {error}", file=sys.stderr)
        return ledger_exit(error)
    except UserError as error:
        unreachable = isinstance(error, Unreachable)
        hint = resume_hint(args, settings, "once the receiver answers") if unreachable else ""
        print(f"{args.prog}: {error}{default_thread(args, error)}{hint}", file=sys.stderr)
        return error.exit_code
    except sqlite3.DatabaseError as error:  # not a database, read-only, a locked file, ...
        return said_database_error(args, settings, error)
    except ModuleNotFoundError as error:  # a Python without requirements.txt's packages
        print(
            f"{args.prog}: {sys.executable} has no {error.name}; use the Python that has the "
            "requirements installed (natively .venv/bin/python) or Docker",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted{interrupted_hint(args, settings)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if not lost_postgres(error):
            raise
        return said_lost_postgres(args, settings, error)


def run_script(main, name):
    """`python NAME ...`: main()'s exit code; a Ctrl-C before main() took over (while it parsed
    the arguments) is one line and exit 130 too. (The script's own first lines catch one while
    Python imports it.)"""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # main() has its own line for Ctrl-C
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        end_if_stranded(code)
    sys.exit(code)


def end_if_stranded(code):
    """After a Ctrl-C: end the process at once, with code, if a thread is left that nothing
    will stop. A KeyboardInterrupt that lands in ThreadPoolExecutor._adjust_thread_count
    (concurrent/futures/thread.py) between a worker's start() and its entry in _threads_queues
    leaves that worker waiting for work forever, and the interpreter's exit joins it forever.
    LangGraph runs a graph's tasks and saves on such an executor (BackgroundExecutor in
    langgraph/pregel/_executor.py submits to langchain_core's ContextThreadPoolExecutor,
    langchain_core/runnables/config.py). Else it returns: a normal exit."""
    import threading

    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def key_receipts(settings):
    """LEDGER_RECEIPT_KEY and LEDGER_RECEIPT_UNKEYED for this process's ledger (effects.py)."""
    try:
        effects.key_receipts(settings.receipt_key, settings.receipt_unkeyed)
    except ValueError as error:
        raise UserError(str(error), EXIT_USAGE) from None


def require_text(args):
    """Refuse an argument that is not UTF-8 text (`--title $'bad\\xff'`): Python holds its bytes
    as lone surrogates, which no JSON, hash or database here can take. Before anything runs."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode()
            except UnicodeEncodeError:
                shown = text.encode("utf-8", "surrogateescape")
                raise UserError(
                    f"--{name.replace('_', '-')} {shown!r} is not UTF-8 text; nothing was run",
                    EXIT_USAGE,
                ) from None


def resume_hint(args, settings, when):
    """A run that stopped before its effect was saved (no receiver, a receiver busy past every
    try, a checkpoint that could not be written) has saved its thread already (prepare ran):
    typed again, start would say the thread exists. Name the command that goes on from it."""
    if not args.graph_command or not saved(args, settings):
        return ""  # not a run, no checkpoint, or none that can be read
    return f"; the run is saved: {when}, {args.resume} --thread {args.thread}"


class Defaulted(str):
    """A --thread the user did not type: its default, which an error line then says it is."""


def default_thread(args, error):
    """ " (no --thread given: 'demo' is its default)", for a line that finds no such thread: a
    name the user never typed. (One that exists, they made with that default.)"""
    if args.thread_defaulted and str(error).startswith(f"no thread {args.thread!r}"):
        return f" (no --thread given: {args.thread!r} is its default)"
    return ""


def saved(args, settings):
    """The thread's saved values ({} when it has no checkpoint); None when that cannot be told."""
    try:
        with open_checkpointer(settings.checkpoint_db) as saver:
            found = saver.get_tuple(thread_config(args.thread))
    except Exception:  # noqa: BLE001 (a second failure must not hide the first)
        return None
    return found.checkpoint["channel_values"] if found else {}


def interrupted_hint(args, settings, unknown_when=None):
    """What is true after Ctrl-C: a graph command may have sent its request; was it saved?
    unknown_when: what to say when that cannot be told (a lost CHECKPOINT_DB)."""
    if not args.graph_command:
        return ""
    hint = "; a request in flight may have taken effect"
    found = saved(args, settings)
    if found is None:
        if unknown_when:
            return f"{hint}; {unknown_when}, {args.resume} --thread {args.thread}"
        return hint
    if found:
        return f"{hint}; {goes_on(args, found)}"
    return f"{hint}; thread {args.thread!r} has no checkpoint yet: start it again"


def goes_on(args, values):
    """The command that goes on from a checkpoint whose request may have taken effect, or, for
    a run that sends it without a key (args.unkeyed), why none does so safely."""
    if args.unkeyed(values):  # a resume sends it again, and nothing tells it from a new one
        return f"it sends no key, so {args.resume} would send it again: look at the receiver first"
    return f"resume it with: {args.resume} --thread {args.thread}"


def said_http_error(args, settings, error):
    """main()'s lines for a provider's error answer (exit 1): http_error with its body; one
    line more for an answer that is not the receiver's JSON (another server), one that made
    nothing (DID_NOTHING: the key is still free), and a 503 past every try."""
    body = error.read()
    try:
        body = json.loads(body)
    except ValueError:
        body = body.decode("utf-8", "replace")
    emit("http_error", status=error.code, body=body)
    name = getattr(error, "provider", "API")  # which provider answered: NAME_URL is its
    provider = settings.provider(name)
    url = provider.url
    if provider.answers is not RECEIVER_ANSWERS:  # someone else's service: its own words
        nothing = "; nothing was made, and the key is still free" * provider.answers.not_sent(error)
        hint = resume_hint(args, settings, f"once {provider.shown_as} takes it")
        print(
            f"{args.prog}: {provider.shown_as} at {name}_URL {url} answered {error.code}"
            f"{nothing}{hint}",
            file=sys.stderr,
        )
    elif not isinstance(body, dict):  # the receiver answers every error in JSON: another server
        hint = resume_hint(args, settings, f"once {name}_URL names the receiver")
        print(
            f"{args.prog}: the server at {url} answered {error.code} without the "
            f"receiver's JSON: {name}_URL (its port) names another program{hint}",
            file=sys.stderr,
        )
    elif error.code in DID_NOTHING:  # the receiver's JSON, and nothing made
        why = f"the receiver at {name}_URL {url} answered {error.code}"
        when = f"once {name}_URL names the receiver and lets you in"
        hint = resume_hint(args, settings, when)
        print(
            f"{args.prog}: {why}: nothing was made, and the key is still free; check "
            f"{name}_URL (its host, port and path) and its credentials{hint}",
            file=sys.stderr,
        )
    elif error.code == 503:  # busy past every try: rolled back each time: nothing committed
        tries = settings.provider(name).attempts * BUSY_TRIES_PER_ATTEMPT
        why = f"the receiver stayed busy (503) for {tries} tries; nothing was committed"
        hint = resume_hint(args, settings, "once the receiver can write")
        print(f"{args.prog}: {why}{hint}", file=sys.stderr)
    return EXIT_HTTP_ERROR


def said_database_error(args, settings, error):
    """main()'s line for a SQLite error: exit 74 for a file that cannot be written (with the
    resume, once it can be), else exit 2 (not a database, a locked file, ...)."""
    where = f"{args.prog}: CHECKPOINT_DB {settings.checkpoint_db!r}: {error}"
    if not unwritable(error):
        print(where, file=sys.stderr)
        return EXIT_USAGE
    hint = ""
    if args.graph_command and (found := saved(args, settings)) is not None:
        hint = "; its request may have taken effect before the save failed"
        hint += f"; once CHECKPOINT_DB can be written, {goes_on(args, found)}" if found else ""
    print(f"{where}{hint}", file=sys.stderr)
    return EXIT_CHECKPOINT_WRITE


def said_lost_postgres(args, settings, error):
    """main()'s line for a Postgres CHECKPOINT_DB that stopped answering (exit 3)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    hint = interrupted_hint(args, settings, "once CHECKPOINT_DB answers")
    print(
        f"{args.prog}: CHECKPOINT_DB stopped answering ({reason}); what it committed "
        f"stays (the checkpoints, the ledger's rows){hint}",
        file=sys.stderr,
    )
    return EXIT_NO_ANSWER
