"""The effect ledger against the real receiver: intent before the request, receipts, UNKNOWN.

A crash is a real SIGKILL of a forked child in the window (after the receiver answered, before
the answer was recorded); the parent then resumes with a ledger of its own on the same file.
"""

import dataclasses
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import examples

import checkpoints
import commandline
import effects
import exitcodes
import providers
import workflow


def sends(client, request, key):
    return client.create(request["title"], key)


def looks_up(client, key):
    found = client.tickets(key)
    return {"ticket_id": found[0]["ticket_id"], "created": False} if found else None


TICKET = effects.Effect(
    "ticket",
    send=sends,
    external_id=lambda answer: answer["ticket_id"],
    lookup=looks_up,
    not_sent=providers.did_nothing,
    keyed=True,  # the receiver answers a repeated Idempotency-Key with the first ticket
)
KEYLESS = effects.Effect(  # a provider that offers no lookup (an email service, say)
    "ticket", send=sends, external_id=lambda answer: answer["ticket_id"]
)


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.fast), "postgres"])
def open_ledger(request, tmp_path):
    """A function that opens a new ledger on this test's database, as a new process would."""
    if request.param == "sqlite":
        path = tmp_path / "checkpoints.sqlite"
        yield lambda **settings: effects.Ledger(path, **settings)
        return
    import psycopg
    from psycopg.rows import dict_row

    pg = request.getfixturevalue("postgres")
    name = f"ledger_{os.getpid()}_{abs(hash(request.node.name))}"
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = pg.url.rsplit("/", 1)[0] + "/" + name

    def opened(**_):
        conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        ledger = effects.PostgresLedger(conn)
        ledger.close = conn.close
        return ledger

    yield opened


@pytest.fixture
def client(receiver):
    return workflow.TicketClient(receiver.url, attempts=1)


def posts(receiver):
    """POSTs the receiver answered with a ticket (created or replayed), from GET /metrics."""
    with urllib.request.urlopen(receiver.url + "/metrics") as response:
        text = response.read().decode()
    names = ("tickets_created", "idempotent_replays")
    return sum(int(re.search(rf"^receiver_{n}_total (\d+)$", text, re.M)[1]) for n in names)


def die_in_the_window(open_ledger, effect, key, request, client):
    """A forked child performs the effect and is SIGKILLed after the answer, before confirm."""

    def send_then_die(client, request, key):
        effect.send(client, request, key)
        os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:  # the child: its own connection, as a new process would have
        try:
            with open_ledger() as ledger:
                dataclass_copy(effect, send=send_then_die).perform(ledger, key, request, client)
        finally:
            os._exit(1)  # not reached when the kill lands
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def dataclass_copy(effect, **changes):
    import dataclasses

    return dataclasses.replace(effect, **changes)


def test_a_confirmed_effect_returns_its_receipt_and_the_receiver_hears_nothing(
    open_ledger, receiver, client
):
    with open_ledger() as ledger:
        first = TICKET.perform(ledger, "op-1", {"title": "t"}, client)
        before = posts(receiver)
        again = TICKET.perform(ledger, "op-1", {"title": "t"}, client)
        assert (first.how, again.how) == ("sent", "receipt")
        assert again.answer == first.answer and first.answer["created"] is True
        assert posts(receiver) == before  # the provider was not called
        assert ledger.history("op-1") == [
            (None, "requested", "claimed"),
            ("requested", "confirmed", "answered"),
        ]


def test_a_kill_after_the_answer_is_adopted_by_lookup_not_sent_again(open_ledger, receiver, client):
    die_in_the_window(open_ledger, TICKET, "op-2", {"title": "t"}, client)
    before = posts(receiver)
    with open_ledger() as ledger:
        assert [r.key for r in ledger.unsettled()] == ["op-2"]  # requested, no answer recorded
        done = TICKET.perform(ledger, "op-2", {"title": "t"}, client)
        assert done.how == "adopted"
        assert ledger.history("op-2")[-1] == ("requested", "confirmed", "adopted by lookup")
        assert ledger.receipt("op-2")["external_id"] == str(done.answer["ticket_id"])
    assert posts(receiver) == before  # looked up, not sent again
    assert len(client.tickets()) == 1


