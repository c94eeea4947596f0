"""What a provider's answers mean, declared once per provider (providers.Provider): a keyed card
provider that behaves as the IETF Idempotency-Key draft says (409 while a request under the key
is still being processed, 422 for the key with another body), as a real loopback HTTP server in
this process, against the real ledger on SQLite; killed while its request is at the provider,
and a person's word that comes before the provider's settle time.

The provider holds a request until the test lets it commit (a gate): "still at the provider" is
a state the test sets, not a timing it hopes for.
"""

import http.server
import json
import os
import signal
import threading
import time
import types
import urllib.error

import pytest

import commandline
import effects
import exitcodes
import hints
import providers
import workflow

GIVES_UP_S = 0.3  # the client's timeout: the gate holds the first request past it
HANG_GUARD_S = 30.0  # a wait that fails the test, never one that times it
SMS_SETTLE_S = 1.0  # the SMS provider's settle time: the reconcile asked at once falls inside it
#                     (milliseconds after the send) and --wait waits the rest (3 s before: 6 s of
#                     make test-fast's 3 workers for the same two checks)


class Card(http.server.ThreadingHTTPServer):
    """POST /charges under an Idempotency-Key, as the draft says: the first request is held at
    the gate while `hold` is set, and a retry meanwhile is answered 409 (in progress); once
    committed, a retry with the same body gets the first charge (200), another body 422."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), CardHandler)
        self.url = f"http://127.0.0.1:{self.server_port}"
        self.lock = threading.Lock()
        self.keys = {}  # key -> {"body", "charge" (None while in progress)}
        self.charges = 0
        self.hold = threading.Event()  # set: a first request waits at the gate
        self.gate = threading.Event()
        self.arrived = threading.Event()
        # polled every 50 ms: shutdown() at the fixture's end waits one poll (0.5 s by default)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def handle_error(self, request, client_address):
        pass  # a client that gave up before the answer


class CardHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        card, key = self.server, self.headers["Idempotency-Key"]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with card.lock:
            seen = card.keys.get(key)
            if seen is not None and seen["body"] != body:
                return self.answer(422, {"title": "Idempotency-Key is already used"})
            if seen is not None and seen["charge"] is None:
                return self.answer(409, {"title": "A request is outstanding for this key"})
            if seen is not None:
                return self.answer(200, seen["charge"])
            card.keys[key] = seen = {"body": body, "charge": None}
            held = card.hold.is_set()
        if held:
            card.arrived.set()
            card.gate.wait(HANG_GUARD_S)
        with card.lock:
            card.charges += 1
            seen["charge"] = {"charge_id": card.charges, **body}
        self.answer(201, seen["charge"])

    def answer(self, status, body):
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass


class CardClient(providers.HttpClient):
    def charge(self, amount, key):
        return self.call("/charges", {"amount": amount}, key)


@pytest.fixture
def card():
    server = Card()
    yield server
    server.gate.set()
    server.shutdown()
    server.server_close()


def declared(card, settle_s=30.0):
    """The card provider as a copier declares it: keyed, the draft's answers (the default)."""
    provider = providers.Provider(
        "CARD", url=card.url, client_class=CardClient, keyed=True, settle_s=settle_s
    )
    effect = effects.Effect(
        "charge",
        provider=provider,
        send=lambda client, request, key: client.charge(request["amount"], key),
        external_id=lambda answer: answer["charge_id"],
        answer_of=lambda charge_id: {"charge_id": int(charge_id)},
    )
    client = CardClient(card.url, GIVES_UP_S, 1, name="CARD")
    return effect, client


@pytest.mark.fast
def test_in_progress_on_the_first_send_leaves_the_effect_unknown_and_a_later_resume_adopts(
    card, tmp_path
):
    effect, client = declared(card)
    card.hold.set()  # the first request is held past the client's timeout; the resend meets 409
    with effects.Ledger(tmp_path / "c.sqlite") as ledger:
        with pytest.raises(effects.Unsettled) as stopped:
            effect.perform(ledger, "order-1:charge", {"amount": 5}, client)
        record = ledger.get("order-1:charge")
        assert record.state == "unknown", ledger.history("order-1:charge")
        assert "CARD honours the key" in str(stopped.value), stopped.value
        assert "409" in str(stopped.value) and "then once 30 s have passed" in str(stopped.value)
        card.hold.clear()
        card.gate.set()  # the provider commits the held request
        wait_for(lambda: card.charges == 1, "the held charge to commit")
        done = effect.perform(ledger, "order-1:charge", {"amount": 5}, client)
    assert (done.how, done.answer["charge_id"], card.charges) == ("sent", 1, 1)


@pytest.mark.fast
def test_killed_while_the_charge_is_at_the_provider_the_resume_is_never_failed(card, tmp_path):
    effect, client = declared(card)
    db = tmp_path / "c.sqlite"
    card.hold.set()
    pid = os.fork()
    if pid == 0:  # a run whose request reaches the provider, killed there
        try:
            with effects.Ledger(db) as ledger:
                effect.perform(ledger, "order-2:charge", {"amount": 5}, client)
        finally:
            os._exit(1)
    assert card.arrived.wait(HANG_GUARD_S), "the request never reached the provider"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    card.hold.clear()
    with effects.Ledger(db) as ledger:  # the resume: the provider still holds the request
        with pytest.raises(effects.Unsettled):
            effect.perform(ledger, "order-2:charge", {"amount": 5}, client)
        assert ledger.get("order-2:charge").state == "unknown"  # not failed: it may be made
        assert ledger.unsettled()[0].key == "order-2:charge"  # reconcile shows it
        card.gate.set()
        wait_for(lambda: card.charges == 1, "the held charge to commit")
        done = effect.perform(ledger, "order-2:charge", {"amount": 5}, client)
        assert ledger.get("order-2:charge").state == "confirmed"
    assert (done.answer["charge_id"], card.charges) == (1, 1)  # one charge, the run finishes


