"""The ledger's promise under any sequence and timing: one effect per key, no receipt lost.

A hypothesis state machine drives the ledger's public API (Effect.perform, effects.reconcile,
Ledger.performing and Ledger.settle as reconcile's --confirmed and --not-sent use them) with two
performers (two Ledger connections on one database, SQLite or Postgres) against a real provider:
a loopback HTTP server in this process (http.server in threads; the thing under test is the
ledger). The provider can be slow to commit (it commits DELAY_S after accepting, past the
client's timeout), drop its answer after committing, refuse, hold a request while the other
performer tries the same key; per example it is keyed (a repeated Idempotency-Key is answered
with the first charge) or keyless, with a lookup by our key or without one.

The model it relies on, and enforces: the provider commits a request before its deadline,
SETTLE_S after the ledger recorded the send (the row's sent_at, sent with the request), or
never, as a real provider's request deadline behaves; the effect declares that settle_s. A
request delayed past it (a slow commit, a held one, a machine under load) is dropped, not
committed late: so no scheduling makes the ledger's "nothing found SETTLE_S after the send"
untrue, and the outcome does not depend on the machine's load.

What must hold, the provider's own records deciding:
- at most one charge per key, unless a person said --not-sent while the provider held one;
- a receipt names a charge the provider made under its key; a key whose row says failed, or
  released, has none (but after a careless --not-sent);
- a second performer of a key whose request is out meets InFlight, never a second send;
- no exception but the ledger's own (effects.LedgerError) and the transport's (no answer).
"""

import http.client
import http.server
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import examples
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import effects

TIMEOUT_S = 0.05  # the client gives up after this
DELAY_S = 0.1  # a slow provider commits this long after accepting: past the client's timeout
SETTLE_S = 0.15  # what the effect declares: the provider commits within it
KEYS = ("k0", "k1")
KINDS = {  # (keyed, has a lookup)
    "keyed with lookup": (True, True),
    "keyless with lookup": (False, True),
    "keyless, no lookup": (False, False),
}
ALLOWED = (effects.LedgerError, OSError, http.client.HTTPException)  # no answer: OSError's


class Provider(http.server.ThreadingHTTPServer):
    """POST /charges (Idempotency-Key: our key) and GET /charges?ref=KEY."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Charges)
        self.url = f"http://127.0.0.1:{self.server_port}"
        self.lock = threading.Condition()
        self.charges = {}  # key -> [charge ids], committed
        self.pending = {}  # key -> [the deadline of each request accepted, not yet committed]
        self.keyed, self.fault, self.gate, self.arrived = False, {}, None, threading.Event()
        self.held = False  # a request waits at the gate
        self.settle_s = SETTLE_S  # it commits within this after the send, or never
        # polled every 50 ms: shutdown() at the fixture's end waits one poll (0.5 s by default)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def handle_error(self, request, client_address):
        pass  # a client that gave up: not the provider's failure

    def made(self, key):
        """How many charges key has made or may still make (a pending one before its deadline)."""
        with self.lock:
            committed = len(self.charges.get(key, []))
            now = time.time()
            pending = sum(deadline > now for deadline in self.pending.get(key, []))
            if self.keyed:
                return min(1, committed + pending)
            return committed + pending

    def ids(self, key):
        with self.lock:
            return list(self.charges.get(key, []))

    def quiet(self):
        """Once every accepted request has committed: the provider's records are whole."""
        with self.lock:
            self.lock.wait_for(lambda: not any(self.pending.values()), timeout=10)


