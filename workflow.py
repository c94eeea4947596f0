"""A two-node LangGraph workflow that opens a ticket in another service, once, as long as the
receiver honours the idempotency key (one that forgets a key too soon makes a second ticket).

    START -> prepare -> create_ticket -> END

The crash window: create_ticket asks the receiver for a ticket. The receiver commits the ticket
and then answers; LangGraph saves the node's result only after the node has returned. A process
that dies in between (a kill, an out-of-memory, a deploy) leaves a ticket that the checkpoint
knows nothing about, and the resumed run starts create_ticket again from its first line. The
effect ledger (effects.py) recorded the intent before the request left and keeps the answer (a
receipt): the resumed run returns the receipt, or asks the receiver what the key made, instead
of sending again. prepare derives the key from the run's input, so every attempt sends the same
Idempotency-Key, and the receiver answers a repeat with the ticket it already made.

The `fail("...")` lines are named failpoints (failpoints.py): they do nothing unless turned on,
and they mark where the window is. FAILPOINTS="after-ack=kill" opens it for real. SIGTERM (a
deploy) drains: the node in flight finishes, its result is saved, exit 75; `resume` goes on.

Output is one JSON object per line, keys sorted. Exit codes: EXIT_* in plumbing.py.

Configuration (environment, read in main()): each provider's {NAME}_URL, {NAME}_TIMEOUT_S,
{NAME}_ATTEMPTS and {NAME}_TOKEN (API's: http://127.0.0.1:8000, 5 s, 4 tries, none; see
plumbing.py), and
    CHECKPOINT_DB    data/workflow/checkpoints.sqlite, or a postgresql:// URL (PostgresSaver; needs
                     requirements-postgres.txt: langgraph-checkpoint-postgres, psycopg)
    FAILPOINTS       "" (all off); e.g. "after-ack=kill" (see failpoints.py and POINTS)
    LEDGER_LEASE_S   300 (seconds a SQLite ledger's lease keeps a second performer of a key out
                     while its holder lives; a dead holder's lock ends at once: effects.py)
    TRACE            "" (off); otlp, or a file: spans of each run, effect and request, with the
                     idempotency key (tracing.py; needs requirements-otel.txt)
    LEDGER_RECEIPT_KEY      "" (a receipt's integrity hash is a plain sha256, which catches
                            damage, not a forger); a secret: an HMAC-SHA256 under it
    LEDGER_RECEIPT_UNKEYED  refuse; accept: with a key set, also read receipts written before it
"""

if __name__ == "__main__":  # a Ctrl-C while the imports below run: one line, not a traceback
    import os
    import signal

    said = b"workflow.py: interrupted\n"  # exit 130, EXIT_INTERRUPTED: nothing has run yet
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, said), os._exit(130)))

import dataclasses
import os
import signal
import threading
import urllib.parse
from typing import NotRequired, TypedDict

import effects
import plumbing
import tracing
from failpoints import fail
from plumbing import (  # the exit codes: their table in plumbing.py
    EXIT_DRAINED,
    EXIT_THREAD,
    Parser,
    UserError,
    emit,
    open_checkpointer,
    thread_config,
)

POINTS = (
    "after-prepare",
    "before-request",
    "after-intent",  # effects.py: any effect's intent committed, its request not sent yet
    "after-send",  # effects.py: the provider answered, the receipt not kept yet
    "after-receipt",  # effects.py: any effect's receipt kept, its node not returned
    "after-ack",
    "after-checkpoint",
)


class State(TypedDict):
    operation_id: str
    title: str
    key: NotRequired[str]
    ticket_id: NotRequired[int]


@dataclasses.dataclass(frozen=True)
class Context:
    """What a run needs from outside, handed to every node as runtime.context."""

    client: "TicketClient"  # the API provider's
    ledger: "effects.Ledger"  # in the checkpoints' own database (effects.open_ledger)
    clients: dict = dataclasses.field(default_factory=dict)  # every provider's, by its name

    def client_for(self, effect):
        """The client of the provider the effect names."""
        name = plumbing.provider_of(effect)
        return self.client if name == "API" else self.clients[name]


def prepare(state: State):
    emit("prepare", operation=state["operation_id"])
    fail("after-prepare")
    # The key names the business operation, not the attempt: it comes from the run's input,
    # so every retry and every resume of this run derives the same key.
    return {"key": state["operation_id"]}


