"""A two-node LangGraph workflow that opens a ticket, and can crash on purpose.

    START -> prepare -> create_ticket -> END

prepare derives the operation key from the run's input; create_ticket sends the
ticket to the receiver (api.py). The checkpointer saves the state after each
node, so a resumed run starts again at the first node that did not finish, from
that node's first line. create_ticket is where this hurts: the receiver can
commit a ticket and the process can die before the node returns. On resume the
node runs again and sends the request again. Whether that makes a second ticket
depends only on the key the request carries:

    --mode naive      no key: every attempt is a new ticket
    --mode safe       the key from the run's input: every attempt is the same ticket
    --mode node-uuid  a fresh key minted inside the node: looks keyed, still duplicates

--crash-at picks the boundary where the run dies (labs 04-06):
    after-prepare     SIGKILL inside prepare, before it returns
    before-request    SIGKILL inside create_ticket, before the request leaves
    lost-ack          the receiver commits and hangs up without answering (needs
                      RECEIVER_LAB_FAULTS=lost-ack on the receiver): the outcome is unknown
    after-ack         SIGKILL after the receiver's answer, before the node returns (--crash)
    after-checkpoint  SIGKILL after the run's last checkpoint, before `done` is printed
In safe mode an unknown outcome is reconciled: look the key up, adopt what it made or send
again with the same key. The other modes have nothing to look up and just fail (exit 3).

Output is one JSON object per line, keys sorted. Exit codes: 0 done; 1 the
receiver answered with an error (http_error); 2 bad arguments; 3 the receiver
did not answer; 4 no such thread / thread exists; 137 the crash switch (SIGKILL).

Configuration (environment, read in main()):
    API_URL        http://127.0.0.1:8000 (compose sets http://api:8000)
    CHECKPOINT_DB  data/workflow/checkpoints.sqlite, or a postgresql:// URL (lab 10)
"""

import argparse
import contextlib
import http.client
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import NotRequired, TypedDict

REQUEST_TIMEOUT_S = 5.0  # seconds; the receiver answers in milliseconds, so 5 s means it is gone
CRASH_POINTS = ("after-prepare", "before-request", "lost-ack", "after-ack", "after-checkpoint")
DURABILITIES = ("sync", "async", "exit")
MODES = ("naive", "safe", "node-uuid")
EXIT_HTTP_ERROR, EXIT_USAGE, EXIT_NO_ANSWER, EXIT_THREAD = 1, 2, 3, 4


class State(TypedDict):
    operation_id: str
    mode: str
    title: str
    key: NotRequired[str]
    ticket_id: NotRequired[int]


