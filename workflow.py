"""A two-node LangGraph workflow that opens a ticket in another service, exactly once.

    START -> prepare -> create_ticket -> END

The crash window: create_ticket asks the receiver (api.py) for a ticket. The receiver
commits the ticket and then answers; LangGraph saves the node's result only after the node
has returned. A process that dies in between (a kill, an out-of-memory, a deploy) leaves a
ticket that the checkpoint knows nothing about, and the resumed run starts create_ticket
again from its first line, so the request goes out again. What stops that second request
from becoming a second ticket is its key: prepare derives the key from the run's input, so
every attempt sends the same Idempotency-Key and the receiver answers a repeat with the
ticket it already made. When no answer comes back at all, the node cannot tell whether the
ticket was made: it looks the key up and adopts what it finds, or sends again with the key.

The checkpointer (SqliteSaver, durability "sync") writes the state after each node before
the next one starts, so a resumed run repeats only the node whose result was not saved.

SIGTERM (a deploy, `docker compose stop`) does not kill a run: it asks LangGraph to drain.
The node in flight finishes, its result is saved, and the run stops at the next step
boundary with the event `drained` and exit 75 (EX_TEMPFAIL): `resume` carries on from there.
A SIGKILL (a stop whose grace period ran out, an out-of-memory kill) cannot be handled: then
the key is what keeps the resumed run from making a second ticket.

Output is one JSON object per line, keys sorted. Exit codes: see EXIT_* below.

Configuration (environment, read in main()):
    API_URL          http://127.0.0.1:8000 (compose sets http://api:8000)
    CHECKPOINT_DB    data/workflow/checkpoints.sqlite, or a postgresql:// URL (lab 10)
    API_TIMEOUT_S    5 (seconds to wait for one answer from the receiver)
    API_ATTEMPTS     4 (tries of a request that was refused or answered 503)
"""
# lab-only: begin
# The lab's switches (each line marked lab-only; `make starter` drops them all):
#     --mode naive      no key: every attempt is a new ticket
#     --mode safe       the key from the run's input (the default, and the starter's only way)
#     --mode node-uuid  a fresh key minted inside the node: looks keyed, still duplicates
#     --crash-at POINT  SIGKILL at a named boundary (labs 04-06; see CRASH_POINTS)
#     --durability      LangGraph's durability mode: sync (default), async, exit (lab 04)
#     --crash-at step-boundary  SIGKILL after create_ticket returned, before its result is
#                       saved (lab 08)
#     --term-at POINT   SIGTERM at a named boundary, as a deploy sends it (lab 09)
#     --approval [in-node|own-node], approve [--reject]  wait for a human after the ticket,
#                       inside the effect node or in a node of its own (lab 07)
# lab-only: end

import argparse
import contextlib
import http.client
import json
import os
import signal
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid  # lab-only
from pathlib import Path
from typing import NotRequired, TypedDict

API_TIMEOUT_S = 5.0  # seconds; the receiver answers in milliseconds, so 5 s means it is gone
API_ATTEMPTS = 4  # tries of a request refused or answered 503: 0.25, 0.5, 1 s apart, enough
RETRY_DELAY_S = 0.25  # for a receiver that is starting, restarting or briefly busy
EXIT_HTTP_ERROR = 1  # the receiver answered with an error (http_error shows it)
EXIT_USAGE = 2  # a usage or configuration mistake: one line on stderr
EXIT_NO_ANSWER = 3  # the receiver could not be reached, or hung up without an answer
EXIT_THREAD = 4  # resume or state of an unknown thread, or start of one that exists
EXIT_DRAINED = 75  # stopped cleanly on SIGTERM, checkpoint saved: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class State(TypedDict):
    operation_id: str
    title: str
    key: NotRequired[str]
    ticket_id: NotRequired[int]
    mode: NotRequired[str]  # lab-only
    approval: NotRequired[str]  # lab-only
    approved: NotRequired[bool]  # lab-only