def test_a_kill_at_after_receipt_leaves_the_receipt_and_a_replay_never_meets_the_point(
    open_ledger, receiver, client
):
    """after-receipt: every effect passes it once it has kept a receipt it did not have (sent,
    or adopted), before its node returns. A kill there leaves the receipt; the next attempt
    returns it without a request, and does not pass the point (it kept nothing new)."""
    import failpoints

    pid = os.fork()
    if pid == 0:  # the child: its own connection, killed at the point
        try:
            failpoints.configure("after-receipt=kill", known=workflow.POINTS)
            with open_ledger() as ledger:
                TICKET.perform(ledger, "op-r", {"title": "t"}, client)
        finally:
            os._exit(1)  # not reached when the kill lands
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    before = posts(receiver)
    try:
        failpoints.configure("after-receipt=raise", known=workflow.POINTS)  # met: a failure here
        with open_ledger() as ledger:
            assert ledger.history("op-r")[-1] == ("requested", "confirmed", "answered")
            done = TICKET.perform(ledger, "op-r", {"title": "t"}, client)
    finally:
        failpoints.configure("", known=workflow.POINTS)
    assert done.how == "receipt"
    assert posts(receiver) == before  # the receipt, not a request
    assert len(client.tickets()) == 1


def test_without_a_lookup_the_window_ends_in_unknown_not_in_a_second_request(
    open_ledger, receiver, client
):
    die_in_the_window(open_ledger, KEYLESS, "op-3", {"title": "t"}, client)
    before = posts(receiver)
    with open_ledger() as ledger:
        with pytest.raises(effects.Unsettled, match="reconcile --confirmed op-3"):
            KEYLESS.perform(ledger, "op-3", {"title": "t"}, client)
        assert ledger.stuck()[0] == 1
        assert posts(receiver) == before
        # A person finds the ticket and settles it; the next attempt returns the receipt.
        ticket = client.tickets()[0]
        ledger.settle("op-3", "found in the receiver", {"ticket_id": ticket["ticket_id"]}, 1)
        assert KEYLESS.perform(ledger, "op-3", {"title": "t"}, client).answer["ticket_id"] == 1
        assert ledger.stuck()[0] == 0
    assert posts(receiver) == before


def test_a_request_that_never_left_releases_its_claim(open_ledger, lab):
    down = workflow.TicketClient(lab["API_URL"], attempts=1)  # nothing listens there
    with open_ledger() as ledger:
        with pytest.raises(exitcodes.Unreachable):
            TICKET.perform(ledger, "op-4", {"title": "t"}, down)
        assert ledger.history("op-4")[-1][1] == "released"
        assert ledger.unsettled() == []  # nothing to reconcile: provably not sent


def test_a_released_key_takes_a_changed_request_and_sends_it_once(open_ledger, receiver, client):
    """Released is proven unsent: the key may carry another request (an edit after a refusal),
    sent once; confirmed, the key refuses any other request again."""
    from tools.local import free_port

    down = workflow.TicketClient(f"http://127.0.0.1:{free_port()}", attempts=1)  # no one there
    with open_ledger() as ledger:
        with pytest.raises(exitcodes.Unreachable):
            TICKET.perform(ledger, "op-4b", {"title": "one"}, down)
        before = posts(receiver)
        TICKET.perform(ledger, "op-4b", {"title": "two"}, client)
        assert ledger.history("op-4b")[-2][2] == "claimed: request changed while released"
        with pytest.raises(effects.Conflict, match="new key"):
            TICKET.perform(ledger, "op-4b", {"title": "three"}, client)
    assert posts(receiver) == before + 1
    assert [t["payload"]["title"] for t in client.tickets() if t["key"] == "op-4b"] == ["two"]


def test_the_same_key_with_another_request_is_a_conflict_and_sends_nothing(
    open_ledger, receiver, client
):
    with open_ledger() as ledger:
        TICKET.perform(ledger, "op-5", {"title": "one"}, client)
        before = posts(receiver)
        with pytest.raises(effects.Conflict, match="new key"):
            TICKET.perform(ledger, "op-5", {"title": "two"}, client)
    assert posts(receiver) == before