class UserError(Exception):
    """A mistake the user can fix: one line on stderr and this exit code."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class NoAnswer(UserError):
    """The request was sent and no answer came back: it may or may not have taken effect."""


def emit(event, **values):
    print(json.dumps({"event": event, **values}, sort_keys=True), flush=True)


def crash(point, crash_at):
    """The crash switch: SIGKILL, so nothing (no finally, no atexit) runs after it."""
    if point != crash_at:
        return
    if point == "after-ack":
        emit("crash_before_node_return")
    else:
        emit("crash", at=point)
    os.kill(os.getpid(), signal.SIGKILL)


class TicketClient:
    """The HTTP client for api.py. Plain urllib: commands that use only this load fast."""

    def __init__(self, api_url):
        self.api_url = api_url.rstrip("/")

    def call(self, path, payload=None, key=None, headers=()):
        request = urllib.request.Request(self.api_url + path, headers=dict(headers))
        if payload is not None:
            request.data = json.dumps(payload).encode()
            request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.load(response)
        except urllib.error.HTTPError:
            raise  # the receiver answered: main() prints http_error
        except urllib.error.URLError as error:  # could not connect: nothing was sent
            raise UserError(
                f"cannot reach the receiver at {self.api_url} ({error.reason}); "
                "is it running? (docker compose -p stateful-lab up -d api)",
                EXIT_NO_ANSWER,
            ) from error
        except (OSError, http.client.HTTPException) as error:  # sent, then no answer
            raise NoAnswer(
                f"no answer from the receiver at {self.api_url} ({error}); "
                "the request may or may not have taken effect",
                EXIT_NO_ANSWER,
            ) from error

    def create(self, title, key=None, lose_ack_token=None):
        headers = {"Lab-Lost-Ack": lose_ack_token} if lose_ack_token else {}
        return self.call("/tickets", {"title": title}, key, headers)

    def tickets(self, key=None):
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return self.call("/tickets" + query)["tickets"]


def build_graph(checkpointer, receiver, crash_at=None):
    """The compiled graph. crash_at names a boundary where the process SIGKILLs itself."""
    from langgraph.graph import END, START, StateGraph  # slow import: only graph commands pay

    def prepare(state: State):
        emit("prepare", operation=state["operation_id"])
        crash("after-prepare", crash_at)
        # The key names the business operation, not the attempt: it comes from the
        # run's input, so every retry of this run derives the same key.
        return {"key": state["operation_id"]}

    def create_ticket(state: State):
        mode = state["mode"]
        key = {"naive": None, "safe": state["key"], "node-uuid": str(uuid.uuid4())}[mode]
        crash("before-request", crash_at)
        lose_ack = state["operation_id"] if crash_at == "lost-ack" else None
        try:
            result = receiver.create(state["title"], key, lose_ack)
        except NoAnswer as error:
            # Sent, no answer: committed or not, nobody here can tell. (A refused
            # connection is not caught: nothing was sent, and the node just fails.)
            emit("effect_unknown", error=str(error.__cause__ or error))
            if mode != "safe":
                raise  # nothing stable to look the ticket up by: resume sends again
            result = reconcile(receiver, state["title"], key)
        else:
            if lose_ack:  # one line on stderr: the learner asked for a fault that did not happen
                print(
                    "workflow.py: --crash-at lost-ack: the receiver answered anyway "
                    "(RECEIVER_LAB_FAULTS=lost-ack is off, or this operation's fault was used)",
                    file=sys.stderr,
                )
        emit("effect_ack", created=result["created"], ticket_id=result["ticket_id"])
        # The receiver has committed the ticket and this node has not returned: its
        # result is not checkpointed yet. Dying here is the crash window.
        crash("after-ack", crash_at)
        return {"ticket_id": result["ticket_id"]}

    builder = StateGraph(State)
    builder.add_node("prepare", prepare)
    builder.add_node("create_ticket", create_ticket)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "create_ticket")
    builder.add_edge("create_ticket", END)
    return builder.compile(checkpointer=checkpointer)


def reconcile(receiver, title, key):
    """Settle an unknown outcome: adopt the ticket the key already made, or send again."""
    found = receiver.tickets(key)
    emit("reconcile", found=[t["ticket_id"] for t in found], key=key)
    for ticket in found:
        if ticket["payload"] == {"title": title}:  # this very request: adopt it
            return {"ticket_id": ticket["ticket_id"], "created": False}
    # Nothing, or the key made something else: send again with the same key and let the
    # receiver decide (create it, or refuse a reused key with 409).
    return receiver.create(title, key)


@contextlib.contextmanager
def open_graph(args):
    """The checkpointer for CHECKPOINT_DB, as a context manager that closes its connection:
    PostgresSaver for a postgresql:// URL (several workers share it: lab 10), else SqliteSaver."""
    if not args.checkpoint_db.startswith(("postgresql://", "postgres://")):
        from langgraph.checkpoint.sqlite import SqliteSaver

        Path(args.checkpoint_db).parent.mkdir(parents=True, exist_ok=True)
        with SqliteSaver.from_conn_string(args.checkpoint_db) as saver:
            yield saver
        return
    import psycopg  # Postgres users only: commands on SQLite never load it
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    try:  # the settings PostgresSaver.from_conn_string uses
        conn = psycopg.connect(
            args.checkpoint_db, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
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


def run_graph(args, first_input):
    config = {"configurable": {"thread_id": args.thread}}
    with open_graph(args) as saver:
        graph = build_graph(saver, TicketClient(args.api_url), args.crash_at)
        exists = bool(graph.get_state(config).values)
        if first_input is not None and exists:
            raise UserError(
                f"thread {args.thread!r} already exists; resume it or pick a new --thread",
                EXIT_THREAD,
            )
        if first_input is None and not exists:
            raise UserError(f"no thread {args.thread!r} to resume; check --thread", EXIT_THREAD)
        # sync: the checkpoint after prepare is on disk before create_ticket starts.
        final = graph.invoke(first_input, config, durability=args.durability)
        crash("after-checkpoint", args.crash_at)
        emit("done", **final)


def start(args):
    run_graph(args, {"operation_id": args.operation, "mode": args.mode, "title": args.title})


def resume(args):
    run_graph(args, None)


def state(args):
    config = {"configurable": {"thread_id": args.thread}}
    with open_graph(args) as saver:
        snapshot = build_graph(saver, TicketClient(args.api_url)).get_state(config)
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def tickets(args):
    emit("tickets", tickets=TicketClient(args.api_url).tickets(args.operation))


def post(args):
    result = TicketClient(args.api_url).create(args.title, args.operation)
    emit("post", created=result["created"], ticket_id=result["ticket_id"])


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def parse_args(argv):
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
            sub.add_argument("--mode", choices=MODES, default="safe")
            sub.add_argument("--title", **title)
        crash = sub.add_mutually_exclusive_group()
        crash.add_argument(
            "--crash",
            dest="crash_at",
            action="store_const",
            const="after-ack",
            help="same as --crash-at after-ack",
        )
        crash.add_argument("--crash-at", choices=CRASH_POINTS, help="where the run dies")
        sub.add_argument("--durability", choices=DURABILITIES, default="sync")
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
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.api_url = os.environ.get("API_URL", "http://127.0.0.1:8000")
    args.checkpoint_db = os.environ.get("CHECKPOINT_DB", "data/workflow/checkpoints.sqlite")
    try:
        args.run(args)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