def build_graph(
    checkpointer,
    client,
    crash_at=None,  # lab-only
    term_at=None,  # lab-only
    approval=None,  # lab-only
):
    """The compiled graph: prepare derives the key, create_ticket sends it with the request."""
    from langgraph.graph import END, START, StateGraph  # slow import: only graph commands pay

    def prepare(state: State):
        emit("prepare", operation=state["operation_id"])
        crash("after-prepare", crash_at)  # lab-only
        deploy("after-prepare", term_at)  # lab-only
        # The key names the business operation, not the attempt: it comes from the run's
        # input, so every retry and every resume of this run derives the same key.
        return {"key": state["operation_id"]}

    def create_ticket(state: State):
        key = state["key"]
        key = lab_key(state, key)  # lab-only: --mode naive sends none, node-uuid a new one
        crash("before-request", crash_at)  # lab-only
        try:
            result = client.create(state["title"], key)
        except NoAnswer as error:
            # Sent, and no answer: committed or not, nobody here can tell. (A refused
            # connection or a 503 is not NoAnswer: nothing was committed, and the client
            # has already tried again, a bounded number of times.)
            emit("effect_unknown", error=str(error.__cause__ or error))
            if state["mode"] != "safe":  # lab-only: no key kept across attempts to look up
                raise  # lab-only
            result = reconcile(client, state["title"], key)
        emit("effect_ack", created=result["created"], ticket_id=result["ticket_id"])
        # The receiver has committed the ticket and this node has not returned, so its
        # result is not saved yet: a process that dies here is the crash window.
        crash("after-ack", crash_at)  # lab-only
        deploy("after-ack", term_at)  # lab-only
        # lab-only: begin
        if approval == "in-node":  # lab 07's trap: the node waits for a human after its effect
            return {"ticket_id": result["ticket_id"], "approved": ask_approval(result)}
        # lab-only: end
        return {"ticket_id": result["ticket_id"]}

    builder = StateGraph(State)
    builder.add_node("prepare", prepare)
    builder.add_node("create_ticket", create_ticket)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "create_ticket")
    # lab-only: begin
    if approval == "own-node":  # the better shape: the effect's node has returned before the wait
        builder.add_node("approval", approval_node)
        builder.add_edge("create_ticket", "approval")
        builder.add_edge("approval", END)
        return builder.compile(checkpointer=checkpointer)
    # lab-only: end
    builder.add_edge("create_ticket", END)
    return builder.compile(checkpointer=checkpointer)


def reconcile(client, title, key):
    """Settle an unknown outcome: adopt the ticket the key already made, or send again."""
    found = client.tickets(key)
    emit("reconcile", found=[t["ticket_id"] for t in found], key=key)
    for ticket in found:
        if ticket["payload"] == {"title": title}:  # this very request: adopt it
            return {"ticket_id": ticket["ticket_id"], "created": False}
    # Nothing, or the key made something else: send again with the same key and let the
    # receiver decide (create it, or refuse a reused key with 409).
    return client.create(title, key)


# --- the CLI: one function per action ------------------------------------------------------


