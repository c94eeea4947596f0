"""An effect over SMTP: a provider declared with its own client (smtpclient.SmtpClient), its own
"not sent" and "refused" rules, against a real SMTP server (aiosmtpd) on a loopback port, and
the real ledger on SQLite. The message carries its key as Message-ID, what a person looks for.
"""

import asyncio
import threading
import time
import types

import pytest

import commandline
import effects
import exitcodes
import providers
import smtpclient
from tools.local import free_port

HANG_GUARD_S = 30.0


class Mailbox:
    """aiosmtpd's handler: what it took, and its faults (an RCPT reply, a DATA reply held until
    the test lets it go)."""

    def __init__(self):
        self.messages, self.rcpt_reply, self.hold = [], None, None

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.rcpt_reply:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope.content.decode())  # taken: it is in the mailbox
        if self.hold is not None:  # its reply comes after the client gave up
            await asyncio.get_running_loop().run_in_executor(None, self.hold.wait, HANG_GUARD_S)
        return "250 Message accepted for delivery"


@pytest.fixture
def mailbox():
    from aiosmtpd.controller import Controller

    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=free_port())
    controller.start()
    box.url = f"smtp://127.0.0.1:{controller.port}"
    yield box
    if box.hold is not None:
        box.hold.set()
    controller.stop()


def mail_provider(url, settle_s=smtpclient.SETTLE_S):
    return providers.Provider(
        "MAIL",
        url=url,
        client_class=smtpclient.SmtpClient,
        timeout_s=0.5,
        settle_s=settle_s,
        answers=smtpclient.ANSWERS,
    )


def email_effect(provider):
    return effects.Effect(
        "email",
        provider=provider,
        send=lambda client, request, key: client.mail(
            "orders@example.com", request["to"], "Order shipped", request["text"], key
        ),
        external_id=lambda answer: answer["message_id"],
        answer_of=lambda message_id: {"message_id": message_id, "to": "a@example.com"},
        look_with="the mailbox, for the Message-ID smtpclient.message_id({key})",
    )


REQUEST = {"to": "a@example.com", "text": "Your order is on its way"}


@pytest.mark.fast
def test_mail_url_takes_smtp_for_an_smtp_provider_and_a_bad_one_names_it():
    declared = mail_provider("smtp://127.0.0.1:25")
    configured = declared.configured({"MAIL_URL": "smtp://127.0.0.1:2525"})
    assert configured.url == "smtp://127.0.0.1:2525"
    with pytest.raises(exitcodes.UserError) as bad:
        declared.configured({"MAIL_URL": "http://127.0.0.1:2525"})
    assert "MAIL_URL 'http://127.0.0.1:2525' is not an address of MAIL (smtp)" in str(bad.value)


@pytest.mark.fast
def test_an_email_is_sent_once_with_its_key_as_message_id(mailbox, tmp_path):
    provider = mail_provider(mailbox.url)
    email = email_effect(provider)
    with effects.Ledger(tmp_path / "l.sqlite") as ledger:
        done = email.perform(ledger, "order-1:mail", REQUEST, provider.client())
        again = email.perform(ledger, "order-1:mail", REQUEST, provider.client())
    assert (done.how, again.how) == ("sent", "receipt")
    (message,) = mailbox.messages
    assert f"Message-ID: {smtpclient.message_id('order-1:mail')}" in message
    assert done.answer["message_id"] == "<order-1%3Amail@ledger.invalid>"


@pytest.mark.fast
def test_a_refused_connection_is_not_sent_and_names_the_provider(tmp_path):
    provider = mail_provider(f"smtp://127.0.0.1:{free_port()}")  # nothing listens there
    with effects.Ledger(tmp_path / "l.sqlite") as ledger:
        with pytest.raises(exitcodes.Unreachable, match="cannot reach MAIL at smtp://127.0.0.1:"):
            email_effect(provider).perform(ledger, "k", REQUEST, provider.client())
        assert ledger.get("k").state == "released"  # the key is free: nothing left


@pytest.mark.fast
@pytest.mark.parametrize(
    "reply, state", [("550 5.1.1 No such user", "failed"), ("451 4.3.0 Try later", "released")]
)
def test_a_permanent_no_is_a_refusal_and_a_transient_one_sends_nothing(
    mailbox, tmp_path, reply, state
):
    mailbox.rcpt_reply = reply
    provider = mail_provider(mailbox.url)
    with effects.Ledger(tmp_path / "l.sqlite") as ledger:
        with pytest.raises(effects.Refused if state == "failed" else Exception) as raised:
            email_effect(provider).perform(ledger, "k", REQUEST, provider.client())
        record = ledger.get("k")
    assert record.state == state and mailbox.messages == []
    if state == "failed":
        assert raised.value.refusal == {"status": 550, "error": "5.1.1 No such user"}


@pytest.mark.fast
def test_no_reply_after_the_data_is_unknown_and_a_persons_word_waits_for_the_settle_time(
    mailbox, tmp_path
):
    mailbox.hold = threading.Event()  # the server takes the message; its reply comes late
    provider = mail_provider(mailbox.url, settle_s=1.0)
    email = email_effect(provider)
    db = tmp_path / "l.sqlite"
    with effects.Ledger(db) as ledger:
        with pytest.raises(effects.Unsettled) as stopped:
            email.perform(ledger, "order-2:mail", REQUEST, provider.client())
        assert ledger.get("order-2:mail").state == "unknown"  # it may have been taken
    assert "MAIL has no lookup" in str(stopped.value), stopped.value
    mailbox.hold.set()
    (message,) = mailbox.messages  # a person searches the mailbox for its Message-ID
    found = smtpclient.message_id("order-2:mail")
    assert f"Message-ID: {found}" in message
    settings = commandline.ProgramSettings(checkpoint_db=str(db), providers=(provider,))
    args = types.SimpleNamespace(
        confirmed=[f"order-2:mail={found}"], not_sent=[], effects={"email": email}, wait=False
    )
    with effects.Ledger(db) as ledger:
        sent_at = ledger.row("order-2:mail")["sent_at"]
    try:
        commandline.run_reconcile(args, settings)
        refused = ""
    except effects.WordRefused as error:  # a person's word not taken yet
        refused = str(error)
    if time.time() - sent_at < 1.0:  # asked inside the settle time (measured, not assumed)
        assert "MAIL may take 1 s to commit" in refused, refused
    if refused:  # --wait: settled once the settle time is over
        args.wait = True
        commandline.run_reconcile(args, settings)
    with effects.Ledger(db) as ledger:
        done = email.perform(ledger, "order-2:mail", REQUEST, provider.client())
    assert (done.how, done.answer["message_id"]) == ("receipt", found)
    assert len(mailbox.messages) == 1  # one email
