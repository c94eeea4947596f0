"""The drill (effectdrill: a real fork and SIGKILL before each saver call, then a resume) over
every lab graph in labs/graphs/: through the ledger (and with lab 02's key) no effect repeats;
in the lessons' naive variants exactly the lessons' duplicates do, and nothing else.

The ticket graph's lesson is read from make drill's matrix (tools/drill.py MATRIX, its
after-ack row: the kill after the answer, before the node's result is saved), per mode. The
other graphs' lessons are those their guides show: lab 11 (the shop, the approval), lab 13
(the saga), lab 18 (the webhook handler, whose re-run is a redelivery) and lab 20 (the
assistant's approval handler, which sends after "accept" and repeats the first email in every
run). Each table keeps every word of its cells whole, however long a node's name. A ledger row also
checks that nothing was sent again: effectdrill records every HTTP request of every run
(effectdrill/outbound.py), and a ledger that replays its receipt sends none, where lab 02's key
sends the request again and lets the receiver answer it.
"""

import gc
import tempfile
from dataclasses import dataclass

import pytest

import effectdrill
from labs import modes as modes_lesson
from labs import outbox, saga  # lessons whose module is also their drill adapter
from labs.graphs import approval, assistant, classify, shop, ticket, webhook
from tools.drill import MATRIX
from tools.local import ROOT, ReceiverProcess, free_port, lab_env

AFTER_ACK = next(row for row in MATRIX if (row.boundary, row.durability) == ("after-ack", "sync"))
TICKET_AFTER_ACK = "put_writes create_ticket [ticket_id]"  # effectdrill's name for that moment
EVENT = {"event_id": "{thread}", "ticket": "{thread}", "status": "resolved", "version": 1}  # lab 18
SAGA = {"operation_id": "{thread}", "title": "{thread}", "seats": 2, "ship_to": "AQ"}  # refused
OUTBOX = {"operation_id": "{thread}", "title": "{thread}"}  # lab 19
CONVERSATION = {"conversation": "{thread}"}  # lab 20
ASSISTANT_REPEATS = {  # lab 20: a kill inside the handler, after one email or after both
    ("put_writes review_and_send [__interrupt__, __resume__] in approval", "email-1", 3),
    ("put_writes review_and_send [__resume__, sent] in approval", "email-1", 3),
    ("put_writes review_and_send [__resume__, sent] in approval", "email-2", 2),
}
APPROVAL_REPEATS = (  # lab 11: the request before interrupt() runs again wherever it is re-run
    "put_writes request_refund [__interrupt__]",
    "put_writes request_refund [__resume__, approved, branch:to:notify] (others saved)",
    "put_writes [__resume__] + request_refund (none saved)",
)


@dataclass(frozen=True)
class Drill:
    """One graph in one variant: what the drill must find (point, effect, count)."""

    module: object
    input: dict
    duplicates: frozenset = frozenset()
    repeated_in_clean_run: tuple = ()  # effects the clean run itself repeated (an interrupt)
    ledger: bool = False  # through the ledger: no request is sent again anywhere
    resume_with: object = None
    needs: str = ""  # who makes this row pass, when it is not yet on main
    variant: str = "graph"  # the module's graph, or a function of it that builds one

    @property
    def graph(self):
        return getattr(self.module, self.variant)

    @property
    def context(self):
        context = getattr(self.module, "context", None)
        return context() if context else None


def ticket_drill(mode):
    """labs/lab_graph.py's graph in one mode, expected as make drill's after-ack row says."""
    tickets = AFTER_ACK.tickets[modes_lesson.MODES.index(mode)]
    found = {(TICKET_AFTER_ACK, "ticket", tickets)} if tickets > 1 else set()
    run = {"operation_id": "{thread}", "title": "{thread}", "mode": mode}
    return Drill(ticket, run, frozenset(found), ledger=mode == "ledger")