@pytest.mark.fast
def test_a_422_for_the_key_with_another_body_is_a_refusal_with_its_reason(card, tmp_path):
    effect, client = declared(card)
    with effects.Ledger(tmp_path / "c.sqlite") as ledger:
        effect.perform(ledger, "k", {"amount": 5}, client)
        with pytest.raises(effects.Refused) as refused:
            effect.perform(ledger, "k-other", {"amount": 6}, keyed_as(client, "k"))
        assert refused.value.refusal["status"] == 422
        assert ledger.get("k-other").state == "failed"
    assert card.charges == 1


@pytest.mark.fast
def test_the_lab_receiver_declares_its_409_a_refusal_where_the_draft_default_does_not():
    conflict = http_error(409, {"error": "key used for another body"})
    assert providers.IETF_ANSWERS.refused(conflict) is None  # in progress: unknown
    assert workflow.ticket.refused(conflict) == {
        "status": 409,
        "error": "key used for another body",
    }
    mismatch = http_error(422, {"title": "Idempotency-Key is already used"})
    assert providers.IETF_ANSWERS.refused(mismatch)["status"] == 422
    assert not providers.IETF_ANSWERS.not_sent(http_error(503, {}))  # a 5xx may have committed


@pytest.mark.fast
@pytest.mark.parametrize("word", ["not-sent", "confirmed"])
def test_a_persons_word_waits_for_the_settle_time_whatever_the_provider(card, tmp_path, word):
    """A provider with no lookup (the SMS of the review): a person's --not-sent 1.9 s after the
    send was taken while the request was still at the provider, and the resume sent again. Now:
    refused, one line with when to try again; --wait takes it once the settle time is over."""
    sms = effects.Effect(
        "sms",
        provider=providers.Provider("SMS", url=card.url, settle_s=SMS_SETTLE_S),
        send=lambda client, request, key: client.call("/sms", request),
        external_id=lambda answer: answer["sms_id"],
        answer_of=lambda sms_id: {"sms_id": int(sms_id)},
    )
    db = tmp_path / "c.sqlite"
    with effects.Ledger(db) as ledger:
        ledger.claim("order-3:sms", "sms", {"to": "+1"})
        ledger.move("order-3:sms", "unknown", "no answer: the test")
    settings = commandline.ProgramSettings(checkpoint_db=str(db), providers=(sms.provider,))
    given = (["order-3:sms=7"], []) if word == "confirmed" else ([], ["order-3:sms"])
    args = types.SimpleNamespace(
        confirmed=given[0], not_sent=given[1], effects={"sms": sms}, wait=False
    )
    with effects.Ledger(db) as ledger:
        sent_at = ledger.row("order-3:sms")["sent_at"]
    try:
        commandline.run_reconcile(args, settings)
        refused = None
    except effects.WordRefused as error:  # a person's word not taken yet
        refused = error
    if time.time() - sent_at < SMS_SETTLE_S:  # asked inside the settle time (measured, not assumed)
        line = str(refused)
        assert commandline.ledger_exit(refused) == exitcodes.EXIT_THREAD and "\n" not in line
        assert f"SMS may take {SMS_SETTLE_S:g} s to commit" in line and "try again in " in line, (
            line
        )
        with effects.Ledger(db) as ledger:
            assert ledger.get("order-3:sms").state == "unknown"  # nothing settled
    if refused is not None:  # --wait: taken once the settle time is over
        args.wait = True
        commandline.run_reconcile(args, settings)
    with effects.Ledger(db) as ledger:
        record = ledger.get("order-3:sms")
        assert record.state == ("confirmed" if word == "confirmed" else "released")
        assert record.since_sent_s >= SMS_SETTLE_S


# helpers


def keyed_as(client, key):
    """client, sending every request under key (another operation reusing a key)."""

    class Reusing(CardClient):
        def charge(self, amount, _):
            return super().charge(amount, key)

    return Reusing(client.url, client.timeout_s, 1, name="CARD")


def http_error(status, body):
    import io

    return urllib.error.HTTPError(
        "http://x/", status, "x", {}, io.BytesIO(json.dumps(body).encode())
    )


def wait_for(condition, what):
    done = threading.Event()
    deadline = threading.Timer(HANG_GUARD_S, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.is_set(), f"waited {HANG_GUARD_S} s for {what}"
            done.wait(0.01)
    finally:
        deadline.cancel()


@pytest.mark.fast
def test_an_error_answer_of_someone_elses_service_is_named_by_its_provider(capsys):
    card = providers.Provider("CARD", url="http://127.0.0.1:9/pay")
    settings = commandline.ProgramSettings(providers=(card,))
    args = types.SimpleNamespace(prog="workflow.py", graph_command=False)
    error = http_error(404, {"error": "no such route"})
    error.provider = "CARD"
    assert hints.report_http_error(args, settings, error) == exitcodes.EXIT_HTTP_ERROR
    err = capsys.readouterr().err
    assert err == (
        "workflow.py: CARD at CARD_URL http://127.0.0.1:9/pay answered 404; nothing was made, "
        "and the key is still free\n"
    )
    assert "receiver" not in err
