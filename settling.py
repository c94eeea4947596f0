"""reconcile: the ledger's open effects settled, each asked by key where its provider has a
lookup, or as a person says (it happened, with the provider's id; it did not): a person's word
is checked against what the provider holds and taken only once the provider's settle time has
passed since the last send. A person's word already taken is corrected, never overwritten
(corrections.py). The reconcile command (commandline.py) only calls it."""

import dataclasses
import math
import shlex
import time
from contextlib import ExitStack

import corrections
from exitcodes import command
from ledger import OPEN, InFlight, LedgerError
from providers import SETTLE_S


def reconcile(ledger, effects, clients=None, said=None, wait=False):
    """[(Record, what it is now)] for the ledger's open effects (requested, unknown).

    Without said: each asked by key where its provider has a lookup (lookup_settles).
    said, {key: ("confirmed" or "not-sent", the provider's id or None)}: a person's word on
    those keys, checked against what the provider holds where it can be asked, and taken only
    once the provider's settle time has passed since the last send (wait: sleep until then);
    ("correct", the id): a confirmed key's person's answer corrected (correction_checked).
    Every key is checked, and every key's lock taken, before anything is written: a word the
    ledger will not take is WordRefused, and nothing is settled.
    effects: declared(...) of the program; clients: {provider name: its client}, or one client
    for every effect (None: lookups that need none)."""
    effects = {
        name: with_lookup_client(effect, client_of(clients, effect))
        for name, effect in effects.items()
    }
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


def with_lookup_client(effect, client):
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
    opening = [key for key in said if said[key][0] != "correct"]
    for key in said:
        if key in opening:
            require_open(ledger, key)
        else:
            require_correctable(ledger, key)
    if wait:  # until every named key's settle time is over
        time.sleep(max([settle_left_s(ledger.get(k), effects) for k in opening], default=0))
    with ExitStack() as held:
        for key in said:  # InFlight while a live process performs it: nothing written yet
            held.enter_context(ledger.performing(key))
        settled = [checked(ledger, key, *said[key], effects) for key in said]
        for key, state, how, answer, external_id in settled:
            if state == "corrected":
                corrections.correct(ledger, key, answer, external_id, how)
            else:
                ledger.settle(key, how, answer, external_id)
        return [(ledger.get(key), state) for key, state, *_ in settled]


def checked(ledger, key, word, external_id, effects):
    if word == "correct":
        return correction_checked(ledger, key, external_id, effects)
    return word_checked(ledger, key, word, external_id, effects)


def correction_checked(ledger, key, external_id, effects):
    """(key, "corrected", how, answer, external_id) of a person's correction of key, checked:
    only an answer a person gave is corrected (a provider's own answer is not theirs to
    change), to an id the provider holds under the key where it can be asked, and not to the
    id it already names; else WordRefused, nothing written."""
    record = require_correctable(ledger, key)  # under its lock now
    effect = effects.get(record.effect)
    look = "" if effect is None else f" (look with {effect.look(key)})"
    if external_id is None and not corrections.correctable(ledger, key):  # checked: it holds
        was = ledger.receipt(key)["external_id"]
        raise WordRefused(
            f"effect {key!r} names {was}, which its provider's lookup found when a person "
            f"confirmed it: the only id a correction could name{look}",
            verb="corrected",
        )
    if external_id is None:
        raise WordRefused(
            f"--correct {key} needs the id the provider gave it: "
            f"{reconciling('--correct', key + '=ID')}{look}",
            usage=True,
            verb="corrected",
        )
    was = ledger.receipt(key)["external_id"]
    if external_id == was:
        raise WordRefused(f"{key!r} already names {was}{look}", verb="corrected")
    how = "a person: reconcile --correct"
    if effect is not None and effect.lookup is not None:  # asked, not believed
        found = effect.lookup(None, key)
        held = "nothing" if found is None else effect.external_id(found)
        if found is None or str(held) != external_id:
            raise WordRefused(
                f"the provider holds {held} under {key!r}, not {external_id}{look}",
                verb="corrected",
            )
        return key, "corrected", f"{how}{corrections.LOOKED_UP}", found, held
    if effect is None or effect.answer_of is None:
        raise WordRefused(
            f"effect {record.effect!r} of {key!r} is not one this program can record a person's "
            f"answer for",
            verb="corrected",
        )
    answer = answer_of_id(effect, external_id, look, verb="corrected")
    return key, "corrected", how, answer, effect.external_id(answer)


