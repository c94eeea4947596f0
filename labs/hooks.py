"""Lab 18: the webhook that came twice. `hooks`: the workflow's endpoint for the receiver's
webhooks; --mode naive applies every delivery, inbox (the default) each event once (labs/inbox.py).
"""

import hmac
import pathlib
import re
import sqlite3
import threading
import time
import urllib.error

import checkpoints
import effects
import exitcodes
import failpoints
import httpguard
import workflow
from exitcodes import EXIT_USAGE, UserError, command, emit
from failpoints import fail
from labs import inbox
from labs.conditions import say, webhook_faults_missing
from labs.keyless import MESSAGE

# --- lab 18: the webhook that came twice ---------------------------------------------------
# The receiver (labs/receiver.py) tells the workflow about a ticket's progress by webhook, at
# least once. `hooks` is the workflow's endpoint for them, a standard-library HTTP server on
# LISTEN_HOST (default 127.0.0.1; compose sets 0.0.0.0 and the container's address is the one
# given), for as long as the command runs: it subscribes (POST /webhooks, which delivers what is
# pending), moves the ticket if asked (POST /progress), and exits once the receiver has answered.
# --mode naive applies every delivery (but none of a ticket the inbox took: it would set its
# status back); inbox (the default) records it in labs/inbox.py's inbox in the same transaction as
# the ticket's status, ignores an older version, and notifies through the ledger keyed by the
# event id. --crash-at after-inbox kills it after that commit, before its answer to the sender.
# The endpoint is httpguard's server, and takes only webhooks signed with WEBHOOK_SECRET
# (check_signed); what it refuses is a 4xx and one line on stdout.

HOOK_MODES = ("naive", "inbox")
HOOK_POINTS = ("after-inbox",)  # committed, not yet answered: the sender will deliver it again
HOOK_STATUSES = ("opened", "in_progress", "resolved")  # labs/receiver.py's STATUSES
CUSTOMER = "customer@example.com"
HOOKS_TIMEOUT_S = 60.0  # seconds for the receiver's answer to /webhooks and /progress
HOOKS_WAIT_S = 30  # seconds the receiver waits for its delivery round before it answers
HOOK_CONNECTIONS = 32  # deliveries served at once, a thread each; one more gets a quick 503
TIMESTAMP = re.compile(r"[0-9]{1,12}")  # a webhook-timestamp: Unix seconds (10 digits until 2286)
SIGNATURE_TOLERANCE_S = 300  # seconds a webhook's timestamp may be away from our clock (the
#                             spec's example: 5 minutes); an older one is a replay, refused


