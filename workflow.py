"""A two-node LangGraph workflow that opens a ticket in another service, once, as long as the
receiver honours the idempotency key (one that forgets a key too soon makes a second ticket).

    START -> prepare -> create_ticket -> END

The crash window: the receiver (api.py) commits the ticket and then answers; LangGraph saves the
node's result only after the node has returned. A process that dies in between leaves a ticket
the checkpoint knows nothing about, and the resumed run starts create_ticket again from its first
line. create_ticket_naive sends again, and the receiver makes a second ticket. create_ticket
sends through the effect ledger (effects.py) with the key prepare derived from the run's input:
the resumed run returns the receipt, or asks the receiver what the key made, instead.

The `fail("...")` lines are failpoints (failpoints.py): off unless FAILPOINTS turns them on
(FAILPOINTS="after-ack=kill" opens the window for real). SIGTERM drains: the node in flight
finishes, its result is saved, exit 75. Output: one JSON object per line. Exit codes:
exitcodes.py. Settings (environment): API_URL, API_TIMEOUT_S, API_ATTEMPTS, API_TOKEN
(providers.py); CHECKPOINT_DB (data/workflow/checkpoints.sqlite, or a postgresql:// URL);
FAILPOINTS; TRACE (tracing.py); LEDGER_LEASE_S, LEDGER_RECEIPT_KEY, LEDGER_RECEIPT_UNKEYED
(ledger.py, ledger_tables.py).
"""

if __name__ == "__main__":  # a Ctrl-C while the imports below run: one line, not a traceback
    import os
    import signal

    said = b"workflow.py: interrupted\n"  # exit 130, EXIT_INTERRUPTED: nothing has run yet
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, said), os._exit(130)))

import dataclasses
import os
import urllib.parse
from typing import NotRequired, TypedDict

import commandline
import effects
from exitcodes import emit, looking
from failpoints import fail
from providers import RECEIVER_ANSWERS, HttpClient, Provider

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


def prepare(state: State):
    emit("prepare", operation=state["operation_id"])
    fail("after-prepare")
    # The key names the business operation, not the attempt: it comes from the run's input,
    # so every retry and every resume of this run derives the same key.
    return {"key": state["operation_id"]}


def create_ticket_naive(state: State, runtime):
    """The node without the ledger: no key, nothing recorded; a resume sends it again."""
    answer = runtime.context.client.create(state["title"])
    fail("after-ack")
    return {"ticket_id": answer["ticket_id"]}


def create_ticket(state: State):
    """The same request as an effect: recorded in the ledger before it leaves, its answer kept
    as a receipt. A resumed run that finds the receipt sends nothing; one that finds only the
    intent asks the receiver by key."""
    fail("before-request")
    done = ticket({"title": state["title"]}, key=state["key"])
    ticket_id = done.answer["ticket_id"]
    if done.how == "sent":
        emit("effect_ack", created=done.answer["created"], ticket_id=ticket_id)
    else:  # nothing was sent: the ledger's receipt, or what the receiver holds under the key
        emit(f"effect_{done.how}", key=state["key"], ticket_id=ticket_id)
    # The receipt is kept, this node not returned: a crash here re-runs it; it finds the receipt.
    fail("after-ack")
    return {"ticket_id": ticket_id}


class TicketClient(HttpClient):
    """The receiver's calls (api.py): a ticket made under a key, the tickets a key made."""

    def create(self, title, key=None):
        return self.call("/tickets", {"title": title}, key)

    def tickets(self, key=None):
        query = "" if key is None else "?" + urllib.parse.urlencode({"key": key})
        return self.call("/tickets" + query)["tickets"]


# The provider, declared once: its name (its settings: API_URL, ...), its client, and its kind.
# The receiver honours Idempotency-Key (a repeat is answered with the first ticket): keyed. Its
# 409 is a key used for another body, a refusal (RECEIVER_ANSWERS). It commits what it read
# within twice its busy timeout (2 s) or answers 503 and rolls back: RECEIVER_SETTLE_S.
RECEIVER_SETTLE_S = 5.0
API = Provider(
    "API",
    url="http://127.0.0.1:8000",
    client_class=TicketClient,
    keyed=True,
    settle_s=RECEIVER_SETTLE_S,
    answers=RECEIVER_ANSWERS,
    label="the receiver",
)