class Charges(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        key = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["ref"][0]
        self.answer(200, {"charges": self.server.ids(key)})

    def do_POST(self):
        server, key = self.server, self.headers["Idempotency-Key"]
        self.rfile.read(int(self.headers["Content-Length"]))
        with server.lock:
            fault, server.fault = server.fault, {}  # one request meets the fault
            gate = server.gate
            if fault.get("refuse"):
                return self.answer(409, {"error": "card declined"})
            deadline = float(self.headers["X-Sent-At"]) + server.settle_s  # the commit bound
            server.pending.setdefault(key, []).append(deadline)
        if gate is not None:
            server.held = True
            server.arrived.set()
            gate.wait(10)
        time.sleep(fault.get("delay", 0.0))  # accepted, committed later (an input, not a wait)
        with server.lock:
            server.pending[key].remove(deadline)
            server.lock.notify_all()
            if time.time() >= deadline:  # past its deadline: never committed (a 504, say)
                self.close_connection = True
                return
            made = server.charges.setdefault(key, [])
            if not (server.keyed and made):
                made.append(sum(map(len, server.charges.values())) + 1)
            charge = made[0] if server.keyed else made[-1]
            server.lock.notify_all()
        if fault.get("drop"):
            self.close_connection = True
            return  # committed, and no answer
        with_reason = {"charge_id": charge}
        self.answer(201, with_reason)

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client gave up before the answer: it is lost, as on a network
            pass


def post(url, request, key, sent_at):
    data = json.dumps(request).encode()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    headers["X-Sent-At"] = repr(sent_at)  # the ledger's record of the send: the deadline's start
    sent = urllib.request.Request(url + "/charges", data=data, headers=headers)
    with urllib.request.urlopen(sent, timeout=TIMEOUT_S) as response:
        return json.load(response)


def charge_effect(url, keyed, lookup):
    def looked_up(client, key):
        query = urllib.parse.urlencode({"ref": key})
        with urllib.request.urlopen(f"{url}/charges?{query}", timeout=5) as response:
            found = json.load(response)["charges"]
        return {"charge_id": found[0]} if found else None

    return effects.Effect(
        "charge",
        send=lambda ledger, request, key: post(url, request, key, ledger.row(key)["sent_at"]),
        external_id=lambda answer: answer["charge_id"],
        lookup=looked_up if lookup else None,
        not_sent=lambda error: (
            isinstance(error, urllib.error.URLError)
            and isinstance(error.reason, ConnectionRefusedError)
        ),
        refused=lambda error: (
            {"status": 409}
            if isinstance(error, urllib.error.HTTPError) and error.code == 409
            else None
        ),
        keyed=keyed,
        settle_s=SETTLE_S,
        answer_of=lambda charge_id: {"charge_id": int(charge_id)},
    )


class LedgerMachine(RuleBasedStateMachine):
    provider = None  # set by the test
    open_ledger = None  # () -> a new Ledger on the test's database
    examples = 0

    def __init__(self):
        super().__init__()
        type(self).examples += 1
        self.prefix = f"e{self.examples}:"  # this example's keys: the database is shared
        self.ledgers = [type(self).open_ledger(), type(self).open_ledger()]
        self.careless = set()  # keys a person said --not-sent for while the provider held one

    def key(self, name):
        return self.prefix + name

    @initialize(kind=st.sampled_from(sorted(KINDS)))
    def provider_kind(self, kind):
        self.provider.quiet()
        keyed, lookup = KINDS[kind]
        self.provider.keyed = keyed
        self.effect = charge_effect(self.provider.url, keyed, lookup)

    @rule(
        who=st.sampled_from([0, 1]),
        key=st.sampled_from(KEYS),
        slow=st.booleans(),
        drop=st.booleans(),
        refuse=st.booleans(),
    )
    def perform(self, who, key, slow, drop, refuse):
        self.provider.fault = {"delay": DELAY_S * slow, "drop": drop, "refuse": refuse and drop}
        try:
            ledger = self.ledgers[who]  # also the client: the send reads the row's sent_at
            self.effect.perform(ledger, self.key(key), {"amount": 1}, ledger)
        except ALLOWED:
            pass
        finally:
            self.provider.fault = {}

    @rule(key=st.sampled_from(KEYS))
    def two_performers_at_once(self, key):
        """A's request is held at the provider; B, a live process of its own, tries the key."""
        key = self.key(key)
        gate, self.provider.gate = threading.Event(), None
        self.provider.arrived.clear()
        self.provider.held = False
        self.provider.gate = gate
        first = threading.Thread(target=self.perform_quietly, args=(self.ledgers[0], key))
        first.start()
        self.provider.arrived.wait(10)  # A's request is at the provider, or A has finished
        self.provider.gate = None  # without sending (a receipt, a refusal, an unknown row)
        try:
            if self.provider.held:  # A's request is out: B must not send
                with pytest.raises(effects.InFlight):
                    self.effect.perform(self.ledgers[1], key, {"amount": 1}, self.ledgers[1])
        finally:
            gate.set()
            first.join()

    def perform_quietly(self, ledger, key):
        try:
            self.effect.perform(ledger, key, {"amount": 1}, ledger)
        except ALLOWED:
            pass
        finally:
            self.provider.arrived.set()

    @rule()
    def time_passes(self):
        """The settle time goes by: every accepted request has committed since."""
        self.provider.quiet()
        time.sleep(SETTLE_S)

    @rule(who=st.sampled_from([0, 1]))
    def reconcile(self, who):
        effects.reconcile(self.ledgers[who], {"charge": self.effect}, None)

    @rule(key=st.sampled_from(KEYS), careful=st.booleans())
    def a_person_settles(self, key, careful):
        """reconcile --confirmed KEY=ID or --not-sent KEY, as a person who looked says (careful:
        after the provider's records are whole), or --not-sent without looking."""
        key, ledger = self.key(key), self.ledgers[0]
        if careful:
            self.provider.quiet()
        held = self.provider.ids(key)
        with ledger.performing(key):
            if (record := ledger.get(key)) is None or record.state not in effects.OPEN:
                return
            if careful and held:
                ledger.settle(key, "a person", {"charge_id": held[0]}, held[0])
            else:
                self.careless |= {key} if held or self.provider.made(key) else set()
                ledger.settle(key, "a person")

    @invariant()
    def one_charge_per_key(self):
        for name in KEYS:
            key = self.key(name)
            if key not in self.careless:
                assert self.provider.made(key) <= 1, (key, self.provider.ids(key))

    @invariant()
    def the_ledger_agrees_with_the_provider(self):
        for name in KEYS:
            key = self.key(name)
            if (record := self.ledgers[0].get(key)) is None:
                continue
            made = self.provider.ids(key)
            if record.state == "confirmed":
                receipt = self.ledgers[0].receipt(key)
                assert int(receipt["external_id"]) in made, (key, receipt, made)
            if record.state in ("failed", "released") and key not in self.careless:
                assert self.provider.made(key) == 0, (key, record, made)

    def teardown(self):
        self.provider.quiet()
        self.one_charge_per_key()
        for name in KEYS:  # every charge is the receipt or a kept extra, once it is confirmed
            key = self.key(name)
            if key in self.careless:  # the person's word made the second one: not the ledger
                continue
            if (record := self.ledgers[0].get(key)) and record.state == "confirmed":
                kept = {self.ledgers[0].receipt(key)["external_id"]}
                kept |= {e for k, e, _ in self.ledgers[0].extras() if k == key}
                assert {str(i) for i in self.provider.ids(key)} <= kept, (key, kept)
        for ledger in self.ledgers:
            ledger.close()


SETTINGS = settings(
    max_examples=examples(10),
    stateful_step_count=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture
def provider():
    server = Provider()
    yield server
    server.gate = None
    server.shutdown()
    server.server_close()


def run_machine(provider, open_ledger, examples=SETTINGS.max_examples):
    machine = type("Machine", (LedgerMachine,), {"provider": provider})
    machine.open_ledger = staticmethod(open_ledger)
    run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=examples))