DRILLS = {
    **{f"ticket-{mode}": ticket_drill(mode) for mode in modes_lesson.MODES},
    "saga-naive": Drill(  # lab 13: no carrier ships to AQ, so both undos run, unkeyed
        saga,
        {**SAGA, "mode": "naive"},
        frozenset(
            {
                ("put_writes release [branch:to:refund, release_id]", "release", 2),
                ("put_writes refund [refund_id]", "refund", 2),
            }
        ),
    ),
    "saga-safe": Drill(saga, {**SAGA, "mode": "safe"}),
    "saga-ledger": Drill(saga, {**SAGA, "mode": "ledger"}, ledger=True),
    "shop-naive": Drill(
        shop,
        {"order": "{thread}"},
        frozenset({("put_writes charge [branch:to:send_receipt, charged]", "charge", 2)}),
    ),
    "shop-ledger": Drill(shop, {"order": "{thread}", "mode": "ledger"}, ledger=True),
    "approval-naive": Drill(
        approval,
        {"refund": "{thread}"},
        frozenset((point, "request", 3) for point in APPROVAL_REPEATS),
        repeated_in_clean_run=("request",),
        resume_with=True,
    ),
    "outbox-direct": Drill(  # lab 19's naive variant: the node sends, without a key
        outbox,
        {**OUTBOX, "delivery": "direct"},
        frozenset({("put_writes request_ticket [ticket_id]", "ticket", 2)}),
    ),
    # The outbox: the node writes a keyed row and sends nothing; observe runs the relay
    "outbox-outbox": Drill(outbox, {**OUTBOX, "delivery": "outbox"}, ledger=True),
    "approval-ledger": Drill(
        approval,
        {"refund": "{thread}", "mode": "ledger"},
        ledger=True,
        resume_with=True,
    ),
    "webhook-naive": Drill(  # lab 18: the handler re-run is the event delivered twice
        webhook,
        EVENT,
        frozenset({("put_writes take_event [applied, branch:to:close]", "notice", 2)}),
    ),
    "webhook-inbox": Drill(webhook, {**EVENT, "mode": "inbox"}, ledger=True),
    "assistant-naive": Drill(  # lab 20: the handler sends after "accept", then returns
        assistant,
        CONVERSATION,
        frozenset(ASSISTANT_REPEATS),
        repeated_in_clean_run=("email-1",),  # two approvals, no crash: the first email twice
        resume_with="accept",
        variant="naive",
    ),
    "assistant-fixed": Drill(  # a decision-only approval; the send through the ledger
        assistant, CONVERSATION, ledger=True, resume_with="accept", variant="fixed"
    ),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One receiver for every drill here (each run's effects are its own: named by its thread)
    and the shop's and the approval's SQLite files."""
    folder = tmp_path_factory.mktemp("lab-graphs")
    env = lab_env(folder / "data", free_port())
    receiver = ReceiverProcess(env, log_path=folder / "receiver.log").start()
    yield {
        "API_URL": env["API_URL"],
        "SHOP_DB": str(folder / "shop" / "shop.sqlite"),
        "APPROVAL_DB": str(folder / "approval" / "approval.sqlite"),
        "OUTBOX_DB": str(folder / "outbox" / "outbox.sqlite"),
        "WEBHOOK_DB": str(folder / "webhook" / "webhook.sqlite"),
    }
    receiver.stop()


@pytest.mark.parametrize("name", DRILLS)
def test_the_drill_over_every_lab_graph_finds_exactly_the_lessons_duplicates(
    name, world, monkeypatch, tmp_path
):
    drill = DRILLS[name]
    for variable, value in world.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a context's ledger goes
    report = effectdrill.drill(
        drill.graph,
        drill.input,
        drill.module.observe,
        context=drill.context,
        resume_with=drill.resume_with,
    )
    found = {(d["point"], d["effect"], d["count"]) for d in report.duplicates}
    why = f"{drill.needs} (not on main yet)\n" if drill.needs else ""
    assert found == drill.duplicates, why + report.table()
    assert report.repeated_in_clean_run == list(drill.repeated_in_clean_run), why + report.table()
    assert report.missing == [] and report.failed == [], why + report.table()
    assert report.rows, "the drill found no crash point"
    assert_cells_whole(report)
    if drill.ledger:  # the receipt, not the receiver: no row sent anything a second time
        again = {row.point: row.requests for row in report.rows if row.requests}
        assert again == {}, why + report.table()
    del report
    gc.collect()  # the drill let go of its context: its ledger's temporary folder went with it
    assert list(tmp_path.iterdir()) == []


def test_lab_20s_graph_drilled_with_an_answer_that_sends_nothing_is_not_all_clear(
    world, monkeypatch, tmp_path
):
    """Lab 16's answer (true) given to lab 20's handler, which sends only on "accept": the clean
    run sends nothing, so no crash could repeat anything. The drill says so and stops (it used
    to print '20 crash points, 0 duplicate ... clean run ok' and exit 0), unless told that a
    run without effects is what is meant."""
    for variable, value in world.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    options = {"context": assistant.context(), "resume_with": True}
    with pytest.raises(effectdrill.DrillError, match="the clean run made no effect the observer"):
        effectdrill.drill(assistant.naive, CONVERSATION, assistant.observe, **options)
    report = effectdrill.drill(
        assistant.naive, CONVERSATION, assistant.observe, allow_no_effects=True, **options
    )
    assert report.ok and report.clean == {"sync": {"email-1": 0, "email-2": 0}}


def assert_cells_whole(report):
    """The table wraps a cell at spaces only: each word of a row's point, saved and ran cells
    is a word of the table (lab 20's approval/review_and_send broke on a continuation line)."""
    from effectdrill.report import ran_cell

    words = set(report.table().split())
    for row in report.rows:
        for cell in (row.point, row.runs[0].saved, ran_cell(row.runs[0].ran)):
            assert set(cell.split()) <= words, (cell, report.table())


def test_every_graph_in_labs_graphs_is_drilled_through_the_ledger_and_in_its_lesson():
    """A graph added to labs/graphs/ (or a lesson module with a drill adapter) needs its rows
    here: a lesson, and the ledger's."""
    graphs = {p.stem for p in (ROOT / "labs" / "graphs").glob("*.py") if p.stem != "__init__"}
    graphs |= {"saga", "outbox"}  # labs/saga.py and labs/outbox.py: the lesson and its adapter
    graphs -= {"classify"}  # lab 16's guide drills it, naive and fixed, in both backends
    names = {d.module.__name__.rsplit(".", 1)[1] for d in DRILLS.values()}
    assert names == graphs
    for name in graphs:
        drills = [d for d in DRILLS.values() if d.module.__name__.endswith("." + name)]
        assert any(d.ledger for d in drills) and any(d.duplicates for d in drills), name


@pytest.mark.fast
@pytest.mark.parametrize("module", [ticket, classify], ids=["ticket", "classify"])
def test_a_contexts_ledger_folder_goes_with_the_context(module, tmp_path, monkeypatch):
    """--context labs.graphs.ticket:context (lab 11) and classify:context (lab 16) give the
    drill a ledger in a temporary folder of its own: removed once the drill lets go of the
    context, not left in the system's temp folder after every drill."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("API_URL", "http://127.0.0.1:9")  # a client is made; nothing is sent
    context = module.context()
    context.ledger.counts()  # a call: the ledger's file is made (PerCall opens it per call)
    assert [p.name.startswith("drill-ledger-") for p in tmp_path.iterdir()] == [True]
    del context
    gc.collect()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.fast
def test_the_shops_ledger_stops_a_charge_it_cannot_look_up(tmp_path, monkeypatch):
    """labs/graphs/shop.py's docstring: a charge made and not yet recorded (the window the drill
    does not reach: between the payment API's answer and the receipt) is not charged again by
    the next attempt; its payment API has no lookup, so the ledger stops it for a person."""
    import effects
    import failpoints

    monkeypatch.setenv("SHOP_DB", str(tmp_path / "shop.sqlite"))
    state = {"order": "o-1", "mode": "ledger", "amount_cents": 1999}
    with failpoints.scoped({"after-send": "raise"}), pytest.raises(failpoints.FailpointError):
        shop.charge(state)
    with pytest.raises(effects.Unsettled):
        shop.charge(state)
    assert shop.observe("o-1")["charge"] == 1