def find_ticket(client, key):
    """The ticket the key made (the receiver keeps one per key), or None."""
    found = client.tickets(key)
    return {"ticket_id": found[0]["ticket_id"], "created": False} if found else None


@effects.effect(
    API,
    external_id="ticket_id",
    lookup=find_ticket,
    answer_of=lambda ticket_id: {"ticket_id": int(ticket_id), "created": False},
    look_with=looking("tickets --operation {key}", " (GET /tickets?key={key} on API_URL)"),
)
def ticket(client, request, key):
    return client.create(request["title"], key)


STEPS = (prepare, create_ticket)  # the graph: START -> each node in turn -> END


@dataclasses.dataclass(frozen=True)
class Context:
    """What a run needs from outside, handed to every node as runtime.context."""

    client: TicketClient  # the API provider's
    ledger: effects.Ledger  # in the checkpoints' own database (effects.open_ledger)
    clients: dict = dataclasses.field(default_factory=dict)  # every provider's, by its name

    def client_for(self, effect):
        """The client of the provider the effect names."""
        name = effect.provider_name
        return self.client if name == "API" else self.clients[name]


def build_graph(checkpointer):
    """The compiled graph: prepare derives the key, create_ticket sends it with the request."""
    from langgraph.graph import END, START, StateGraph  # slow import: only graph commands pay

    builder = StateGraph(State, context_schema=Context)
    builder.add_sequence(STEPS)  # each node named after its function, an edge to the next
    builder.add_edge(START, STEPS[0].__name__)
    builder.add_edge(STEPS[-1].__name__, END)
    return builder.compile(checkpointer=checkpointer)


def run_graph(graph, graph_input, thread, client, ledger, durability="sync", metadata=None):
    """Start a run (graph_input) or resume one (None): its final values, or None if it drained
    (commandline.invoke_draining). client: the API provider's, or {provider name: client}."""
    clients = client if isinstance(client, dict) else {"API": client}
    context = Context(clients.get("API"), ledger, clients)
    return commandline.invoke_draining(graph, graph_input, thread, context, durability, metadata)


# --- the CLI: start, resume, state and reconcile are commandline.py's, for any graph --------


def start_input(args):
    return {"operation_id": args.operation, "title": args.title}


def tickets(args, settings):  # what the provider holds: ticket's look_with
    emit("tickets", tickets=settings.client().tickets(args.operation))


def post(args, settings):  # one keyed request, without the ledger: what the receiver says
    result = settings.client().create(args.title, args.operation)
    emit("post", created=result["created"], ticket_id=result["ticket_id"])


@dataclasses.dataclass(frozen=True)
class Settings(commandline.ProgramSettings):
    """The environment's settings, with every Provider declared above."""

    providers: tuple = tuple(v for v in globals().values() if isinstance(v, Provider))


def build_parser(prog="workflow.py"):
    """The CLI's parser; parser.actions holds its subcommands, for a caller to extend."""
    doc = " ".join(__doc__.split("\n\n")[0].split())
    declared = effects.declared(globals())  # what reconcile can look up
    parser = commandline.graph_parser(prog, doc, declared, build_graph, run_graph, start_input)
    operation = dict(default="case-001:open-ticket:v1", help="operation id, used as the key")
    title = dict(default="Check supplier configuration", help="ticket title")
    parser.start.add_argument("--operation", **operation)
    parser.start.add_argument("--title", **title)
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
    points and settings_class: those of a program that wraps this CLI with its own."""
    args = (parser or build_parser()).parse_args(argv)
    environ = os.environ if environ is None else environ
    return commandline.run_action(args, lambda: settings_class.from_environ(environ), points)


if __name__ == "__main__":
    commandline.run_script(main, "workflow.py")