def run_graph(args, first_input):
    """Start a run (first_input) or resume one (None). Returns the exit code.

    SIGTERM asks LangGraph to drain (RunControl.request_drain): the node in flight finishes,
    its result is saved, and the run stops at the next step boundary with GraphDrained.
    """
    from langgraph.errors import GraphDrained
    from langgraph.runtime import RunControl

    config = {"configurable": {"thread_id": args.thread}}
    client = TicketClient(args.api_url, args.timeout_s, args.attempts)
    client = lab_client(client, args)  # lab-only: --crash-at lost-ack
    with open_graph(args) as saver:
        approval = (first_input or {}).get("approval") or thread_approval(saver, config)  # lab-only
        graph = build_graph(
            saver,
            client,
            args.crash_at,  # lab-only
            args.term_at,  # lab-only
            approval,  # lab-only
        )
        snapshot = graph.get_state(config)
        exists = bool(snapshot.values)
        if first_input is not None and exists:
            hint = "resume it or pick a new --thread"
            hint += "; or reset the lab: docker compose down -v (natively: rm -r data)"  # lab-only
            raise UserError(f"thread {args.thread!r} already exists; {hint}", EXIT_THREAD)
        if first_input is None and not exists:
            raise UserError(f"no thread {args.thread!r} to resume; check --thread", EXIT_THREAD)
        check_approval(args, snapshot)  # lab-only
        graph_input = first_input
        graph_input = approval_answer(args, graph_input)  # lab-only: approve resumes with it
        durability = "sync"  # each node's result is on disk before the next node starts
        durability = args.durability  # lab-only
        control = RunControl()
        # Only the main thread receives signals (and may set a handler): an in-process caller
        # on another thread runs without one.
        main_thread = threading.current_thread() is threading.main_thread()
        if main_thread:
            previous = signal.signal(signal.SIGTERM, lambda *_: control.request_drain("SIGTERM"))
        try:
            final = graph.invoke(graph_input, config, durability=durability, control=control)
        except GraphDrained as drained:  # a clean stop, not a failure: say so, and where
            emit("drained", reason=drained.reason, next=list(graph.get_state(config).next))
            return EXIT_DRAINED
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
        crash("after-checkpoint", args.crash_at)  # lab-only
        # lab-only: begin
        if "__interrupt__" in final:  # the run waits for a human: `approve` answers it
            emit("awaiting_approval", **final["__interrupt__"][0].value)
            return 0
        # lab-only: end
        emit("done", **final)
        return 0


def start(args):
    first_input = {"operation_id": args.operation, "title": args.title}
    first_input["mode"] = args.mode  # lab-only
    if args.approval:  # lab-only
        first_input["approval"] = args.approval  # lab-only
    return run_graph(args, first_input)


def resume(args):
    return run_graph(args, None)


def state(args):
    config = {"configurable": {"thread_id": args.thread}}
    with open_graph(args) as saver:
        client = TicketClient(args.api_url, args.timeout_s, args.attempts)
        graph = build_graph(
            saver,
            client,
            approval=thread_approval(saver, config),  # lab-only: the graph it was started with
        )
        snapshot = graph.get_state(config)
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def tickets(args):
    client = TicketClient(args.api_url, args.timeout_s, args.attempts)
    emit("tickets", tickets=client.tickets(args.operation))


def post(args):
    result = TicketClient(args.api_url, args.timeout_s, args.attempts).create(
        args.title, args.operation
    )
    emit("post", created=result["created"], ticket_id=result["ticket_id"])


# --- helpers -------------------------------------------------------------------------------


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
    print(json.dumps({"event": event, **values}, sort_keys=True), flush=True)


class TicketClient:
    """The HTTP client for api.py. Plain urllib: commands that use only this load fast."""

    def __init__(self, api_url, timeout_s=API_TIMEOUT_S, attempts=API_ATTEMPTS):
        self.api_url, self.timeout_s, self.attempts = api_url.rstrip("/"), timeout_s, attempts

    def call(self, path, payload=None, key=None, headers=()):
        """One request, tried again after a refused connection or a 503: neither committed."""
        delay = RETRY_DELAY_S
        for attempt in range(1, self.attempts + 1):
            try:
                return self.send(path, payload, key, headers)
            except Unreachable:
                if attempt == self.attempts:
                    raise
            except urllib.error.HTTPError as error:  # 503: busy, the transaction rolled back
                if attempt == self.attempts or error.code != 503:
                    raise
            time.sleep(delay)
            delay *= 2

    def send(self, path, payload, key, headers):
        request = urllib.request.Request(self.api_url + path, headers=dict(headers))
        if payload is not None:
            request.data = json.dumps(payload).encode()
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError:
            raise  # the receiver answered: main() prints http_error
        except urllib.error.URLError as error:  # could not connect: nothing was sent
            raise Unreachable(
                f"cannot reach the receiver at {self.api_url} ({error.reason}); start it "
                "(docker compose up -d --build api, or natively: python api.py &), "
                "or set API_URL to where it listens",
                EXIT_NO_ANSWER,
            ) from error
        except (OSError, http.client.HTTPException) as error:  # sent, then no answer
            raise NoAnswer(
                f"no answer from the receiver at {self.api_url} ({error}); "
                "the request may or may not have taken effect",
                EXIT_NO_ANSWER,
            ) from error

    def create(self, title, key=None):
        return self.call("/tickets", {"title": title}, key, self.headers())

    def headers(self):
        return {}

    def tickets(self, key=None):
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return self.call("/tickets" + query)["tickets"]


