"""Effects: a request to another system (a ticket, a charge, an email) made at most once per
idempotency key, across crashes. Declare one on the function that sends it, then call it from a
node like any function:

    @effects.effect(API, external_id="ticket_id", lookup=find_ticket)
    def ticket(client, request, key):
        return client.call("/tickets", request, key)

    def create_ticket(state):
        done = ticket({"title": state["title"]}, key=state["key"])  # done.answer, done.how

The ledger (ledger.py, in the workflow's own database) records the intent before the request
leaves and the answer (a receipt) once it comes back. Each effect's row moves through:

    requested -> confirmed   the answer came back: a receipt is kept, never overwritten
              -> failed      the provider refused it (a business answer: nothing was done)
              -> unknown     sent, and no answer: done or not, nobody here can tell
              -> released    nothing was done (a refused connection, an answer that did
                             nothing, a person's word): the next attempt sends it

A process that dies after the provider committed and before the receipt (the crash window)
leaves `requested`; the next attempt looks the key up (lookup) and adopts what it made. It sends
again only on evidence: a keyed provider (it answers a repeated key with the first result), or
a lookup that finds nothing settle_s after the last send. Else Unsettled names the command to
look with, and a person settles it (reconcile).

The ledger's row and LangGraph's checkpoint are two commits: a crash after the receipt (the
after-receipt failpoint, a node's after-ack) re-runs the node, which finds the receipt. A crash
after the intent and before the request left (after-intent) leaves `requested` too, which
nothing here can tell from one after it left: the same evidence decides.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import tracing
from exitcodes import command, resume_command
from failpoints import fail
from ledger import (
    LEASE_S,
    OPEN,
    SETTLED,
    STATES,
    TABLES,
    Conflict,
    Damaged,
    InFlight,
    Ledger,
    LedgerError,
    LedgerReader,
    NotText,
    Record,
    open_ledger,
    read_ledger,
    request_hash,
)
from ledger_tables import SCHEMA, key_receipts, wal
from postgres_ledger import PostgresLedger
from providers import SETTLE_S, Provider
from settling import WordRefused, reconcile, reconciling, where

# The effects' API, and the ledger's storage named here too: effects.Ledger is ledger.Ledger.
# fmt: off
__all__ = [
    "Effect", "effect", "Outcome", "declared", "reconcile", "Unsettled", "Refused", "WordRefused",
    "SETTLE_S", "LEASE_S", "OPEN", "SETTLED", "STATES", "TABLES", "SCHEMA", "Conflict", "Damaged",
    "InFlight", "Ledger", "LedgerError", "LedgerReader", "NotText", "Record", "PostgresLedger",
    "open_ledger", "read_ledger", "request_hash", "key_receipts", "wal",
]
# fmt: on


@dataclasses.dataclass(frozen=True)
class Effect:
    """One kind of effect, declared once (the effect decorator builds one from a function).

    send(client, request, key) -> the provider's answer (a dict).
    external_id: how to read the provider's id for what it made from its answer: the answer's
    field name, or a function of the answer; kept in the receipt.
    lookup(client, key) -> the answer the key made, or None when it made nothing; None (the
    attribute) for a provider that offers no lookup (an email, an SMS).
    provider: the Provider it is sent to (providers.py), or its name. What an effect leaves
    unsaid is its provider's: keyed (the provider answers a repeated key with the first result,
    so a request whose answer was lost may be sent again), settle_s (how long it may take to
    commit what it accepted: a lookup that finds nothing sooner after the last send is no proof),
    and what its error answers mean: not_sent(error) true for one that proves nothing was done,
    refused(error) the provider's business "no" (a dict: nothing done, the key spent), else
    None. Any other error leaves the effect unknown. Without a Provider: not keyed, SETTLE_S,
    no error proves anything.
    answer_of(id) -> the answer a person's id stands for (reconcile --confirmed KEY=ID, for a
    provider without lookup); by default {field: id} for an external_id given as a field name.
    look_with: the command (or address) that shows what the provider holds ({key} filled in),
    or a callable that gives it for a key (exitcodes.looking: a command of the running program).
    authorize(ledger, key, request) -> what authorizes this very request (an approval's name,
    kept on the row: Record.authorized), or it raises to refuse (nothing is sent, the row is
    released, the error goes on up). Asked after the intent, before every send, never for a
    receipt or an adopted effect: an authorization is reloaded and checked, never assumed fresh.
    """

    name: str
    send: Callable
    external_id: Callable | str
    lookup: Callable | None = None
    not_sent: Callable | None = None
    refused: Callable | None = None
    keyed: bool | None = None
    settle_s: float | None = None
    answer_of: Callable | None = None
    look_with: str | Callable = "the provider's own records"
    provider: Provider | str | None = None  # None: API's client, named "the provider"
    authorize: Callable | None = None  # None: no authorization is asked for

    def look(self, key):
        """What shows what the provider holds under key (look_with, for key)."""
        return self.look_with(key) if callable(self.look_with) else self.look_with.format(key=key)

    def __post_init__(self):
        given = self.provider if isinstance(self.provider, Provider) else None
        defaults = {
            "keyed": given.keyed if given else False,
            "settle_s": given.settle_s if given else SETTLE_S,
            "not_sent": given.answers.not_sent if given else never_sent,
            "refused": given.answers.refused if given else no_refusal,
        }
        if isinstance(self.external_id, str):
            field = self.external_id
            object.__setattr__(self, "external_id", lambda answer: answer[field])
            defaults["answer_of"] = lambda external_id: {field: external_id}
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    def __call__(self, request, key):
        """Perform it from inside a graph node: the run's ledger and the client of this effect's
        provider are the run's context (workflow.Context), which LangGraph's get_runtime()
        (langgraph/runtime.py) reads from the running node's config."""
        from langgraph.runtime import get_runtime

        try:
            context = get_runtime().context
        except RuntimeError:  # get_config's: not inside a node
            raise RuntimeError(
                f"{self.name}(request, key) is called from a graph node; elsewhere use "
                f"{self.name}.perform(ledger, key, request, client)"
            ) from None
        return self.perform(context.ledger, key, request, context.client_for(self))

    @property
    def provider_name(self):
        """The name of the provider whose client sends it (its settings' NAME)."""
        return getattr(self.provider, "name", self.provider) or "API"

    def perform(self, ledger, key, request, client, thread=None):
        """The effect's Outcome, made at most once per key: from the receipt when there is one."""
        with ledger.performing(key):  # InFlight while another live process performs key
            # TRACE: a span with the key, how it was made and the ledger's state (tracing.py)
            with tracing.effect_span(self.name, key, ledger) as traced:
                done = traced(self.perform_claimed(ledger, key, request, client, thread))
        if done.how != "receipt":  # a receipt kept just now, the node not returned: a kill here
            fail("after-receipt")  # leaves it for the re-run node (a replay does not come here)
        return done

    def perform_claimed(self, ledger, key, request, client, thread=None):
        try:
            record = ledger.claim(key, self.name, request, thread)
        except Exception as error:  # no intent written (a read-only file, a full disk): this
            error.sent_nothing = True  # attempt sent nothing; its line can say so (hints.py)
            raise
        if record.state == "confirmed":
            return Outcome(record.answer, "receipt")  # a replay: the provider is not called
        if record.state == "failed":
            raise Refused(key, record.refusal)
        if record.reopened:  # an earlier attempt's request may be out there: evidence first
            if (found := self.look_up(ledger, key, client)) is not None:
                return found  # it had taken effect: adopted
            if (why := self.may_resend(record)) is None:
                ledger.move(key, "unknown", "no evidence it was not sent: a person must look")
                raise Unsettled(key, self, record.since_sent_s)
            ledger.move(key, "requested", f"sent again: {why}")
        if self.authorize is not None:  # after the intent, before it leaves: checked now
            try:
                ledger.authorize(key, self.authorize(ledger, key, request))
            except Exception as refusal:
                ledger.move(key, "released", f"not sent: not authorized: {refusal}")
                raise
        fail("after-intent")  # the intent committed, nothing sent yet: a kill leaves requested
        sent = time.monotonic()  # the stop below says how long after it the lookup found nothing
        for again in (False, True):  # a keyed provider's lost answer: once more under the key
            try:
                answer = self.send(client, request, key)
                break
            except Exception as error:
                if self.not_sent(error):  # only proof: the request never left, or did nothing
                    ledger.move(key, "released", f"not done: {error}")
                    raise
                if (refusal := self.refused(error)) is not None:  # a business no: final
                    ledger.refuse(key, refusal)
                    raise Refused(key, refusal) from error
                # Anything else (a timeout, a reset, a 5xx, "in progress"): it may have been
                # made, or may still be. Unknown, until a lookup or a person says.
                ledger.move(key, "unknown", f"no answer: {type(error).__name__}: {error}")
                if (found := self.look_up(ledger, key, client)) is not None:
                    return found  # it committed before the answer was lost
                if not self.keyed or again:  # a resend now could be a second effect: stop
                    raise Unsettled(key, self, time.monotonic() - sent, error) from error
                # The provider honours the key: the same request under it gets the first result
                # (or "in progress" while the first is still being processed: unknown again).
                ledger.move(key, "requested", "sent again: the provider honours the key")
            except BaseException:  # Ctrl-C, a drain: the request may have left
                ledger.move(key, "unknown", "interrupted while the request was out")
                raise
        # The provider has committed it and the ledger does not know yet: the window a kill
        # here leaves is closed by the lookup of the next attempt (or a person, without one).
        fail("after-send")
        return Outcome(ledger.confirm(key, answer, self.external_id(answer), "answered"), "sent")

    def look_up(self, ledger, key, client):
        """The Outcome adopted from the provider's answer under key, or None: it holds nothing
        (or cannot be asked)."""
        if self.lookup is None or (found := self.lookup(client, key)) is None:
            return None
        return Outcome(
            ledger.confirm(key, found, self.external_id(found), "adopted by lookup"), "adopted"
        )

    def may_resend(self, record):
        """Why the evidence allows a resend of record (requested or unknown, nothing found by
        lookup), or None: it may have been made, and nobody can tell yet."""
        if self.keyed:
            return "the provider honours the key"
        if self.lookup is not None and record.since_sent_s >= self.settled_after_s:
            return f"the lookup found nothing {record.since_sent_s:.1f} s after the last send"
        return None

    @property
    def settled_after_s(self):
        return SETTLE_S if self.settle_s is None else self.settle_s