def test_a_receipt_is_never_overwritten_and_a_tampered_one_is_caught(open_ledger, receiver, client):
    with open_ledger() as ledger:
        TICKET.perform(ledger, "op-6", {"title": "t"}, client)
        with pytest.raises(Exception, match="never overwritten"):
            with ledger.transaction():
                ledger.sql("UPDATE effect_receipts SET answer = '{}'")
        postgres = isinstance(ledger, effects.PostgresLedger)
        with ledger.transaction():  # someone goes around the ledger
            ledger.sql("DROP TRIGGER receipts_are_kept" + " ON effect_receipts" * postgres)
            ledger.sql("""UPDATE effect_receipts SET answer = '{"ticket_id":99}'""")
        with pytest.raises(effects.LedgerError, match="integrity"):
            ledger.receipt("op-6")


def test_two_processes_making_a_new_ledger_at_once_both_open_it(tmp_path):
    """Two processes that open a ledger whose file does not exist yet, at the same moment (the
    second `start` of a new lab, a drill's crash runs): SQLite refuses one's switch to WAL at
    once ("database is locked", no busy wait), and Ledger.open waits it out. Forty pairs: a
    third of them met it when it did not."""
    failures = []
    for pair in range(examples(40)):  # a quarter in make test-fast
        path = tmp_path / f"new-{pair}.sqlite"
        results, done = os.pipe()
        children = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                os.close(results)
                try:
                    with effects.Ledger(path) as ledger:
                        ledger.claim("k", "ticket", {"k": 1})
                    os.write(done, b"ok\n")
                except BaseException as error:
                    os.write(done, f"{error!r}\n".encode())
                finally:
                    os._exit(0)
            children.append(pid)
        os.close(done)
        for pid in children:
            os.waitpid(pid, 0)
        with os.fdopen(results) as pipe:
            failures += [line for line in pipe.read().splitlines() if line != "ok"]
    assert failures == []


def test_two_processes_claiming_the_same_keys_take_one_fresh_claim_each(open_ledger):
    """The lookup and the insert of a claim are one step for other processes (SQLite's BEGIN
    IMMEDIATE; Postgres's INSERT ... ON CONFLICT, then FOR UPDATE). The two processes meet
    before every key (a byte each way through pipes), so their claims of it really overlap."""
    keys = [f"k{i}" for i in range(200)]
    with open_ledger() as ledger:  # the tables, before the race (a ledger connects lazily)
        ledger.unsettled()
    results, done = os.pipe()
    a_to_b, b_to_a = os.pipe(), os.pipe()
    children = []
    for me in range(2):
        send, recv = (a_to_b[1], b_to_a[0]) if me == 0 else (b_to_a[1], a_to_b[0])
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest, whatever happens
            fresh = 0
            for fd in {results, *a_to_b, *b_to_a} - {send, recv}:  # the other's ends: its
                os.close(fd)  # exit is then an end of file here, not a read that never ends
            try:
                with open_ledger(busy_timeout_s=30) as ledger:
                    for key in keys:
                        os.write(send, b"."), os.read(recv, 1)  # both at this key now
                        fresh += not ledger.claim(key, "ticket", {"k": key}).reopened
                os.write(done, f"{fresh}\n".encode())
            except BaseException as error:  # said on the pipe; the other child's read ends
                os.write(done, f"child {me}: {error!r}\n".encode())
            finally:
                os._exit(0)
        children.append(pid)
    for fd in (done, *a_to_b, *b_to_a):
        os.close(fd)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    with os.fdopen(results) as pipe:
        lines = pipe.read().splitlines()
    assert all(line.isdigit() for line in lines), lines  # no child met an error
    assert sum(map(int, lines)) == len(keys), lines  # each key claimed fresh exactly once


