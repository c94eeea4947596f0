"""The receiver's settings, read from the environment, and the server they open.

open_server reads them (SETTINGS_HELP lists them, as --help shows), opens the store and the
listening socket, and raises ConfigError, one line for stderr and an exit code, for a setting
that cannot work. Standard library only.
"""

import sqlite3
from pathlib import Path

import failpoints
import tracing
from httpguard import MAX_CONNECTIONS, REQUEST_TIMEOUT_S, GuardedServer
from receiverdb import BUSY_TIMEOUT_S, NotTheReceivers
from receivermetrics import Metrics

SETTINGS_HELP = """\
Configuration (environment, read in main()):
    RECEIVER_DB                  data/receiver/receiver.sqlite: missing, empty, or a receiver's
                                 own; a file with other tables (another program's, LangGraph's
                                 checkpoints) is refused before anything is written to it
    HOST                         127.0.0.1 (compose sets 0.0.0.0)
    PORT                         8000
    RECEIVER_BUSY_TIMEOUT_S      2 (seconds to wait for the database before a 503)
    RECEIVER_REQUEST_TIMEOUT_S   5 (seconds a client has to send its whole request)
    RECEIVER_MAX_CONNECTIONS     256 (connections served at once; more get a quick 503)
    RECEIVER_KEY_RETENTION_S     unset: keys are kept for ever. Else seconds a key is honoured
                                 after its ticket was made; an older key is not, pruned yet or
                                 not: a request with it is new. Keys are pruned every
                                 min(retention, 60) seconds. Keep it longer than the longest a
                                 caller may wait before it retries (a crash, an approval).
    FAILPOINTS                   "" (none). Fault points for tests, never for a real service:
                                 after-commit=kill dies between the commit and the answer;
                                 before-commit=pause(PATH) holds a request read and not yet
                                 made (once per key and body: a resend passes).
    TRACE                        "" (off). otlp, or a file: a span per keyed POST, its parent
                                 the caller's traceparent (tracing.py; needs OpenTelemetry)
"""
EXIT_CONFIG, EXIT_CANNOT_LISTEN = 2, 3  # a bad setting / RECEIVER_DB; the port is taken
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT (128 + 2); SIGTERM is a clean 0


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


def open_server(environ, store_class, handler, known):
    """Read the settings, open the store and the listening socket: (server, the line that says
    where it listens, the failpoints set); ConfigError if one fails. known: the failpoints
    this program has."""
    db_path = environ.get("RECEIVER_DB", "data/receiver/receiver.sqlite")
    host = environ.get("HOST", "127.0.0.1")
    port = setting(environ, "PORT", 8000, int, -1, 65536)
    busy_timeout_s = setting(environ, "RECEIVER_BUSY_TIMEOUT_S", BUSY_TIMEOUT_S)
    request_timeout_s = setting(environ, "RECEIVER_REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S)
    max_connections = setting(environ, "RECEIVER_MAX_CONNECTIONS", MAX_CONNECTIONS, int)
    retention_s = setting(environ, "RECEIVER_KEY_RETENTION_S", None)
    spec = environ.get("FAILPOINTS", "")
    try:
        points = failpoints.parse(spec, known)
    except failpoints.FailpointSpecError as error:
        raise ConfigError(str(error)) from None
    try:
        tracing.start(environ.get("TRACE", ""), "receiver")
    except tracing.TracingError as error:
        raise ConfigError(str(error)) from None
    try:
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        metrics = Metrics(handler.counters)
        store = store_class(db_path, busy_timeout_s, retention_s, metrics)
    except (OSError, sqlite3.Error, NotTheReceivers) as error:
        raise ConfigError(f"RECEIVER_DB {db_path!r} cannot be used: {error}") from None
    try:
        server = GuardedServer(
            (host, port), handler, request_timeout_s, max_connections, metrics.answered
        )
    except OSError as error:
        store.close()
        reason = error.strerror or str(error)
        hint = "stop what uses it, or set PORT to a free one" if port else "check HOST"
        raise ConfigError(
            f"cannot listen on {host}:{port} ({reason}); {hint}", EXIT_CANNOT_LISTEN
        ) from None
    server.store, server.metrics = store, metrics
    failpoints.configure(spec, known)
    where = f"listening on {host}:{server.server_port}, tickets in {db_path}"
    return server, where, points