def take_webhooks(args, settings):
    """Subscribe, move the ticket if asked, take what is delivered; print where the ticket is."""
    if args.mode == "naive" and args.crash_at:
        raise UserError(  # naive commits nothing of its own: the window is the inbox's
            f"--crash-at {args.crash_at} is the inbox's window: drop --mode naive", EXIT_USAGE
        )
    try:
        keys = httpguard.webhook_keys(args.webhook_secret)
    except ValueError as error:
        raise UserError(f"WEBHOOK_SECRET: {error}", EXIT_USAGE) from None
    client = settings.client()
    # The receiver delivers apart from the requests; ?wait=S asks it to answer /webhooks and
    # /progress once the delivery round after them is over (a round tries a silent subscriber
    # 3 times, 2 s each), so what it delivers is taken before this command ends.
    sender = workflow.TicketClient(settings.api_url, HOOKS_TIMEOUT_S, settings.attempts)
    if not checkpoints.is_postgres(settings.checkpoint_db):  # as open_checkpointer checks it
        path = pathlib.Path(settings.checkpoint_db)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
        checkpoints.require_checkpoint_file(path)
    with (
        inbox.open_inbox(settings.checkpoint_db) as box,
        effects.open_ledger(settings.checkpoint_db) as ledger,
    ):
        if args.mode == "naive" and inbox_handles(box, args.ticket):
            raise UserError(
                f"ticket {args.ticket} is the inbox's (a hooks without --mode naive took its "
                "events): naive would apply them again and set its status back; drop --mode "
                "naive, or name another --ticket",
                EXIT_USAGE,
            )
        applier = WebhookApplier(args.mode, box, ledger, client)
        points = {args.crash_at: "kill"} if args.crash_at else {}
        handler = type(
            "Hook", (WebhookEndpointHandler,), {"applier": applier, "points": points, "keys": keys}
        )
        try:
            server = open_endpoint(args.listen_host, handler)
        except OSError as error:
            raise UserError(
                f"cannot listen on LISTEN_HOST {args.listen_host!r} ({error.strerror or error}); "
                "set LISTEN_HOST to an address of this machine",
                EXIT_USAGE,
            ) from None
        serving = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        serving.start()
        delivered, moved = 0, None
        try:
            url = hook_url(args.listen_host, server.server_port)
            delivered += sender.call(f"/webhooks?wait={HOOKS_WAIT_S}", {"url": url})["delivered"]
            if args.move:
                move = {"ticket_id": args.ticket, "statuses": args.move}
                moved = sender.call(f"/progress?wait={HOOKS_WAIT_S}", move)
                delivered += moved["delivered"]
        except KeyboardInterrupt:  # Ctrl-C: what got no 2xx waits at the receiver
            again = f"{command(f'hooks --ticket {args.ticket}')} takes it"
            if args.mode == "naive":  # and applies it, however often it came
                again = "--mode naive applies it again"
            raise UserError(
                f"interrupted; the receiver keeps what got no answer pending: {again}",
                exitcodes.EXIT_INTERRUPTED,
            ) from None
        finally:
            server.shutdown()  # the accepting loop; a client still sending holds only its
            server.server_close()  # own daemon thread, which dies with the process
        with applier.taking:  # a delivery still being applied finishes first
            if applier.stopped is not None:
                raise applier.stopped
            status, version = box.state(str(args.ticket)) or (None, 0)
            taken = set(applier.taken)
            again = command(moved_again(args, status))
            faults_off = webhook_faults_missing(applier.taken, again)  # each came once: not on
        emit("ticket_status", ticket_id=args.ticket, status=status, version=version)
    warnings = []
    if moved is not None and not moved["events"]:
        warnings.append(
            f"ticket {args.ticket} has each status of --move already: no event, no message"
        )
    # One subscriber at a time: what the receiver delivered and this endpoint never took, or
    # the events of --move that went nowhere pending, another endpoint subscribed after it took.
    moved_elsewhere = moved and not moved["pending"] and {e["event_id"] for e in moved["events"]}
    if delivered > len(taken) or (moved_elsewhere and moved_elsewhere - taken):
        warnings.append(
            "the receiver delivered webhooks to another endpoint, subscribed after this one "
            "(another hooks running?): that one took them"
        )
    elif status is None:  # nothing moved it yet, or --ticket names another ticket
        warnings.append(
            f"no webhook for ticket {args.ticket} yet: "
            f"{command(f'hooks --ticket {args.ticket} --move opened,resolved')} moves it "
            f"({command('tickets')} lists the receiver's)"
        )
    for line in warnings or [faults_off]:  # lab 18's faults, when nothing else went wrong
        say(line)


def moved_again(args, status):
    """The hooks that moves the ticket once more (lab 18's faults then double its deliveries):
    this one's --move when a status of it is not the ticket's now (the receiver makes an event
    for each change, none for a status it has), else opened,resolved (a change from any)."""
    move = args.move if args.move and any(s != status for s in args.move) else None
    naive = " --mode naive" if args.mode == "naive" else ""
    return f"hooks{naive} --ticket {args.ticket} --move {','.join(move or ('opened', 'resolved'))}"


def inbox_handles(box, ticket):
    """Whether the inbox took an event of ticket (naive never writes an inbox row)."""
    return box.sql("SELECT 1 FROM inbox WHERE subject = ?", (str(ticket),)).fetchone() is not None


