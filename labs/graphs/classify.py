"""One order, one call site of each class of effect, for the drill (lab 16).

    naive: quote -> set_plan -> add_seats -> open_ticket -> ask_and_email -> END
    fixed: quote -> set_plan -> add_seats -> open_ticket -> approve -> send_email -> END

The classes, by call site (one library can be any of them: sqlite3 below is harmless in one
node and a duplicate in the next):
    quote        pure: computes the order and drafts the email from the input; re-runs harmlessly
    set_plan     an idempotent write: the same UPDATE twice leaves the same row
    add_seats    an "update" that is really an increment (seats = seats + n): naive runs it again
                 on a re-run; fixed sets the total the order says (seats = n), which repeats
                 harmlessly
    open_ticket  a non-idempotent call (POST /tickets: each one a ticket unless keyed): naive
                 sends no key; fixed goes through the ledger (workflow.ticket) with the order's key
    the email    irreversible, to a provider that takes no key (the receiver's POST /messages):
                 naive sends it in the node that asks for approval, before interrupt(), so the
                 answer re-runs it (lab 07); fixed buffers it as intent (quote drafts it into the
                 state), asks in a node of its own, and sends it last, alone, through the ledger
                 (labs/keyless.py's MESSAGE)

    python -m effectdrill labs.graphs.classify:naive --input '{"customer": "{thread}"}' \
        --context labs.graphs.classify:context --observe labs.graphs.classify:observe \
        --resume-with true

observe(thread) counts what the order named `thread` made: its plan rows and seats in the SQLite
file CLASSIFY_DB (default classify/classify.sqlite in the system's temporary folder), its
tickets (titled with the order) and its emails (sent to it) at the receiver (API_URL).
"""

import contextlib
import io
import os
import sqlite3
import tempfile
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypedDict

import effects
import workflow
from labs import keyless as keyless_lesson
from labs.graphs.ticket import drill_context

SEATS = 2  # what every order asks for


class OrderOfEachClass(TypedDict, total=False):
    customer: str
    seats: int
    email: dict  # the intent, drafted by quote: {to, text}
    ticket_id: int
    approved: bool
    message_id: int | None


def quote(state: OrderOfEachClass):
    """Pure: the same input gives the same output, however often it runs."""
    text = f"{SEATS} seats on the team plan for {state['customer']}"
    return {"seats": SEATS, "email": {"to": state["customer"], "text": text}}


def set_plan(state: OrderOfEachClass):
    """An idempotent write: it sets a value, so a second run leaves what the first left."""
    with connect() as db:
        db.execute("INSERT OR IGNORE INTO accounts (customer) VALUES (?)", (state["customer"],))
        db.execute("UPDATE accounts SET plan = 'team' WHERE customer = ?", (state["customer"],))
    return {}


def add_seats_naive(state: OrderOfEachClass):
    """An UPDATE that is an increment: each run adds the seats again."""
    with connect() as db:
        db.execute(
            "UPDATE accounts SET seats = seats + ? WHERE customer = ?",
            (state["seats"], state["customer"]),
        )
    return {}


def add_seats_fixed(state: OrderOfEachClass):
    """The same call site as a write of the total the order says: a re-run sets it again."""
    with connect() as db:
        db.execute(
            "UPDATE accounts SET seats = ? WHERE customer = ?",
            (state["seats"], state["customer"]),
        )
    return {}


def open_ticket_naive(state: OrderOfEachClass, runtime):
    """A POST without a key: the receiver cannot tell a re-run from a new ticket."""
    return {"ticket_id": runtime.context.client.create(state["customer"])["ticket_id"]}


def open_ticket_fixed(state: OrderOfEachClass, runtime):
    """Keyed by the order and recorded in the ledger: a re-run returns the receipt."""
    ledger, client = runtime.context.ledger, runtime.context.client
    key = f"{state['customer']}:ticket"
    done = workflow.ticket.perform(ledger, key, {"title": state["customer"]}, client)
    return {"ticket_id": done.answer["ticket_id"]}


def ask_and_email(state: OrderOfEachClass, runtime):
    """Naive: the email goes out, then the node waits for approval; the answer re-runs it."""
    from langgraph.types import interrupt

    runtime.context.client.call("/messages", state["email"])
    return {"approved": bool(interrupt({"approve": state["email"]["text"]}))}


def approve(state: OrderOfEachClass):
    """Fixed: the wait alone in its node; re-running it repeats only the question."""
    from langgraph.types import interrupt

    return {"approved": bool(interrupt({"approve": state["email"]["text"]}))}


def send_email(state: OrderOfEachClass, runtime):
    """Fixed: the buffered intent sent last, once, through the ledger (no key is sent: the
    provider reads none; the ledger's key is the order's)."""
    if not state["approved"]:
        return {"message_id": None}
    ledger, client = runtime.context.ledger, runtime.context.client
    done = keyless_lesson.MESSAGE.perform(
        ledger, f"{state['customer']}:email", state["email"], client
    )
    return {"message_id": done.answer.get("message_id")}


def naive():
    return build(add_seats_naive, open_ticket_naive, [ask_and_email])


def fixed():
    return build(add_seats_fixed, open_ticket_fixed, [approve, send_email])


def context():
    """The drill's --context: the receiver's client, and a ledger of the drill's own (a new
    temporary file), opened for each call (PerCall)."""
    return drill_context(PerCall)


def observe(thread):
    """{plan, seats, ticket, email} of the order named `thread`."""
    with connect() as db:
        row = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(seats), 0) FROM accounts "
            "WHERE customer = ? AND plan = 'team'",
            (thread,),
        ).fetchone()
    with contextlib.redirect_stdout(io.StringIO()):
        client = workflow.Settings.from_environ(os.environ).client()
        tickets = client.tickets()
        messages = client.call("/messages")["messages"]
    return {
        "plan": row[0],
        "seats": row[1],
        "ticket": sum(t["payload"]["title"] == thread for t in tickets),
        "email": sum(m["to"] == thread for m in messages),
    }


# helpers


def build(add_seats, open_ticket, last):
    """The graph without a checkpointer: the drill gives it its own."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(OrderOfEachClass, context_schema=workflow.Context)
    nodes = [quote, set_plan, add_seats, open_ticket, *last]
    names = ["quote", "set_plan", "add_seats", "open_ticket", *(n.__name__ for n in last)]
    for name, node in zip(names, nodes, strict=True):
        builder.add_node(name, node)
    for a, b in zip([START, *names], [*names, END], strict=True):
        builder.add_edge(a, b)
    return builder.compile()


class PerCall:
    """An effects.Ledger on one file, opened and closed for each call (each is one transaction),
    so no connection is open when the drill forks a crash run, nor carried into it (SQLite's
    "How To Corrupt An SQLite Database File": a connection carried across fork()). With one
    Ledger for the whole drill, one drill of this graph in seven failed a crash run with "file
    is not a database" here; opened per call, none of twelve did."""

    def __init__(self, path):
        self.path = path

    def __getattr__(self, name):
        def call(*args, **kwargs):
            with effects.Ledger(self.path) as ledger:
                return getattr(ledger, name)(*args, **kwargs)

        return call


@contextmanager
def connect():
    """A connection to CLASSIFY_DB, committed and closed after the block; its table made on use."""
    default = Path(tempfile.gettempdir()) / "classify" / "classify.sqlite"
    path = Path(os.environ.get("CLASSIFY_DB", default))
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS accounts "
            "(customer TEXT PRIMARY KEY, plan TEXT, seats INTEGER NOT NULL DEFAULT 0)"
        )
        yield db