@contextlib.contextmanager
def open_graph(args):
    """The checkpointer for CHECKPOINT_DB, as a context manager that closes its connection:
    PostgresSaver for a postgresql:// URL (several workers share it: lab 10), else SqliteSaver."""
    if args.checkpoint_db.startswith(("postgresql://", "postgres://")):
        with open_postgres(args.checkpoint_db) as saver:
            yield saver
        return
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        raise UserError(
            f"{sys.executable} has no langgraph; use the lab's Python (.venv/bin/python "
            "workflow.py, after `make .venv/.installed`) or Docker",
            EXIT_USAGE,
        ) from None
    path = Path(args.checkpoint_db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"CHECKPOINT_DB {str(path)!r}: {error.strerror}", EXIT_USAGE) from None
    saver_class = SqliteSaver
    if getattr(args, "crash_at", None) == "step-boundary":  # lab-only
        saver_class = step_boundary_saver(SqliteSaver)  # lab-only
    with saver_class.from_conn_string(str(path)) as saver:
        yield saver


@contextlib.contextmanager
def open_postgres(url):
    """LangGraph's PostgresSaver on one connection, its tables created or migrated."""
    import psycopg  # Postgres users only: commands on SQLite never load it
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    try:  # the settings PostgresSaver.from_conn_string uses
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as error:  # unreachable (OperationalError), or not a valid URL
        reason = str(error).strip().splitlines()[0]
        code = EXIT_NO_ANSWER if isinstance(error, psycopg.OperationalError) else EXIT_USAGE
        raise UserError(f"cannot open CHECKPOINT_DB ({reason})", code) from error
    with conn:
        saver = PostgresSaver(conn)
        # setup() creates or migrates the tables and is idempotent, but workers starting together
        # would race on them: one at a time, under an advisory lock. Not a blocking wait for it:
        # setup's CREATE INDEX CONCURRENTLY waits for every open transaction, a waiter included.
        lock = "SELECT pg_try_advisory_lock(hashtext('langgraph setup')) AS locked"
        while not conn.execute(lock).fetchone()["locked"]:
            time.sleep(0.05)
        saver.setup()
        conn.execute("SELECT pg_advisory_unlock(hashtext('langgraph setup'))")
        yield saver


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def build_parser():
    parser = Parser(prog="workflow.py", description=__doc__.split("\n")[0])
    actions = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    thread = dict(default="demo", help="checkpoint thread id (default: demo)")
    operation = dict(default="case-001:open-ticket:v1", help="operation id, used as the key")
    title = dict(default="Check supplier configuration", help="ticket title")
    for name, run in [("start", start), ("resume", resume)]:
        sub = actions.add_parser(name, help=f"{name} a run")
        sub.set_defaults(run=run)
        sub.add_argument("--thread", **thread)
        if name == "start":
            sub.add_argument("--operation", **operation)
            sub.add_argument("--title", **title)
            sub.add_argument("--mode", choices=MODES, default="safe")  # lab-only
        add_lab_switches(sub, name)  # lab-only
    add_approve_action(actions, thread)  # lab-only
    sub = actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=state)
    sub.add_argument("--thread", **thread)
    sub = actions.add_parser("tickets", help="list the receiver's tickets")
    sub.set_defaults(run=tickets)
    sub.add_argument("--operation", default=None, help="only the ticket with this key")
    sub = actions.add_parser("post", help="send one keyed ticket request, without the graph")
    sub.set_defaults(run=post)
    sub.add_argument("--operation", **operation)
    sub.add_argument("--title", **title)
    return parser


def parse_args(argv):
    return build_parser().parse_args(argv)