class WebhookApplier:
    """What the endpoint does with one valid event, in one mode: one event at a time."""

    def __init__(self, mode, box, ledger, client):
        self.mode, self.box, self.ledger, self.client = mode, box, ledger, client
        self.stopped = None  # a LedgerError that stopped a notification: the command's exit
        self.taking = threading.Lock()  # deliveries come on threads of their own
        self.taken = []  # the event ids of the deliveries answered 2xx

    def take(self, event):
        """Apply the event (or not); notify the customer of a resolved ticket."""
        ticket, status, version = event["ticket_id"], event["status"], event["version"]
        shown = {"event_id": event["event_id"], "status": status, "version": version}
        if self.mode == "naive":  # every delivery applies, whatever came before it
            if inbox_handles(self.box, ticket):  # an event of a ticket the inbox keeps
                raise httpguard.ClientError(
                    409, f"ticket {ticket} is the inbox's: --mode naive does not take its events"
                )
            with self.box.transaction():  # the same status row as the inbox's, overwritten
                self.box.sql(NAIVE_STATUS_UPSERT, (str(ticket), status, version, event["event_id"]))
            emit("webhook", applied=True, **shown)
            if status == "resolved":
                sent = self.client.call("/messages", resolved_notice(event))
                emit("message_sent", message_id=sent["message_id"])
            return
        seen = self.box.receive(event["event_id"], str(ticket), version, status)
        emit("webhook", applied=seen.applied, duplicate=not seen.first, **shown)
        fail("after-inbox")  # committed: a kill here leaves the sender without its 2xx
        if seen.applied and status == "resolved":  # on a redelivery too: the ledger knows
            key = f"{event['event_id']}:notify"
            done = MESSAGE.perform(self.ledger, key, resolved_notice(event), self.client)
            if done.how == "sent":
                emit("message_sent", key=key, message_id=done.answer["message_id"])
            else:
                emit("effect_receipt", key=key, receipt=done.answer)


NAIVE_STATUS_UPSERT = (  # naive: the ticket's status is what the last delivery said, older or not
    "INSERT INTO inbox_subjects (subject, status, version, event_id) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (subject) DO UPDATE SET status = excluded.status, "
    "version = excluded.version, event_id = excluded.event_id"
)


def resolved_notice(event):
    text = f"ticket {event['ticket_id']} resolved ({event['event_id']})"
    return {"to": CUSTOMER, "text": text}


def hook_url(host, port):
    """The address the receiver posts to: this machine's, as the receiver can reach it."""
    import socket

    if host in ("0.0.0.0", ""):  # every interface (a container): its own address on the network
        host = socket.gethostbyname(socket.gethostname())
    return f"http://{host}:{port}/webhook"


def open_endpoint(host, handler):
    """The endpoint's server, as hardened as the receiver's (httpguard): a thread per
    delivery, at most HOOK_CONNECTIONS, each with REQUEST_TIMEOUT_S for its whole request."""
    return httpguard.GuardedServer(
        (host, 0), handler, httpguard.REQUEST_TIMEOUT_S, HOOK_CONNECTIONS
    )


class WebhookEndpointHandler(httpguard.GuardedHandler):
    """POST /webhook: a signed event (WEBHOOK_SECRET), checked before any of it is trusted,
    then taken. What it refuses is a 4xx with a JSON reason, and one line on stdout."""

    routes = {"/webhook": "POST"}
    log_prefix = "labs hooks"
    unavailable_errors = (sqlite3.Error,)  # the inbox busy: a 503, and the sender retries
    applier = None
    points = {}
    keys = ()  # WEBHOOK_SECRET's HMAC keys: one, or several while one replaces another

    def post(self, path):
        body = self.read_body()  # a Content-Length of at most 4096 bytes, as the receiver's
        check_signed(self.keys, self.headers, body)  # signed, and recently
        event = parse_event(body)
        with self.applier.taking, failpoints.scoped(self.points):
            try:
                self.applier.take(event)
            except inbox.EventConflict as error:
                raise httpguard.ClientError(409, str(error)) from None
            except effects.LedgerError as error:  # the message may be out: a person settles it
                self.applier.stopped = error
                return 503, {"error": str(error)}
            except (UserError, urllib.error.HTTPError) as error:  # the message was not sent
                return 503, {"error": f"the notification failed: {error}; retry"}
            self.applier.taken.append(event["event_id"])
        return 200, {"ok": True}

    def refused(self, error):
        emit("webhook_refused", status=error.status, error=error.message)