@pytest.mark.fast
def test_a_lookup_that_finds_nothing_before_the_settle_time_is_no_proof(tmp_path):
    """REVIEW A1: a keyless provider with a lookup commits after the client gave up. The lookup
    right after finds nothing; sending again then made a second charge. Now the run stops
    (Unsettled, naming where to look), and once the settle time has passed the charge is found
    and adopted: one charge."""
    from tests.property.test_ledger_machine import Provider, charge_effect

    provider = Provider()
    provider.settle_s = 5.0  # its commit bound, as the effect declares it
    try:
        with effects.Ledger(tmp_path / "l.sqlite") as ledger:
            effect = dataclass_copy(
                charge_effect(provider.url, keyed=False, lookup=True),
                settle_s=5.0,
                look_with="GET /charges?ref={key}",
            )
            # The provider holds the request it accepted (its gate) until the test lets it
            # commit: the client (0.05 s) gives up first, and the lookup right after finds
            # nothing, however slow the machine.
            provider.gate = gate = threading.Event()
            with pytest.raises(effects.Unsettled, match=r"look with GET /charges\?ref=a1"):
                effect.perform(ledger, "a1", {"amount": 1}, ledger)
            assert ledger.get("a1").state == "unknown"
            provider.gate = None
            gate.set()  # it commits now, within its bound
            provider.quiet()
            assert provider.ids("a1") == [1]  # the charge is there, late
            with pytest.raises(effects.Unsettled):  # found now: but had it not been...
                dataclass_copy(effect, lookup=None).perform(ledger, "a1", {"amount": 1}, ledger)
            done = effect.perform(ledger, "a1", {"amount": 1}, ledger)
            assert (done.how, done.answer) == ("adopted", {"charge_id": 1})
            assert provider.ids("a1") == [1]
    finally:
        provider.shutdown()
        provider.server_close()


@pytest.mark.fast
def test_a_second_live_process_on_sqlite_meets_in_flight_and_a_dead_ones_lock_is_gone(
    tmp_path, receiver, lab
):
    """REVIEW A2, A3, F2: a child process performs a key and is held at after-send (the
    receiver has made the ticket). The parent, a second live process on the same file: perform,
    reconcile and reconcile --confirmed meet InFlight and write nothing. Killed, the child's lock
    is gone at once, and the parent adopts the one ticket."""
    import failpoints

    db = tmp_path / "checkpoints.sqlite"
    pause = tmp_path / "held"
    client = workflow.TicketClient(receiver.url, attempts=1)
    pid = os.fork()
    if pid == 0:
        try:
            with failpoints.scoped({"after-send": f"pause({pause})"}), effects.Ledger(db) as ledger:
                TICKET.perform(ledger, "live", {"title": "t"}, client)
        finally:
            os._exit(1)
    try:
        wait_for(pause.exists)
        with effects.Ledger(db) as ledger:
            with pytest.raises(effects.InFlight):
                TICKET.perform(ledger, "live", {"title": "t"}, client)
            assert [now for _, now in effects.reconcile(ledger, {"ticket": TICKET}, client)] == [
                "in flight"
            ]
            env = {**lab, "CHECKPOINT_DB": str(db), "API_URL": receiver.url}
            code = workflow.main(["reconcile", "--confirmed", "live"], env)
            assert code == exitcodes.EXIT_THREAD and ledger.get("live").state == "requested"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with effects.Ledger(db) as ledger:
        done = TICKET.perform(ledger, "live", {"title": "t"}, client)
        assert done.how == "adopted" and len(client.tickets()) == 1


def wait_for(condition, timeout_s=10):

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the child never reached its failpoint"
        time.sleep(0.01)


def test_a_second_id_for_one_key_is_kept_and_shown(open_ledger, lab, capsys):
    """REVIEW A4 (item 4): a confirm that meets a receipt naming another id (a lost race, a
    lease taken over, a person's late word) keeps it as an extra, and reconcile shows it."""
    with open_ledger() as ledger:
        ledger.claim("twice", "ticket", {"title": "t"})
        ledger.confirm("twice", {"ticket_id": 1, "created": True}, 1, "answered")
        first = ledger.confirm("twice", {"ticket_id": 2, "created": True}, 2, "answered late")
        assert first["ticket_id"] == 1  # the receipt stands
        assert ledger.extras() == [("twice", "2", "answered late")]


