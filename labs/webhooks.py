"""Lab 18's provider side of a webhook: the events, where one may go, and their delivery.

The lab's receiver (labs/receiver.py) records a ticket's progress as events (record_progress,
keyed as a ticket is) in its own database (SCHEMA), and one subscriber url (subscribe). A webhook
is a POST of one event's JSON to the subscriber, signed as Standard Webhooks says
(httpguard.signed_headers: webhook-id is the event id), delivered at least once by one sender
thread (Deliveries), apart from the requests: an answer that is not a 2xx (or none, or a
redirect, which is never followed) is retried WEBHOOK_ATTEMPTS times, WEBHOOK_RETRY_S apart; an
event still not delivered then stays pending, and so do the ones after it, until the next round.
One round at a time, in event order. A subscriber that never answers delays only the
deliveries, each attempt at most WEBHOOK_TIMEOUT_S. The queue is the table of pending events;
in memory only counters.

One parser decides where a subscriber's url points (parse_url), and the connection goes there:
a url whose host two parsers could read differently (brackets around anything but an IPv6
address, an IPv6 zone, a character outside a host name's, a ] followed by more than a port) is
refused before it is stored; a listed name is resolved once per delivery and its attempts go to
that address, with the name in the Host header (PinnedConnection); no proxy, no redirect.
"""

import collections
import http.client
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
import urllib.request
from contextlib import suppress
from typing import NamedTuple
from urllib.parse import urlsplit

import httpguard
from api import parse_object
from failpoints import fail
from httpguard import ClientError