def check_signed(keys, headers, body, now=None, tolerance_s=SIGNATURE_TOLERANCE_S):
    """The webhook-id of a body signed with one of keys (bytes: one key), its timestamp within
    tolerance_s of now; ClientError 400 (headers missing or malformed) or 403 (a signature
    that does not match: another secret or a changed body; or a timestamp out of the window:
    a replay of an old delivery) otherwise. Signatures are compared in constant time."""
    message_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp") or ""
    sent = (headers.get("webhook-signature") or "").split()
    if not message_id or not sent or not timestamp:
        raise httpguard.ClientError(
            400, "a webhook is signed: send webhook-id, webhook-timestamp and webhook-signature"
        )
    if not TIMESTAMP.fullmatch(timestamp):  # bounded before int(): 400 digits overflow a float
        raise httpguard.ClientError(400, "webhook-timestamp is Unix seconds: 1 to 12 digits")
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance_s:
        raise httpguard.ClientError(
            403,
            f"webhook-timestamp is {abs(age):.0f} s {'old' if age > 0 else 'ahead'}, over "
            f"{tolerance_s:g} s: a replayed or delayed delivery is refused",
        )
    keys = (keys,) if isinstance(keys, bytes) else keys
    expected = [httpguard.signature(k, message_id, timestamp, body).encode() for k in keys]
    if not any(hmac.compare_digest(e, each.encode()) for e in expected for each in sent):
        raise httpguard.ClientError(
            403, "webhook-signature does not match: another secret, or a changed body"
        )
    return message_id


def parse_event(body):
    """The event in a webhook's body, checked field by field; ClientError(400) says what is
    wrong (httpguard.parse_json_body: not UTF-8, not JSON, nested too deeply)."""
    fields = {"event_id", "ticket_id", "status", "version"}
    event = httpguard.parse_json_body(body, "an event")
    if not isinstance(event, dict) or set(event) != fields:
        raise httpguard.ClientError(
            400, f"the body must be an object with exactly {', '.join(sorted(fields))}"
        )
    event_id = event["event_id"]
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= 200 or not event_id.isprintable():
        raise httpguard.ClientError(400, "event_id must be a string of 1-200 printable characters")
    for field in ("ticket_id", "version"):
        if type(event[field]) is not int or not 1 <= event[field] <= 2**63 - 1:
            raise httpguard.ClientError(400, f"{field} must be a whole number from 1")
    if event["status"] not in HOOK_STATUSES:
        raise httpguard.ClientError(400, f"status must be one of {', '.join(HOOK_STATUSES)}")
    return event


def status_list(text):
    """--move: a comma-separated list of statuses, each one labs/receiver.py knows."""
    import argparse

    moves = text.split(",")
    for move in moves:
        if move not in HOOK_STATUSES:
            raise argparse.ArgumentTypeError(
                f"{move!r} is not a status: each must be one of {', '.join(HOOK_STATUSES)}"
            )
    return moves


def add_hooks_parser(actions):
    sub = actions.add_parser("hooks", help="lab 18: take the receiver's webhooks")
    sub.set_defaults(run=take_webhooks)
    sub.add_argument("--ticket", type=int, default=1, help="the ticket to move and show")
    sub.add_argument(
        "--move", type=status_list, help="statuses to move it through, like opened,resolved"
    )
    sub.add_argument("--mode", choices=HOOK_MODES, default="inbox", help="naive: apply them all")
    sub.add_argument("--crash-at", choices=HOOK_POINTS, help="where the endpoint dies (SIGKILL)")
