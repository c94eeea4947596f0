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
leaves `requested`, and the next attempt does not send blindly: a receipt is returned without
calling the provider; an open row is looked up by key (lookup) and what it made adopted. It is
sent again only on evidence: the provider is keyed (it answers a repeated key with the first
result), or a lookup finds nothing settle_s after the last send. Else Unsettled names the
command to look with, and a person settles it (reconcile). The provider's kind decides which
of these apply: keyed; keyless with a lookup and a settle time; keyless without a lookup.

The ledger's row and LangGraph's checkpoint are two commits, even in one SQLite file (the
ledger has a connection of its own; SqliteSaver commits on its own, from LangGraph's background
executor). A crash between the receipt and the checkpoint (failpoint after-receipt, or a node's
after-ack) re-runs the node, which finds the receipt; one between the provider's answer and the
receipt (after-send) leaves `requested`: the lookup's case.
"""

import dataclasses
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import NamedTuple

import tracing
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
    look_with: the command (or address) that shows what the provider holds ({key} filled in).
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
    look_with: str = "the provider's own records"
    provider: Provider | str = "API"

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
        return self.provider.name if isinstance(self.provider, Provider) else self.provider

    def perform(self, ledger, key, request, client, thread=None):
        """The effect's Outcome, made at most once per key: from the receipt when there is one."""
        with ledger.performing(key):  # InFlight while another live process performs key
            # TRACE: a span with the key, how it was made and the ledger's state (tracing.py)
            with tracing.effect(self.name, key, ledger) as traced:
                done = traced(self.perform_claimed(ledger, key, request, client, thread))
        if done.how != "receipt":  # a receipt kept just now, the node not returned: a kill here
            fail("after-receipt")  # leaves it for the re-run node (a replay does not come here)
        return done

    def perform_claimed(self, ledger, key, request, client, thread=None):
        record = ledger.claim(key, self.name, request, thread)
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


def reconcile(ledger, effects, clients=None, said=None, wait=False):
    """[(Record, what it is now)] for the ledger's open effects (requested, unknown).

    Without said: each asked by key where its provider has a lookup (lookup_settles).
    said, {key: ("confirmed" or "not-sent", the provider's id or None)}: a person's word on
    those keys, checked against what the provider holds where it can be asked, and taken only
    once the provider's settle time has passed since the last send (wait: sleep until then).
    Every key is checked, and every key's lock taken, before anything is written: a word the
    ledger will not take is WordRefused, and nothing is settled.
    effects: declared(...) of the program; clients: {provider name: its client}, or one client
    for every effect (None: lookups that need none)."""
    effects = {name: bound(effect, client_of(clients, effect)) for name, effect in effects.items()}
    if said:
        return settle_as_said(ledger, effects, said, wait)
    done = []
    for record in ledger.unsettled():
        try:
            with ledger.performing(record.key):  # a live process's request may still be out
                record = ledger.get(record.key)  # as it is now that nobody else performs it
                if record.state in OPEN:
                    effect = effects.get(record.effect)
                    done.append((record, lookup_settles(ledger, record, effect)))
        except InFlight:
            done.append((record, "in flight"))
    return done


def client_of(clients, effect):
    if isinstance(clients, dict):
        return clients.get(effect.provider_name)
    return clients


def bound(effect, client):
    """The effect with its lookup bound to its provider's client (it ignores the one given)."""
    if effect.lookup is None:
        return effect
    return dataclasses.replace(effect, lookup=lambda _, key: effect.lookup(client, key))


def lookup_settles(ledger, record, effect):
    """What one open effect is now, asked by key where it has a lookup. Nothing found is proof
    only settle_s after the last send (or for a keyed provider, which answers a resend with the
    first result): released then, else it stays open."""
    if effect is None or effect.lookup is None:
        if record.state != "unknown":
            ledger.move(record.key, "unknown", "reconcile: no lookup, a person must settle it")
        return "needs a person"
    if (found := effect.lookup(None, record.key)) is not None:
        ledger.confirm(record.key, found, effect.external_id(found), "reconcile: adopted")
        return "confirmed"
    if (why := effect.may_resend(record)) is None:
        if record.state != "unknown":
            ledger.move(record.key, "unknown", "reconcile: nothing found yet, may commit late")
        return "too soon to tell"
    ledger.move(record.key, "released", f"reconcile: nothing under it ({why})")
    return "not sent"


def settle_as_said(ledger, effects, said, wait):
    """[(Record, state)] of a person's word on each key in said (reconcile)."""
    for key in said:
        require_open(ledger, key)
    if wait:  # until every named key's settle time is over
        time.sleep(max([settle_left_s(ledger.get(k), effects) for k in said], default=0))
    with ExitStack() as held:
        for key in said:  # InFlight while a live process performs it: nothing written yet
            held.enter_context(ledger.performing(key))
        settled = [word_checked(ledger, key, *said[key], effects) for key in said]
        for key, _, how, answer, external_id in settled:
            ledger.settle(key, how, answer, external_id)
        return [(ledger.get(key), state) for key, state, *_ in settled]