WEBHOOK_ATTEMPTS = 3  # tries of one delivery in a round, before it waits for the next round
WEBHOOK_RETRY_S = 0.2  # seconds between them
WEBHOOK_TIMEOUT_S = 2.0  # seconds for one attempt, from the connection to the status line
MAX_WAIT_S = 60  # ?wait=S at most: a request waits for its delivery round no longer
URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")  # RFC 3986's, no other
BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")  # a % not followed by two hex digits
URL_PARTS = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>.*)", re.S
)
HOST_NAME = re.compile(r"[A-Za-z0-9.-]+")  # a host name's letters, digits, - and . (or an IPv4)
PORT_DIGITS = re.compile(r"[0-9]{1,5}")
URL_REQUIREMENT = "must be an http:// or https:// URL with a host, at most 500 characters"
STATUSES = ("opened", "in_progress", "resolved")  # a ticket's progress, as webhooks tell it
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS webhook_events (
    id INTEGER PRIMARY KEY,  -- the event id is evt_ID
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    status TEXT NOT NULL,
    version INTEGER NOT NULL,  -- per ticket: 1, 2, ...
    delivered_at REAL,  -- NULL: pending (no 2xx yet)
    created_at REAL NOT NULL,
    UNIQUE (ticket_id, version)
)""",
    """CREATE TABLE IF NOT EXISTS webhook_subscribers (
    id INTEGER PRIMARY KEY CHECK (id = 1),  -- one subscriber: the workflow
    url TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS progress_requests (
    id INTEGER PRIMARY KEY,  -- one POST /progress
    operation_key TEXT UNIQUE,  -- its Idempotency-Key (NULL: sent without one)
    payload TEXT NOT NULL,  -- canonical JSON of its body
    events TEXT NOT NULL,  -- the events it made, JSON: a repeat is answered with them
    created_at REAL
)""",
)
COLUMNS = {  # SCHEMA's tables: what they hold
    "webhook_events": {"id", "ticket_id", "status", "version", "delivered_at", "created_at"},
    "webhook_subscribers": {"id", "url"},
    "progress_requests": {"id", "operation_key", "payload", "events", "created_at"},
}
KEYED = {"progress_requests": "progress request"}  # SCHEMA's table keyed by an operation key


def record_progress(store, key, canonical, ticket_id, statuses):
    """One event per status that changes the ticket's (a status it has already makes none),
    versions going on from the ticket's last: (the events, created). Keyed as a ticket is
    (api.TicketStore.keyed): a repeat of the key and body makes none and returns the events the
    first request made, kept in its row. store: the lab's (labs/receiver.LabStore)."""
    made = {"events": "[]"}  # the row's events column, filled in before keyed inserts it

    def make_events():  # keyed's check: inside its transaction, before the row is made
        store.require_ticket(ticket_id)
        version, current_status = store.db.execute(
            "SELECT version, status FROM webhook_events WHERE ticket_id = ? "
            "ORDER BY version DESC LIMIT 1",
            (ticket_id,),
        ).fetchone() or (0, None)
        events = []
        for status in statuses:
            if status == current_status:  # no change, no event: the ticket is there already
                continue
            version, current_status = version + 1, status
            event_id = store.db.execute(
                "INSERT INTO webhook_events (ticket_id, status, version, created_at) "
                "VALUES (?, ?, ?, ?)",
                (ticket_id, status, version, time.time()),
            ).lastrowid
            events.append(event_body(event_id, ticket_id, status, version))
        made["events"] = json.dumps(events)

    request_id, created = store.keyed("progress_requests", key, canonical, made, make_events)
    if created:
        return json.loads(made["events"]), True
    with store.locked():
        row = store.db.execute(
            "SELECT events FROM progress_requests WHERE id = ?", (request_id,)
        ).fetchone()
    return json.loads(row[0]), False


def subscribe(store, url):
    """url becomes the one subscriber (it replaces the last)."""
    with store.transaction():
        store.db.execute(
            "INSERT INTO webhook_subscribers (id, url) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET url = excluded.url",
            (url,),
        )


def pending_events(store):
    """(subscriber url or None, the events not delivered yet, oldest first)."""
    with store.locked():
        url = store.db.execute("SELECT url FROM webhook_subscribers").fetchone()
        rows = store.db.execute(
            "SELECT id, ticket_id, status, version FROM webhook_events "
            "WHERE delivered_at IS NULL ORDER BY id"
        ).fetchall()
    return (url and url[0]), [event_body(*row) for row in rows]


def mark_delivered(store, event_id):
    with store.transaction():
        store.db.execute(
            "UPDATE webhook_events SET delivered_at = ? WHERE id = ?",
            (time.time(), int(event_id.removeprefix("evt_"))),
        )


def event_body(event_id, ticket_id, status, version):
    """A webhook's body: what the workflow is told."""
    return {
        "event_id": f"evt_{event_id}",
        "ticket_id": ticket_id,
        "status": status,
        "version": version,
    }


def parse_subscriber(body, allowed):
    """Validate a POST /webhooks body: the url, plain http(s) to a host the allow-list names,
    read by the one parser the deliveries use (allowed_target)."""
    url = parse_object(body, '{"url": "http://HOST:PORT/PATH"}', "url")["url"]
    try:
        allowed_target(url, allowed)
    except ValueError as error:
        raise ClientError(
            400, f"url {error}; nothing stored, the subscriber stays as it was"
        ) from None
    return url


class Target(NamedTuple):
    """Where a url points, as the one parser read it: the connection goes here."""

    scheme: str  # http or https
    host: str  # a name, or an IP address without brackets, lower-case
    port: int
    path: str  # the request target: path and query, "/" for none


def parse_url(url):
    """The Target of a subscriber's url; ValueError with the reason for the client otherwise.
    Only what Python's other URL readers (urlsplit, urllib.request) read the same way passes."""
    match = URL_PARTS.fullmatch(url) if isinstance(url, str) and len(url) <= 500 else None
    if not match or match["scheme"].lower() not in ("http", "https") or not match["authority"]:
        raise ValueError(URL_REQUIREMENT)
    if not URL_CHARACTERS.fullmatch(url) or BAD_ESCAPE.search(url):
        raise ValueError("holds a space, a control or non-ASCII character, or a bad %-escape")
    authority, rest = match["authority"], match["rest"]
    if "@" in authority:
        raise ValueError("names a user (user:password@), which would be sent along: send none")
    if "#" in rest:
        raise ValueError("has a #fragment, which is never sent: leave it out")
    host, port = split_authority(authority)
    if port is not None and not 0 < port < 65536:
        raise ValueError(
            URL_REQUIREMENT if port > 65535 else "has port 0: name the port it listens on"
        )
    if other_readings(url) != {(host, port)}:  # belt and braces: the other readers agree
        raise ValueError("is read differently by Python's URL parsers: write its host plainly")
    scheme = match["scheme"].lower()
    port = (443 if scheme == "https" else 80) if port is None else port
    return Target(scheme, host, port, rest or "/")


def other_readings(url):
    """{(host, port or None)} as urlsplit reads url and as urllib.request hands it to
    http.client (which would connect there); an empty set if one of them refuses it."""

    def plain(name):
        with suppress(ValueError):
            return str(ipaddress.ip_address(name))
        return name.lower()

    try:
        parts = urlsplit(url)
        authority = urllib.request.Request(url).host
        client = http.client.HTTPConnection(authority)  # reads host and port, connects nowhere
        has_port = authority.rpartition(":")[2].isdigit() and not authority.endswith("]")
    except (ValueError, http.client.InvalidURL):
        return set()
    return {
        (plain(parts.hostname or ""), parts.port),
        (plain(client.host), client.port if has_port else None),
    }


def split_authority(authority):
    """(host, port or None) of HOST[:PORT]; ValueError says what is not a plain host."""
    if authority.startswith("["):
        inside, bracket, after = authority[1:].partition("]")
        if not bracket:
            raise ValueError("has a [ without its ]: an IPv6 address is written [ADDRESS]")
        if "%" in inside:
            raise ValueError(
                "names an IPv6 zone (%...): a zone is an interface of one machine, not an "
                "address to call; leave it out"
            )
        try:
            host = str(ipaddress.IPv6Address(inside))
        except ValueError:
            raise ValueError("has brackets around something that is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise ValueError(f"has {after[:20]!r} after the ] of its IPv6 address: only :PORT")
        port = after[1:] if after else None
    else:
        host, colon, port = authority.partition(":")
        port = port if colon else None
        if not HOST_NAME.fullmatch(host):
            raise ValueError(
                f"host {host[:40]!r} holds a character outside a host name's letters, digits, "
                "- and . (an IPv6 address goes in [brackets])"
            )
        host = host.lower()
        with suppress(ValueError):
            host = str(ipaddress.IPv4Address(host))
    if port is not None and not PORT_DIGITS.fullmatch(port):
        raise ValueError(URL_REQUIREMENT)
    return host, None if port is None else int(port)


def allowed_hosts(text):
    """WEBHOOK_ALLOWED_HOSTS: (host names, IP networks); ValueError for an entry of neither."""
    names, networks = set(), []
    for entry in (each.strip() for each in text.split(",")):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", entry):
                raise ValueError(
                    f"{entry!r} is neither a host name, an IP address nor a network"
                ) from None
            names.add(entry.lower())
    return names, networks


def host_allowed(host, allowed):
    """A name on the list, or an IP address inside one of its networks."""
    names, networks = allowed
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host in names  # a name is called as it is listed: no other spelling of it
    return any(address in network for network in networks)


def allowed_target(url, allowed):
    """The Target of a url the receiver may call; ValueError with the reason otherwise."""
    target = parse_url(url)
    if not host_allowed(target.host, allowed):
        raise ValueError(
            f"names host {target.host!r}, which is not in WEBHOOK_ALLOWED_HOSTS (the "
            "receiver calls only the hosts it is told it may)"
        )
    return target


def resolve(target, getaddrinfo=socket.getaddrinfo):
    """The one address a delivery's attempts connect to (a name is not asked again)."""
    family, _, _, _, address = getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)[0]
    return family, address


class PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to an address resolved already; Host (and TLS's server name) stay
    the url's. http.client follows no redirect and asks no proxy."""

    def __init__(self, target, resolved, timeout):
        super().__init__(target.host, target.port, timeout=timeout)
        self.family, self.address = resolved
        self.tls = ssl.create_default_context() if target.scheme == "https" else None
        self.default_port = 443 if self.tls else 80  # Host names the port unless default

    def connect(self):
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.address)
            self.sock = self.tls.wrap_socket(sock, server_hostname=self.host) if self.tls else sock
        except BaseException:
            sock.close()
            raise


def post_event(target, resolved, body, headers, timeout_s=WEBHOOK_TIMEOUT_S):
    """POST body to the target at its resolved address: the answer's status. The whole attempt,
    the connection to the status line, takes at most timeout_s (a subscriber that trickles
    its answer a byte at a time is cut off then)."""
    connection = PinnedConnection(target, resolved, timeout_s)
    deadline = threading.Timer(timeout_s, lambda: shut_down_socket(connection))
    deadline.start()
    try:
        connection.request("POST", target.path, body, headers)
        return connection.getresponse().status
    finally:
        deadline.cancel()
        connection.close()


def shut_down_socket(connection):
    with suppress(OSError, AttributeError):  # no socket yet, or closed already
        connection.sock.shutdown(socket.SHUT_RDWR)


def parse_wait(query):
    """?wait=S: whole seconds from 0 to MAX_WAIT_S (None: not asked); ValueError says the range."""
    values = query.get("wait")
    if values is None:
        return None
    if (
        len(values) != 1
        or not re.fullmatch(r"[0-9]{1,2}", values[0])
        or int(values[0]) > MAX_WAIT_S
    ):
        raise ValueError(f"?wait= is a whole number of seconds from 0 to {MAX_WAIT_S}, once")
    return int(values[0])