def require_correctable(ledger, key):
    """Only a confirmed key whose answer a person gave is a person's to correct: its Record."""
    record = ledger.get(key)
    if record is None or record.state != "confirmed":
        state = record.state if record else "no such key"
        open_ = record is not None and record.state in OPEN  # released, failed: nothing to settle
        hint = f"; {reconciling('--confirmed', key + '=ID')} settles it" if open_ else ""
        raise WordRefused(
            f"effect {key!r} is not confirmed ({state}): --correct changes a person's answer{hint}",
            verb="corrected",
        )
    if corrections.by_a_person(ledger, key) is None:
        how = next(how for _, to, how in ledger.history(key) if to == "confirmed")
        raise WordRefused(
            f"effect {key!r} was confirmed by its provider ({how}), not by a person's word: "
            "there is no person's answer to correct",
            verb="corrected",
        )
    return record


def word_checked(ledger, key, word, external_id, effects):
    """(key, state, how, answer, external_id) to write for one key, checked against what the
    provider holds where it can be asked; WordRefused (nothing written) where it disagrees."""
    record = ledger.get(key)  # under its lock now
    require_open(ledger, key)
    effect = effects.get(record.effect)
    look = "" if effect is None else f" (look with {effect.look(key)})"
    found = None if effect is None or effect.lookup is None else effect.lookup(None, key)
    if word == "not-sent" and found is not None:
        held = effect.external_id(found)
        raise WordRefused(
            f"the provider holds {held} under {key!r}: it was sent; "
            f"{reconciling('--confirmed', key)} records it{look}"
        )
    if word == "not-sent":  # a person's word: taken once the provider's settle time is over
        require_settled(record, effect, look)
        return key, "released", "a person: reconcile --not-sent", None, None
    how = "a person: reconcile --confirmed"
    if found is not None:
        if external_id is not None and external_id != str(effect.external_id(found)):
            raise WordRefused(
                f"the provider holds {effect.external_id(found)} under {key!r}, not "
                f"{external_id}{look}"
            )
        return key, "confirmed", f"{how}{corrections.LOOKED_UP}", found, effect.external_id(found)
    if effect is not None and effect.lookup is not None:
        raise WordRefused(
            f"the provider holds nothing under {key!r}: not confirmed{look}; if it never went "
            f"out, {reconciling('--not-sent', key)}"
        )
    if effect is None or effect.answer_of is None:
        raise WordRefused(
            f"effect {record.effect!r} of {key!r} is not one this program can record a person's "
            f"answer for; if it never went out, {reconciling('--not-sent', key)}"
        )
    if external_id is None:
        raise WordRefused(
            f"--confirmed {key} needs the id the provider gave it: "
            f"{reconciling('--confirmed', key + '=ID')}{look}",
            usage=True,
        )
    answer = answer_of_id(effect, external_id, look)
    require_settled(record, effect, look)  # a person's word, as for --not-sent
    return key, "confirmed", how, answer, effect.external_id(answer)


def reconciling(switch, word):
    """The whole reconcile command that says switch of word (a key, or KEY=ID), as typed."""
    return command(f"reconcile {switch} {shlex.quote(word)}")


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
        fix = ""
        if state == "confirmed" and corrections.correctable(ledger, key):
            fix = f"; a person's answer given wrong: {reconciling('--correct', key + '=ID')}"
        raise WordRefused(
            f"effect {key!r} is not open ({state}); {command('reconcile')} lists the open ones{fix}"
        )


class WordRefused(LedgerError):
    """A person's word the ledger will not take (a key not open, an id the provider does not
    hold, too soon after the last send): nothing was settled (or corrected), which the line says
    first, so that a command it names ends the line or a clause, never a sentence's period.
    usage: the word was malformed."""

    def __init__(self, message, usage=False, verb="settled"):
        super().__init__(f"nothing was {verb}: {message}")
        self.usage = usage


def where(effect, otherwise):
    """How a line names an effect's provider: the name it declares, else otherwise."""
    declared = getattr(effect, "provider", None)
    return str(getattr(declared, "name", declared) or otherwise)


def answer_of_id(effect, external_id, why, verb="settled"):
    """The answer a person's id stands for (effect.answer_of), or one line: not its id."""
    try:
        return effect.answer_of(external_id)
    except (ValueError, TypeError):
        raise WordRefused(
            f"{external_id!r} is not an id of {effect.name}{why}", usage=True, verb=verb
        ) from None