@pytest.mark.fast
def test_a_wrong_address_does_nothing_and_leaves_the_key_usable(tmp_path, receiver):
    """REVIEW A9 (item 7): a 404 from a wrong API_URL is no refusal: the key is released, not
    failed, and sent once the address is right."""
    wrong = workflow.TicketClient(receiver.url + "/v2", attempts=1)
    with effects.Ledger(tmp_path / "c.sqlite") as ledger:
        with pytest.raises(urllib.error.HTTPError):
            TICKET.perform(ledger, "k404", {"title": "t"}, wrong)
        assert ledger.get("k404").state == "released"
        right = workflow.TicketClient(receiver.url, attempts=1)
        assert workflow.ticket.perform(ledger, "k404", {"title": "t"}, right).how == "sent"


@pytest.mark.fast
def test_a_ledger_file_made_before_the_lease_gets_its_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as old:  # main's effects table, before sent_at and the lease
        old.execute(effects.SCHEMA[0])  # ADDED_COLUMNS are not in it
        old.execute(
            "INSERT INTO effects (key, effect, request, request_hash, state, updated_at) "
            "VALUES ('old', 'ticket', '{}', 'h', 'unknown', 1.0)"
        )
    with effects.Ledger(path) as ledger:
        assert [r.key for r in ledger.unsettled()] == ["old"]
        ledger.move("old", "requested", "sent again")  # writes sent_at
        assert ledger.get("old").since_sent_s < 60


@pytest.mark.fast
def test_a_lease_keeps_a_second_performer_out_until_it_runs_out(tmp_path):
    """Two Ledgers on one file, as two live processes: while A holds the key, B meets InFlight;
    once A's lease has run out (LEDGER_LEASE_S, here 0) B goes on, and A's late answer, another
    id than B's receipt, is kept as an extra."""
    db = tmp_path / "c.sqlite"
    with effects.Ledger(db) as a, effects.Ledger(db) as b, effects.Ledger(db, lease_s=0.0) as c:
        with a.performing("k"):
            a.claim("k", "ticket", {"title": "t"})
            with pytest.raises(effects.InFlight), b.performing("k"):
                pass
        with c.performing("k"):  # a run longer than its lease: 0 s
            c.claim("k", "ticket", {"title": "t"})
            with b.performing("k"):  # goes on: the lease ran out
                b.confirm("k", {"ticket_id": 2}, 2, "answered")
            assert c.confirm("k", {"ticket_id": 1}, 1, "answered late") == {"ticket_id": 2}
        assert b.extras() == [("k", "1", "answered late")]


@pytest.mark.fast
def test_a_persons_not_sent_waits_out_the_settle_time_where_a_lookup_exists(tmp_path):
    """reconcile --not-sent on a keyless provider with a lookup: nothing found yet is no proof
    (the provider may commit late), so it is refused until settle_s has passed; then taken."""
    import types

    from tests.property.test_ledger_machine import Provider, charge_effect

    provider = Provider()
    try:
        effect = dataclasses.replace(charge_effect(provider.url, False, True), settle_s=30.0)
        db = tmp_path / "c.sqlite"
        with effects.Ledger(db) as ledger:
            ledger.claim("n1", "charge", {"amount": 1})
            ledger.move("n1", "unknown", "no answer: the test")
        settings = workflow.Settings.from_environ(
            {"API_URL": provider.url, "CHECKPOINT_DB": str(db)}
        )
        args = types.SimpleNamespace(confirmed=[], not_sent=["n1"], effects={"charge": effect})
        with pytest.raises(effects.WordRefused, match="may take 30 s to commit"):
            commandline.run_reconcile(args, settings)
        with effects.Ledger(db) as ledger:
            assert ledger.get("n1").state == "unknown"
        settled = dataclasses.replace(effect, settle_s=0.0)  # as if its settle time had passed
        args.effects = {"charge": settled}
        commandline.run_reconcile(args, settings)
        with effects.Ledger(db) as ledger:
            assert ledger.get("n1").state == "released"
    finally:
        provider.shutdown()
        provider.server_close()