class Deliveries:
    """One thread delivers the store's pending events to its subscriber, a round at a time.

    ask() after a commit asks for a round that begins after it; wait(asked, seconds) waits for
    that round to end: {"delivered" since the ask, "pending" after the last round}. A round
    that began before the ask may read the store after it (and deliver what the ask's commit
    made): each delivery is counted by the ask count at its time, not by its round's start."""

    def __init__(self, store, metrics, keys, allowed, log, getaddrinfo=socket.getaddrinfo):
        self.store, self.metrics, self.keys, self.allowed = store, metrics, keys, allowed
        self.log, self.getaddrinfo = log, getaddrinfo  # getaddrinfo: a test's resolver
        self.changed = threading.Condition()
        self.asked = self.done = 0  # rounds asked for; the asked count the last round began at
        self.rounds = collections.deque(maxlen=64)  # (asked when it began, pending after it)
        self.delivered = collections.deque(maxlen=1024)  # the ask count when each was delivered
        threading.Thread(target=self.run, name="webhook deliveries", daemon=True).start()

    def ask(self):
        with self.changed:
            self.asked += 1
            self.changed.notify_all()
            return self.asked

    def wait(self, asked, seconds):
        """What the rounds since asked did, once one that began after it ended (or seconds
        passed: pending then as the store has it now)."""
        with self.changed:
            ended = self.changed.wait_for(lambda: self.done >= asked, seconds)
            delivered = sum(1 for count in self.delivered if count >= asked)
            pending = self.rounds[-1][1] if ended else None
        if pending is None:
            pending = len(pending_events(self.store)[1])
        return {"delivered": delivered, "pending": pending}

    def run(self):
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.asked > self.done)
                began = self.asked
            pending = self.round()
            with self.changed:
                self.done = began
                self.rounds.append((began, pending))
                self.changed.notify_all()

    def round(self):
        """Every pending event to the subscriber, in order (reorder: newest first), each until
        a 2xx or WEBHOOK_ATTEMPTS tries; the first that gets none ends the round (the
        subscriber is down: the rest wait for the next). The events still pending after it."""
        delivered, events = 0, []
        try:
            url, events = pending_events(self.store)
            if fail("reorder") == "on":
                events.reverse()
            for each in events if url else ():
                if not self.deliver(url, each):
                    break
                mark_delivered(self.store, each["event_id"])
                delivered += 1
                with self.changed:
                    self.delivered.append(self.asked)
                if fail("redeliver") == "on":  # a sender that lost track of its 2xx
                    self.deliver(url, each)
            return len(pending_events(self.store)[1])
        except Exception as error:  # the database busy or gone: the events stay pending
            self.log(f"delivery round stopped ({error}); the events stay pending")
            return max(len(events) - delivered, 0)

    def deliver(self, url, each):
        """POST the event to url until a 2xx, at most WEBHOOK_ATTEMPTS times: whether one came.
        A redirect is an answer without a 2xx: never followed (a POST's 302 would become a
        bodiless GET, and its 2xx would mark the event delivered)."""
        body = json.dumps(each).encode()
        try:  # checked again: WEBHOOK_ALLOWED_HOSTS may have changed, an older receiver stored it
            target = allowed_target(url, self.allowed)
            resolved = resolve(target, self.getaddrinfo)  # once: every attempt goes to this address
        except ValueError as error:
            target, why = None, f"not sent (url {error})"
        except OSError as error:  # the name does not resolve (now): this delivery fails
            target, why = None, f"not sent (cannot resolve the url's host: {error})"
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            if target is not None:
                headers = httpguard.signed_headers(self.keys, each["event_id"], body)
                try:
                    status = post_event(
                        target, resolved, body, {"Content-Type": "application/json", **headers}
                    )
                except (OSError, http.client.HTTPException):  # refused, reset, timed out
                    status, why = None, "no answer"
                if status is not None and 200 <= status < 300:
                    self.metrics.add("webhooks_delivered")
                    self.log(f"webhook {each['event_id']} attempt {attempt}: {status}")
                    return True
                if status is not None:
                    why = f"{status}{' (a redirect: not followed)' if 300 <= status < 400 else ''}"
            self.metrics.add("webhooks_failed")
            self.log(f"webhook {each['event_id']} attempt {attempt}: {why}")
            if attempt < WEBHOOK_ATTEMPTS:
                time.sleep(WEBHOOK_RETRY_S)
        self.log(f"webhook {each['event_id']} pending: no 2xx in {WEBHOOK_ATTEMPTS} tries")
        return False