def word_checked(ledger, key, word, external_id, effects):
    """(key, state, how, answer, external_id) to write for one key, checked against what the
    provider holds where it can be asked; WordRefused (nothing written) where it disagrees."""
    record = ledger.get(key)  # under its lock now
    require_open(ledger, key)
    effect = effects.get(record.effect)
    look = "" if effect is None else f" (look with {effect.look_with.format(key=key)})"
    found = None if effect is None or effect.lookup is None else effect.lookup(None, key)
    nothing = ". Nothing was settled"
    if word == "not-sent" and found is not None:
        held = effect.external_id(found)
        raise WordRefused(
            f"the provider holds {held} under {key!r}: it was sent; reconcile --confirmed "
            f"{key} records it{look}{nothing}"
        )
    if word == "not-sent":  # a person's word: taken once the provider's settle time is over
        require_settled(record, effect, look + nothing)
        return key, "released", "a person: reconcile --not-sent", None, None
    how = "a person: reconcile --confirmed"
    if found is not None:
        if external_id is not None and external_id != str(effect.external_id(found)):
            raise WordRefused(
                f"the provider holds {effect.external_id(found)} under {key!r}, not "
                f"{external_id}{look}{nothing}"
            )
        return key, "confirmed", f"{how}, looked up", found, effect.external_id(found)
    if effect is not None and effect.lookup is not None:
        raise WordRefused(
            f"the provider holds nothing under {key!r}: not confirmed{look}; if it never went "
            f"out, --not-sent {key}{nothing}"
        )
    if effect is None or effect.answer_of is None:
        raise WordRefused(
            f"effect {record.effect!r} of {key!r} is not one this program can record a person's "
            f"answer for; --not-sent {key} if it never went out{nothing}"
        )
    if external_id is None:
        raise WordRefused(
            f"--confirmed {key} needs the id the provider gave it: --confirmed {key}=ID{look}"
            f"{nothing}",
            usage=True,
        )
    try:
        answer = effect.answer_of(external_id)
    except (ValueError, TypeError):
        raise WordRefused(
            f"{external_id!r} is not an id of {effect.name}{look}{nothing}", usage=True
        ) from None
    require_settled(record, effect, look + nothing)  # a person's word, as for --not-sent
    return key, "confirmed", how, answer, effect.external_id(answer)


def settle_left_s(record, effects):
    """Seconds until a person's word on record is taken (0: now)."""
    effect = effects.get(record.effect)
    settle_s = SETTLE_S if effect is None else effect.settled_after_s
    return max(0.0, settle_s - record.since_sent_s)


def require_settled(record, effect, then):
    """A person's word is taken once the provider's settle time has passed since the last send:
    before it the request may still be at the provider (a client killed or timed out while the
    provider held it) and commit after the person looked. Else WordRefused: when to try again."""
    settle_s = SETTLE_S if effect is None else effect.settled_after_s
    if (left_s := settle_left_s(record, {record.effect: effect} if effect else {})) > 0:
        at = time.strftime("%H:%M:%S", time.gmtime(time.time() + left_s))
        raise WordRefused(
            f"{record.key!r} was last sent {record.since_sent_s:.0f} s ago and "
            f"{where(effect, 'its provider')} may take {settle_s:g} s to commit what it "
            f"accepted: what a person sees now can still change; try again in "
            f"{math.ceil(left_s)} s (at {at} UTC), or add --wait{then}"
        )


def require_open(ledger, key):
    """Only an effect that may be out there is a person's to settle."""
    if not (record := ledger.get(key)) or record.state not in OPEN:
        state = record.state if record else "no such key"
        raise WordRefused(
            f"effect {key!r} is not open ({state}); reconcile lists the open ones. Nothing was "
            "settled"
        )


class WordRefused(LedgerError):
    """A person's word the ledger will not take (a key not open, an id the provider does not
    hold, too soon after the last send): nothing was settled. usage: the word was malformed."""

    def __init__(self, message, usage=False):
        super().__init__(message)
        self.usage = usage


class Unsettled(LedgerError):
    """An earlier attempt may have made the effect, and nothing here can tell yet."""

    def __init__(self, key, effect, since_sent_s=0.0, error=None):
        look = effect.look_with.format(key=key)
        said = f" ({type(error).__name__}: {error})" if error else ""
        if effect.keyed:  # "in progress", or no answer: the key gets the first result later
            why = f"{where(effect, 'its provider')} honours the key and has not given its result"
            why += f" yet{said}"
            then = (
                f"resume once {effect.settled_after_s:g} s have passed since the last send (the "
                "provider answers the key with its first result)"
            )
        elif effect.lookup is None:
            why = f"{where(effect, 'its provider')} has no lookup{said}"
            then = (
                f"reconcile --confirmed {key}=ID if it happened, --not-sent {key} if it did not "
                f"(taken {effect.settled_after_s:g} s after the last send)"
            )
        else:
            who = where(effect, "the provider")
            why = (
                f"the lookup found nothing {since_sent_s:.1f} s after the last send, and {who} "
                f"may take {effect.settled_after_s:g} s to commit"
            )
            then = "reconcile (it asks the provider again)"
        super().__init__(
            f"effect {effect.name} {key!r} may have happened (sent, and no answer was recorded) "
            f"and {why}: look with {look}, then {then}"
        )
        self.key = key


def where(effect, otherwise):
    """How a line names an effect's provider: the name it declares, else otherwise."""
    return str(getattr(effect, "provider_name", "") or otherwise)


class Refused(LedgerError):
    """The provider said no (refusal: its answer), and the ledger recorded it as failed."""

    def __init__(self, key, refusal):
        super().__init__(f"effect {key!r} was refused: {refusal}")
        self.key, self.refusal = key, refusal