def create_ticket(state: State, runtime):
    ledger, client = runtime.context.ledger, runtime.context.client_for(TICKET)
    fail("before-request")
    # TICKET.perform records the intent in the ledger before the request leaves, and the answer
    # (a receipt) once it comes back. A resumed run that finds the receipt returns it and sends
    # nothing; one that finds only the intent asks the receiver by key (see effects.py).
    done = TICKET.perform(ledger, state["key"], {"title": state["title"]}, client)
    ticket_id = done.answer["ticket_id"]
    if done.how == "sent":
        emit("effect_ack", created=done.answer["created"], ticket_id=ticket_id)
    else:  # nothing was sent: the ledger's receipt, or what the receiver holds under the key
        emit(f"effect_{done.how}", key=state["key"], ticket_id=ticket_id)
    # The receipt is in the ledger and this node has not returned, so its result is not in the
    # checkpoint yet: a process that dies here re-runs the node, which finds the receipt.
    fail("after-ack")
    return {"ticket_id": ticket_id}


class TicketClient(plumbing.HttpClient):
    """The receiver's calls (api.py): a ticket made under a key, the tickets a key made."""

    def create(self, title, key=None):
        return self.call("/tickets", {"title": title}, key)

    def tickets(self, key=None):
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return self.call("/tickets" + query)["tickets"]


# The provider, declared once: its name (its settings: API_URL, API_TIMEOUT_S, API_ATTEMPTS,
# API_TOKEN), its client, where it listens unless API_URL says otherwise, and what the ledger may
# assume of it for every effect sent to it. The receiver honours Idempotency-Key (api.py: a
# repeat is answered with the first ticket), so a request whose answer was lost may go again
# under its key: keyed. Its 409 is a key used for another body, a refusal (RECEIVER_ANSWERS; the
# IETF draft's 409 means "in progress", the default). It commits a request within RECEIVER_SETTLE_S.
RECEIVER_SETTLE_S = 5.0  # api.py: a request it has read is committed within twice its
#   BUSY_TIMEOUT_S (2 s: the lock, then SQLite's busy wait) or answered 503 and rolled back
API = plumbing.Provider(
    "API",
    url="http://127.0.0.1:8000",
    client_class=TicketClient,
    keyed=True,
    settle_s=RECEIVER_SETTLE_S,
    answers=plumbing.RECEIVER_ANSWERS,
    label="the receiver",
)

# The effect, declared once: what it sends and how the receiver is asked what a key made; the
# rest (keyed, its settle time, which answers say "not sent" or "no") is its provider's.
TICKET = plumbing.Effect(
    "ticket",
    provider=API,
    send=lambda client, request, key: client.create(request["title"], key),
    lookup=lambda client, key: adopt(client.tickets(key)),
    external_id=lambda answer: answer["ticket_id"],
    answer_of=lambda ticket_id: {"ticket_id": int(ticket_id), "created": False},
    look_with="python workflow.py tickets --operation {key} (GET /tickets?key={key} on API_URL)",
)


def adopt(found):
    """The lookup's answer: the ticket the key made (the receiver keeps one per key), or None."""
    return {"ticket_id": found[0]["ticket_id"], "created": False} if found else None


STEPS = (prepare, create_ticket)  # the graph: START -> each node in turn -> END


def build_graph(checkpointer):
    """The compiled graph: prepare derives the key, create_ticket sends it with the request."""
    from langgraph.graph import END, START, StateGraph  # slow import: only graph commands pay

    builder = StateGraph(State, context_schema=Context)
    builder.add_sequence(STEPS)  # each node named after its function, an edge to the next
    builder.add_edge(START, STEPS[0].__name__)
    builder.add_edge(STEPS[-1].__name__, END)
    return builder.compile(checkpointer=checkpointer)


def run_graph(graph, graph_input, thread, client, ledger, durability="sync", metadata=None):
    """Start a run (graph_input) or resume one (None); its final values, or None if it drained.
    client: the API provider's, or {provider name: client}; metadata: recorded in each
    checkpoint the run saves (LangGraph copies config["metadata"]).

    SIGTERM asks LangGraph to drain (RunControl.request_drain, LangGraph 1.2.0 and later: it came
    with langgraph#7274): the node in flight finishes, its result is saved, and the run stops at
    the next step boundary.
    """
    from langgraph.errors import GraphDrained
    from langgraph.runtime import RunControl

    clients = client if isinstance(client, dict) else {"API": client}
    config = {**thread_config(thread), "metadata": metadata or {}}
    control = RunControl()
    # Only the main thread receives signals (and may set a handler): an in-process caller on
    # another thread runs without one.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, lambda *_: control.request_drain("SIGTERM"))
    try:
        with tracing.run(thread) as span:
            try:
                final = graph.invoke(
                    graph_input,
                    config,
                    durability=durability,
                    control=control,
                    context=Context(clients.get("API"), ledger, clients),
                )
            except GraphDrained as drained:  # a clean stop, not a failure: say so, and where
                tracing.drained(span, drained.reason)
                emit("drained", reason=drained.reason, next=list(graph.get_state(config).next))
                return None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    fail("after-checkpoint")
    return final