def test_the_ledger_keeps_its_promise_on_sqlite(provider, tmp_path):
    run_machine(provider, lambda: effects.Ledger(tmp_path / "ledger.sqlite"))


def test_the_ledger_keeps_its_promise_on_postgres(provider, database):
    import psycopg
    from psycopg.rows import dict_row

    def opened():  # on a database of the test's own, in the process's cluster (conftest)
        conn = psycopg.connect(database, autocommit=True, row_factory=dict_row)
        ledger = effects.PostgresLedger(conn)
        ledger.close = conn.close
        return ledger

    run_machine(provider, opened, examples=6)  # the same code but the lock: fewer


@pytest.mark.fast
def test_the_provider_keeps_its_commit_bound_however_late_its_thread_runs(provider, tmp_path):
    """The model above, enforced: a commit held past its deadline (as a loaded machine holds a
    thread) is dropped, so the ledger's resend once the settle time is over makes the one
    charge. Without the bound the held request commits late: two charges for one key."""
    effect = charge_effect(provider.url, keyed=False, lookup=True)
    with effects.Ledger(tmp_path / "l.sqlite") as ledger:
        provider.fault = {"delay": 3 * SETTLE_S}  # its commit comes long after the deadline
        with pytest.raises(effects.Unsettled):
            effect.perform(ledger, "k", {"amount": 1}, ledger)
        provider.quiet()  # the held request reached its commit: past its deadline, dropped
        assert provider.ids("k") == []
        while ledger.get("k").since_sent_s < SETTLE_S:  # the settle time passes (an input)
            time.sleep(0.01)
        done = effect.perform(ledger, "k", {"amount": 1}, ledger)
    provider.quiet()
    assert done.how == "sent" and provider.ids("k") == [1]