class Outcome(NamedTuple):
    answer: dict  # the provider's, or the receipt's on a replay
    how: str  # sent, receipt (the provider was not called), adopted (found by lookup)


def never_sent(error):
    """An Effect's not_sent without a Provider: no error proves that nothing was done."""
    return False


def no_refusal(error):
    """An Effect's refused without a Provider: no error is a business "no"."""
    return None


def effect(provider, *, external_id, lookup=None, answer_of=None, look_with=None, name=None):
    """Declare the decorated function send(client, request, key) an Effect sent to provider,
    named after the function; called from a node as effect(request, key=...): its Outcome."""

    def declare(send):
        return Effect(
            name or send.__name__,
            send=send,
            external_id=external_id,
            lookup=lookup,
            answer_of=answer_of,
            look_with=look_with or f"{getattr(provider, 'name', provider)}'s own records",
            provider=provider,
        )

    return declare


def declared(namespace):
    """The effects declared in a module's namespace (vars(module)), by name."""
    return {v.name: v for v in namespace.values() if isinstance(v, Effect)}


class Unsettled(LedgerError):
    """An earlier attempt may have made the effect, and nothing here can tell yet."""

    def __init__(self, key, effect, since_sent_s=0.0, error=None):
        look = effect.look(key)
        said = f" ({type(error).__name__}: {error})" if error else ""
        if effect.keyed:  # "in progress", or no answer: the key gets the first result later
            why = f"{where(effect, 'its provider')} honours the key and has not given its result"
            why += f" yet{said}"
            then = (
                f"once {effect.settled_after_s:g} s have passed since the last send (the "
                f"provider answers the key with its first result): {resume_command()}"
            )
        elif effect.lookup is None:
            why = f"{where(effect, 'its provider')} has no lookup{said}"
            confirmed = reconciling("--confirmed", f"{key}=ID")
            not_sent = reconciling("--not-sent", key)
            then = (
                f"if it happened, {confirmed} (ID: the provider's); if it did not, {not_sent} "
                f"(taken {effect.settled_after_s:g} s after the last send)"
            )
        else:
            who = where(effect, "the provider")
            why = (
                f"the lookup found nothing {since_sent_s:.1f} s after the last send, and {who} "
                f"may take {effect.settled_after_s:g} s to commit"
            )
            then = f"{command('reconcile')} (it asks the provider again)"
        super().__init__(
            f"effect {effect.name} {key!r} may have happened (sent, and no answer was recorded) "
            f"and {why}: look with {look}, then {then}"
        )
        self.key = key


class Refused(LedgerError):
    """The provider said no (refusal: its answer), and the ledger recorded it as failed."""

    def __init__(self, key, refusal):
        super().__init__(f"effect {key!r} was refused: {refusal}")
        self.key, self.refusal = key, refusal