@pytest.mark.fast
def test_lab_15_names_every_table_the_ledger_makes(tmp_path):
    """REVIEW F: lab 15 said three tables; the ledger makes five (effect_extras and
    effect_corrections too)."""
    import sqlite3

    from tools.local import ROOT

    db = tmp_path / "ledger.sqlite"
    with effects.open_ledger(str(db)) as ledger:
        ledger.claim("k", "ticket", {"title": "t"})  # the ledger at work: every table there
    with sqlite3.connect(db) as conn:
        made = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    guide = (ROOT / "labs" / "15-the-ledger.md").read_text(encoding="utf-8")
    (said,) = re.findall(r"The ledger's (\w+) tables \(([^)]*)\)", guide)
    named = set(re.findall(r"`(\w+)`", said[1]))
    assert named == made, (named, made)
    assert said[0] == {3: "three", 4: "four", 5: "five"}.get(len(made)), said[0]
    # REVIEW F: it named workflow.open_postgres; the function is checkpoints.py's
    assert "`open_postgres` (`checkpoints.py`)" in guide and callable(checkpoints.open_postgres)


@pytest.mark.fast
def test_lab_15_names_the_labs_that_ran_the_ledger_before_it():
    """REVIEW F: lab 15's list of the earlier labs that used the ledger (07 and 13 said so; 11
    was not named). Those it says said so name the ledger in their prose; lab 04's drill table
    has a ledger column; those it says ran it without saying so start a run in the default
    mode (no --mode: labs/modes.py's default, ledger) and name no ledger outside their output."""
    from tools.local import ROOT
    from tools.runner import parse_guide

    guide = " ".join((ROOT / "labs" / "15-the-ledger.md").read_text(encoding="utf-8").split())
    (said,) = re.findall(
        r"Labs ([\d, and]+) ran their effects through this ledger and said so", guide
    )
    (drilled,) = re.findall(r"Lab (\d\d)'s drill ran it as one of its four modes", guide)
    (silent,) = re.findall(r"Labs ([\d, and]+) ran in its default `--mode ledger` without", guide)

    def text(number):
        (path,) = (ROOT / "labs").glob(f"{number}-*.md")
        return path.read_text(encoding="utf-8")

    def prose(number):  # the guide without its console blocks (their output names the mode)
        return re.sub(r"```console\n.*?```", "", text(number), flags=re.S)

    for number in re.findall(r"\d\d", said):
        assert "ledger" in prose(number).lower(), number
    assert "| ledger |" in text(drilled)
    for number in re.findall(r"\d\d", silent):
        starts = [s.command for s in parse_guide(text(number)) if " workflow start " in s.command]
        assert any("--mode" not in command for command in starts), number
        assert "--mode ledger" not in prose(number) and "ledger mode" not in prose(number), number


@pytest.mark.fast
def test_a_correction_is_kept_beside_the_receipt_and_a_forged_one_is_damage(tmp_path):
    """reconcile --correct's record (corrections.py): the receipt reads the new answer, the
    person's first one stays in effect_receipts, a correction is never changed or deleted, and
    one written outside this program (no integrity hash of it) makes the key Damaged (exit 7)."""
    import sqlite3

    import corrections

    with effects.open_ledger(str(tmp_path / "ledger.sqlite")) as ledger:
        ledger.claim("k", "message", {"to": "a"})
        ledger.settle("k", "a person: reconcile --confirmed", {"message_id": 7}, 7)
        assert corrections.correct(ledger, "k", {"message_id": 1}, 1, "a person") == "7"
        assert ledger.get("k").answer == {"message_id": 1}
        kept = ledger.sql("SELECT external_id FROM effect_receipts WHERE key = 'k'").fetchall()
        assert [tuple(row) for row in kept] == [("7",)]
        for change in (
            "UPDATE effect_corrections SET external_id = '9'",
            "DELETE FROM effect_corrections",
        ):
            with pytest.raises(sqlite3.DatabaseError, match="a correction is never"):
                ledger.sql(change)
        ledger.sql(
            "INSERT INTO effect_corrections (key, was_id, external_id, answer, who, integrity, at) "
            """VALUES ('k', '1', '9', '{"message_id":9}', 'someone', 'forged', 0)"""
        )
        with pytest.raises(effects.Damaged, match="a correction of 'k' does not match"):
            ledger.get("k")