# --- the CLI: one function per action ------------------------------------------------------


def start(args, settings):
    return run(args, settings, {"operation_id": args.operation, "title": args.title})


def resume(args, settings):
    return run(args, settings, None)


def run(args, settings, graph_input):
    """Start (graph_input) or resume (None) args.thread."""
    with (
        open_checkpointer(settings.checkpoint_db) as saver,
        effects.open_ledger(settings.checkpoint_db, settings.lease_s) as ledger,
    ):
        graph = build_graph(saver)
        plumbing.require_thread(graph, args.thread, graph_input is not None)
        final = run_graph(graph, graph_input, args.thread, settings.clients(), ledger)
    if final is None:
        return EXIT_DRAINED
    emit("done", **final)
    return 0


def state(args, settings):
    with open_checkpointer(settings.checkpoint_db) as saver:
        snapshot = build_graph(saver).get_state(thread_config(args.thread))
    if not snapshot.values:
        raise UserError(f"no thread {args.thread!r}; check --thread", EXIT_THREAD)
    emit("state", values=snapshot.values, next=list(snapshot.next))


def tickets(args, settings):  # what the provider holds: TICKET's look_with
    emit("tickets", tickets=settings.client().tickets(args.operation))


def post(args, settings):  # one keyed request, without the ledger: what the receiver says
    result = settings.client().create(args.title, args.operation)
    emit("post", created=result["created"], ticket_id=result["ticket_id"])


@dataclasses.dataclass(frozen=True)
class Settings(plumbing.Settings):
    """The environment's settings, with every Provider declared above (plumbing.Settings)."""

    providers: tuple = tuple(v for v in globals().values() if isinstance(v, plumbing.Provider))


def build_parser(prog="workflow.py"):
    """The CLI's parser; parser.actions holds its subcommands, for a caller to extend."""
    parser = Parser(prog=prog, description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.set_defaults(prog=prog, graph_command=False, resume="resume", unkeyed=lambda _: False)
    parser.set_defaults(effects=effects.declared(globals()))  # what reconcile can look up
    parser.actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    thread = dict(default=plumbing.Defaulted("demo"), help="checkpoint thread id (default: demo)")
    operation = dict(default="case-001:open-ticket:v1", help="operation id, used as the key")
    title = dict(default="Check supplier configuration", help="ticket title")
    for name, action in [("start", start), ("resume", resume)]:
        sub = parser.actions.add_parser(name, help=f"{name} a run")
        sub.set_defaults(run=action, graph_command=True)
        sub.add_argument("--thread", **thread)
        if name == "start":
            sub.add_argument("--operation", **operation)
            sub.add_argument("--title", **title)
    sub = parser.actions.add_parser("state", help="show a thread's checkpoint")
    sub.set_defaults(run=state)
    sub.add_argument("--thread", **thread)
    sub = parser.actions.add_parser("reconcile", help="settle the ledger's open effects")
    sub.set_defaults(run=plumbing.reconcile)
    sub.add_argument("--confirmed", nargs="+", default=[], metavar="KEY", help="it happened")
    sub.add_argument("--not-sent", nargs="+", default=[], metavar="KEY", help="it did not")
    sub.add_argument(
        "--wait", action="store_true", help="wait out the providers' settle time, then settle"
    )
    sub = parser.actions.add_parser("tickets", help="list the receiver's tickets")
    sub.set_defaults(run=tickets)
    sub.add_argument("--operation", default=None, help="only the ticket with this key")
    sub = parser.actions.add_parser("post", help="send one keyed ticket request, without the graph")
    sub.set_defaults(run=post)
    sub.add_argument("--operation", **operation)
    sub.add_argument("--title", **title)
    return parser


def main(argv=None, environ=None, parser=None, points=POINTS, settings_class=Settings):
    """The CLI; returns the exit code. environ: the settings (default: os.environ); parser,
    points and settings_class: those of a program that wraps this CLI with its own. Each error
    is one line and an exit code (plumbing.run_action)."""
    args = (parser or build_parser()).parse_args(argv)
    environ = os.environ if environ is None else environ
    return plumbing.run_action(args, lambda: settings_class.from_environ(environ), points)


if __name__ == "__main__":
    plumbing.run_script(main, "workflow.py")
