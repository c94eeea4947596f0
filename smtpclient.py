"""An SMTP provider for the ledger: a protocol other than HTTP, declared as any provider is.

    MAIL = providers.Provider(
        "MAIL", url="smtp://127.0.0.1:8025", client_class=smtpclient.SmtpClient,
        settle_s=smtpclient.SETTLE_S, answers=smtpclient.ANSWERS,
    )

MAIL_URL (smtp://HOST:PORT), MAIL_TIMEOUT_S and MAIL_ATTEMPTS are its settings, as for HTTP.
An email takes no idempotency key and nothing can be asked about it afterwards (a keyless
provider without a lookup): the key goes out as the message's Message-ID, what a person
searches the mailbox (or the server's log) for before `reconcile --confirmed KEY=ID`.

What its answers mean (ANSWERS), from RFC 5321: nothing was sent when the connection was
refused, or the server answered a transient 4yz before it took the message (at MAIL, RCPT or
the end of DATA: "the requested action was not taken"); a permanent 5yz there is a refusal
(a wrong address), with its code and text. A timeout or a dropped connection after the end of
DATA is unknown: the server may have taken it (RFC 5321 4.5.3.2.6 gives the client 10 minutes
to wait for that reply: SETTLE_S).
Standard library only (smtplib, email).
"""

import dataclasses
import email.message
import smtplib
import socket
import urllib.parse

import exitcodes
import providers

SETTLE_S = 600.0  # RFC 5321 4.5.3.2.6, DATA termination: the client waits 10 minutes
DOMAIN = "ledger.invalid"  # the right side of a Message-ID we make


class SmtpClient:
    """A provider's SMTP client: one connection per message (smtplib), the key as Message-ID."""

    schemes = ("smtp",)  # what {NAME}_URL may say (providers.checked_url)

    def __init__(self, url, timeout_s=providers.TIMEOUT_S, attempts=1, headers=None, name="MAIL"):
        parts = urllib.parse.urlsplit(url)
        self.url, self.host, self.port = url, parts.hostname, parts.port or 25
        self.timeout_s, self.name, self.label = timeout_s, name, name

    def mail(self, sender, to, subject, text, key):
        """Send one message; {"message_id", "to"}: what the server took. A refused connection
        is exitcodes.Unreachable (nothing left); smtplib's errors otherwise (ANSWERS)."""
        message = email.message.EmailMessage()
        message["From"], message["To"], message["Subject"] = sender, to, subject
        message["Message-ID"] = message_id(key)
        message.set_content(text)
        try:
            server = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
        except (ConnectionRefusedError, socket.gaierror) as error:
            raise exitcodes.Unreachable(
                f"cannot reach {self.label} at {self.url} ({error}); start it, or set "
                f"{self.name}_URL to where it listens",
                exitcodes.EXIT_NO_ANSWER,
            ) from error
        with server:
            server.send_message(message)
        return {"message_id": message["Message-ID"], "to": to}


def message_id(key):
    """The Message-ID that carries key: <KEY@DOMAIN>, the key percent-encoded (a Message-ID's
    left side takes no ":" or space: RFC 5322 3.6.4)."""
    return f"<{urllib.parse.quote(key, safe='')}@{DOMAIN}>"


@dataclasses.dataclass(frozen=True)
class SmtpAnswers:
    """What an SMTP server's answers mean for an effect (providers.HttpAnswers' counterpart)."""

    def not_sent(self, error):
        if isinstance(error, exitcodes.Unreachable | smtplib.SMTPConnectError):
            return True  # no connection, or no greeting: nothing was sent
        return 400 <= reply_code(error) < 500  # "not taken" before the message was accepted

    def refused(self, error):
        code = reply_code(error)
        if not 500 <= code < 600:
            return None
        return {"status": code, "error": reply_text(error)}


ANSWERS = SmtpAnswers()


def reply_code(error):
    """The server's reply code in an smtplib error (every recipient's, when all were refused:
    the lowest, so one transient refusal is not taken for a permanent one), or 0."""
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in error.recipients.values()]
        return min(codes) if codes else 0
    if isinstance(error, smtplib.SMTPResponseException):
        return error.smtp_code
    return 0


def reply_text(error):
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        said = [text for _, text in error.recipients.values()]
    else:
        said = [getattr(error, "smtp_error", str(error))]
    return "; ".join(t.decode("utf-8", "replace") if isinstance(t, bytes) else t for t in said)