def read_config(args, environ):
    """The environment's settings onto args; a bad value is a UserError naming the variable."""
    args.api_url = environ.get("API_URL", "http://127.0.0.1:8000")
    if urllib.parse.urlsplit(args.api_url).scheme not in ("http", "https"):
        raise UserError(
            f"API_URL {args.api_url!r} needs a scheme, like http://127.0.0.1:8000", EXIT_USAGE
        )
    args.checkpoint_db = environ.get("CHECKPOINT_DB", "data/workflow/checkpoints.sqlite")
    args.timeout_s = number(environ, "API_TIMEOUT_S", API_TIMEOUT_S, float)
    args.attempts = number(environ, "API_ATTEMPTS", API_ATTEMPTS, int)


def number(environ, name, default, kind):
    text = environ.get(name)
    try:
        value = default if text is None else kind(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise UserError(f"{name}={text!r} must be a positive {kind.__name__}", EXIT_USAGE)
    return value


def main(argv=None, environ=None):
    """The CLI; returns the exit code. environ: the settings (default: os.environ)."""
    args = parse_args(argv)
    args.crash_at = getattr(args, "crash_at", None)  # lab-only
    args.term_at = getattr(args, "term_at", None)  # lab-only
    try:
        read_config(args, os.environ if environ is None else environ)
        exit_code = args.run(args)
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            body = json.loads(body)
        except ValueError:
            body = body.decode("utf-8", "replace")
        emit("http_error", status=error.code, body=body)
        return EXIT_HTTP_ERROR
    except UserError as error:
        print(f"workflow.py: {error}", file=sys.stderr)
        return error.exit_code
    except sqlite3.DatabaseError as error:  # not a database, read-only, a locked file, ...
        print(f"workflow.py: CHECKPOINT_DB {args.checkpoint_db!r}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        thread = getattr(args, "thread", None)
        hint = f"; resume it with: resume --thread {thread}" if args.run in (start, resume) else ""
        print(
            f"workflow.py: interrupted; a request in flight may have taken effect{hint}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return exit_code or 0


# lab-only: begin
# --- lab only: the switches the lessons use ---------------------------------------------------
# Everything from here to the end marker exists to make the crash window visible; `make starter`
# drops it, with every line marked lab-only above.

MODES = ("naive", "safe", "node-uuid")
CRASH_POINTS = (
    "after-prepare",
    "before-request",
    "lost-ack",
    "after-ack",
    "step-boundary",
    "after-checkpoint",
)
TERM_POINTS = ("after-prepare", "after-ack")  # where --term-at sends SIGTERM (lab 09)
APPROVAL_SHAPES = ("in-node", "own-node")  # where --approval waits for a human (lab 07)
DURABILITIES = ("sync", "async", "exit")
EXIT_CRASHED = 137  # the crash switch: SIGKILL is signal 9, and a shell reports 128 + 9
LOST_ACK_HEADER = "Failpoint-Token"  # api.py's before-answer failpoint: the first POST with a
#                                   token loses its answer (FAILPOINTS=before-answer=drop-answer)


def lab_key(state, key):
    """--mode: safe keeps the run's key; naive sends none; node-uuid mints one per attempt."""
    return {"naive": None, "safe": key, "node-uuid": str(uuid.uuid4())}[state["mode"]]


def crash(point, crash_at):
    """The crash switch: SIGKILL, so nothing (no finally, no atexit) runs after it."""
    if point != crash_at:
        return
    if point == "after-ack":
        emit("crash_before_node_return")
    else:
        emit("crash", at=point)
    os.kill(os.getpid(), signal.SIGKILL)


def lab_client(client, args):
    if args.crash_at != "lost-ack":
        return client
    return LostAckClient(client.api_url, client.timeout_s, client.attempts, args.thread)


class LostAckClient(TicketClient):
    """--crash-at lost-ack: ask the receiver to commit and then drop its answer, once per thread."""

    def __init__(self, api_url, timeout_s, attempts, token):
        super().__init__(api_url, timeout_s, attempts)
        self.token, self.first = token, True

    def headers(self):
        return {LOST_ACK_HEADER: self.token}

    def create(self, title, key=None):
        first, self.first = self.first, False
        result = super().create(title, key)
        if first:  # an answer came to the request that was to lose it: no fault happened
            print(
                "workflow.py: --crash-at lost-ack: the receiver answered anyway "
                "(FAILPOINTS=before-answer=drop-answer is off, or this thread's fault was used; "
                "lab 06 names -f compose.yaml -f labs/lost-ack.compose.yaml on each command)",
                file=sys.stderr,
            )
        return result


def add_lab_switches(sub, action):
    crash_group = sub.add_mutually_exclusive_group()
    crash_group.add_argument(
        "--crash",
        dest="crash_at",
        action="store_const",
        const="after-ack",
        help="same as --crash-at after-ack",
    )
    crash_group.add_argument("--crash-at", choices=CRASH_POINTS, help="where the run dies")
    sub.add_argument("--term-at", choices=TERM_POINTS, help="where the run gets SIGTERM")
    sub.add_argument("--durability", choices=DURABILITIES, default="sync")
    if action == "start":
        sub.add_argument(
            "--approval",
            nargs="?",
            const="in-node",
            choices=APPROVAL_SHAPES,
            help="wait for a human after the ticket: in-node (the default) or own-node",
        )


def add_approve_action(actions, thread):
    sub = actions.add_parser("approve", help="answer a run that waits for approval (lab 07)")
    sub.set_defaults(run=resume, crash_at=None, term_at=None, durability="sync")
    sub.add_argument("--thread", **thread)
    sub.add_argument("--reject", dest="approve", action="store_false", help="answer no")


def deploy(point, term_at):
    """The deploy switch: SIGTERM, what `docker compose stop` sends first. The run drains."""
    if point != term_at:
        return
    emit("sigterm", at=point)
    os.kill(os.getpid(), signal.SIGTERM)


def step_boundary_saver(saver_class):
    """A saver that SIGKILLs the process as create_ticket's result is about to be saved (lab 08).

    LangGraph saves a finished node with two background writes that have no order between
    them in 1.2.24: the node's writes (put_writes) and the next checkpoint (put). Whichever
    comes first with the ticket_id, the process dies before writing it: the node has
    returned and its result is on no disk. The worst case of langgraph#8039, every time.
    """

    dying = threading.Lock()

    def die():
        dying.acquire()  # the other write, if it gets here too, waits here for the kill
        emit("crash", at="step-boundary")
        os.kill(os.getpid(), signal.SIGKILL)

    class StepBoundaryCrash(saver_class):
        def put_writes(self, config, writes, task_id, task_path=""):
            if any(channel == "ticket_id" for channel, _ in writes):
                die()
            return super().put_writes(config, writes, task_id, task_path)

        def put(self, config, checkpoint, metadata, new_versions):
            if "ticket_id" in checkpoint["channel_values"]:
                die()
            return super().put(config, checkpoint, metadata, new_versions)

    return StepBoundaryCrash


def ask_approval(result):
    """Wait for a human: the run stops here, and `approve` resumes it with the answer."""
    from langgraph.types import interrupt

    approved = interrupt({"ticket_id": result["ticket_id"]})
    emit("approval", approved=approved)
    return approved


def approval_node(state: State):
    """The approval in a node of its own: on resume it runs again, and repeats only the wait."""
    return {"approved": ask_approval(state)}


def thread_approval(saver, config):
    """The approval shape the thread was started with: its graph must be built the same way."""
    saved = saver.get_tuple(config)
    return saved.checkpoint["channel_values"].get("approval") if saved else None


def check_approval(args, snapshot):
    """`approve` needs a run that waits for approval; `resume` must not answer one by accident."""
    waiting, approving = bool(snapshot.interrupts), getattr(args, "approve", None) is not None
    if approving and not waiting:
        raise UserError(f"thread {args.thread!r} is not waiting for approval", EXIT_THREAD)
    if waiting and not approving:
        raise UserError(
            f"thread {args.thread!r} waits for approval; answer with approve (or --reject)",
            EXIT_THREAD,
        )


def approval_answer(args, graph_input):
    """`approve` resumes the waiting node with the human's answer: Command(resume=...)."""
    if getattr(args, "approve", None) is None:
        return graph_input
    from langgraph.types import Command

    return Command(resume=args.approve)


# lab-only: end

if __name__ == "__main__":
    sys.exit(main())
