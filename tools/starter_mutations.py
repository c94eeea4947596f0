"""The starter's suite against mutations of its core: each a bug a copier could write, applied to a
fresh starter's copy (never to this checkout), which the starter's `python -m unittest` must fail.

    python -m tools.starter_mutations [NAME ...]     (every mutation by default)

Each mutation is one text substitution inside one function (or declaration) of a core file
(effects.py, ledger.py, settling.py, providers.py or workflow.py), found by its name with ast,
so that moving code around does not lose it; a substitution that no longer applies exactly once
is an error, not a pass. First the unmutated
starter's suite must pass (else every mutation would look caught). Prints one JSON line per
mutation ({"mutation", "caught", "seconds", "failed": the first failing test}) and the score.
Exit codes: 0 every mutation caught; 1 one survived, or the unmutated suite failed; 2 a mutation
no longer applies (its text moved: update MUTATIONS), or an unknown name.
"""

import argparse
import ast
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import starter

SUITE_TIMEOUT_S = 600  # one mutated suite; a hang (a loop a mutation makes endless) fails it
EXIT_SURVIVED = 1
EXIT_STALE = 2


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # in the starter: effects.py, ledger.py, settling.py, providers.py, workflow.py
    scope: str  # a function's name (a method's too; "Ledger.performing" where two classes
    #             have one), an Effect's name ("Effect:ticket"), or a module-level name
    #             assigned once ("=OPEN")
    old: str  # the text replaced, exactly once inside the scope
    new: str


MUTATIONS = (
    # The order the ledger writes in: the intent first, then the request.
    Mutation(
        "the request sent before the intent",
        "effects.py",
        "perform_claimed",
        "record = ledger.claim(key, self.name, request, thread)",
        "self.send(client, request, key)\n"
        "            record = ledger.claim(key, self.name, request, thread)",
    ),
    # How the ledger reads a provider's answers: a conflict, a timeout, its checks, its lookups.
    Mutation(
        "a 409 treated as success",
        "effects.py",
        "perform_claimed",
        "ledger.refuse(key, refusal)\n                    raise Refused(key, refusal) from error",
        'return Outcome(ledger.confirm(key, refusal, key, "answered"), "sent")',
    ),
    Mutation(
        "a timeout marked not sent",
        "effects.py",
        "perform_claimed",
        "if self.not_sent(error):",
        'if self.not_sent(error) or "timed out" in str(error) or isinstance(error, TimeoutError):',
    ),
    Mutation(
        "the integrity check skipped",
        "ledger.py",
        "receipt",
        'if (why := integrity_fault(fields, row["integrity"])) is not None:',
        "if False:",
    ),
    Mutation(
        "a lookup ignoring our reference",
        "workflow.py",
        "find_ticket",
        "client.tickets(key)",
        "client.tickets()",
    ),
    Mutation(
        "unknown not treated as open",
        "ledger.py",
        "=OPEN",
        '("requested", "unknown")',
        '("requested",)',
    ),
    # Settle times, receipts and keys.
    Mutation(
        "the settle time ignored",
        "effects.py",
        "may_resend",
        "record.since_sent_s >= self.settled_after_s",
        "True",
    ),
    Mutation(
        "a reopened effect sent without a lookup",
        "effects.py",
        "perform_claimed",
        "if record.reopened:",
        "if False:",
    ),
    Mutation(
        "a receipt not replayed",
        "effects.py",
        "perform_claimed",
        'if record.state == "confirmed":',
        'if record.state == "replayed":',
    ),
    Mutation(
        "an answer that did nothing not released (a 404 burns the key)",
        "effects.py",
        "perform_claimed",
        "if self.not_sent(error):",
        "if False:",
    ),
    Mutation(
        "a key reused for another request",
        "ledger.py",
        "claim",
        'row["effect"] != effect or (changed and not released)',
        "False",
    ),
    # Locks and leases, refusals, interrupted requests, keyless resends, the provider's kind.
    Mutation(
        "the per-key lock removed",
        "ledger.py",
        "Ledger.performing",
        "if not held:",
        "if False:",
    ),
    Mutation(
        "a live holder's lease ignored",
        "ledger.py",
        "Ledger.performing",
        '(row["lease_until"] or 0) > time.time()',
        "False",
    ),
    Mutation(
        "a second confirm writes a second receipt",
        "ledger.py",
        "confirm",
        'if row["state"] == "confirmed":',
        "if False:",
    ),
    Mutation(
        "an interrupted request marked released",
        "effects.py",
        "perform_claimed",
        'ledger.move(key, "unknown", "interrupted while the request was out")',
        'ledger.move(key, "released", "interrupted while the request was out")',
    ),
    Mutation(
        "a refused effect sent again",
        "effects.py",
        "perform_claimed",
        'if record.state == "failed":',
        "if False:",
    ),
    Mutation(
        "a refusal recorded as unknown",
        "effects.py",
        "perform_claimed",
        "if (refusal := self.refused(error)) is not None:",
        "if False:",
    ),
    Mutation(
        "a person's word taken before the settle time",
        "settling.py",
        "require_settled",
        "if (left_s := settle_left_s(record, {record.effect: effect} if effect else {})) > 0:",
        "if (left_s := 0) > 0:",
    ),
    Mutation(
        "the intent recorded as if written after the send",
        "ledger.py",
        "claim",
        "VALUES (?, ?, ?, ?, ?, 'requested', ?, ?, ?, ?)",
        "VALUES (?, ?, ?, ?, ?, 'released', ?, ?, ?, ?)",
    ),
    Mutation(
        "the lookup dropped",
        "effects.py",
        "look_up",
        "if self.lookup is None or (found := self.lookup(client, key)) is None:",
        "if True:",
    ),
    Mutation(
        "a timeout recorded as released",
        "effects.py",
        "perform_claimed",
        'ledger.move(key, "unknown", f"no answer: {type(error).__name__}: {error}")',
        'ledger.move(key, "released", f"no answer: {type(error).__name__}: {error}")',
    ),
    Mutation(
        "unknown treated as free to send",
        "ledger.py",
        "claim",
        'row["state"] == "released"',
        'row["state"] in ("released", "unknown")',
    ),
    Mutation(
        "a keyless effect sent again after no answer",
        "effects.py",
        "perform_claimed",
        "if not self.keyed or again:",
        "if again:",
    ),
    Mutation(
        "the keyed resend's answer not classified",
        "effects.py",
        "perform_claimed",
        "if not self.keyed or again:",
        "if not self.keyed:",
    ),
    Mutation(
        "in progress (409) taken for a refusal",
        "providers.py",
        "=IETF_ANSWERS",
        "HttpAnswers()",
        "HttpAnswers(in_progress=frozenset())",
    ),
    Mutation(
        "a provider's keyed not passed to its effects",
        "effects.py",
        "__post_init__",
        '"keyed": given.keyed if given else False,',
        '"keyed": False,',
    ),
)


def mutate(folder, mutation):
    """Apply mutation to the starter in folder; ValueError if it does not apply exactly once."""
    path = folder / mutation.file
    text = path.read_text(encoding="utf-8")
    start, end = span(text, mutation.scope)
    part = text[start:end]
    if part.count(mutation.old) != 1:
        raise ValueError(
            f"{mutation.name}: {mutation.old!r} is in {mutation.scope} of {mutation.file} "
            f"{part.count(mutation.old)} times, not once: update MUTATIONS"
        )
    path.write_text(text[:start] + part.replace(mutation.old, mutation.new) + text[end:], "utf-8")


def span(text, scope):
    """(start, end) offsets of scope in a module's text (see Mutation.scope)."""
    tree, lines = ast.parse(text), text.splitlines(keepends=True)
    for owner in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in owner.body:
            method.owner = owner.name  # for a Class.method scope
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    found = [node for node in ast.walk(tree) if matches(node, scope)]
    if len(found) != 1:
        raise ValueError(f"{scope}: found {len(found)} times, not once: update MUTATIONS")
    (node,) = found
    return offsets[node.lineno - 1], offsets[node.end_lineno]


def matches(node, scope):
    if "." in scope and not scope.startswith(("=", "Effect:")):  # Class.method
        owner, name = scope.split(".", 1)
        return (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == name
            and getattr(node, "owner", None) == owner
        )
    if scope.startswith("="):
        return isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == scope[1:] for t in node.targets
        )
    if scope.startswith("Effect:"):
        return (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "Effect"
            and node.args[:1]
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == scope.split(":", 1)[1]
        )
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == scope


def run_suite(folder):
    """(passed, seconds, the first failing test's id or "") of the starter's suite in folder."""
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "unittest", "-f"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - began, f"timed out after {SUITE_TIMEOUT_S} s"
    failed = re.search(r"^(?:FAIL|ERROR): (\S+ \(\S+\))", done.stderr, re.MULTILINE)
    return done.returncode == 0, time.monotonic() - began, failed.group(1) if failed else ""


def main(argv=None):
    parser = argparse.ArgumentParser(prog="starter_mutations", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutations by name (default: all)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    if unknown := set(args.names) - {m.name for m in MUTATIONS}:
        print(f"starter_mutations: no mutation {sorted(unknown)}", file=sys.stderr)
        return EXIT_STALE
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh"
        starter.write_starter(fresh)
        try:
            for mutation in chosen:  # each applies to the code as it is now, or stop here
                mutate(copy(fresh, Path(tmp) / "check"), mutation)
        except ValueError as error:
            print(f"starter_mutations: {error}", file=sys.stderr)
            return EXIT_STALE
        passed, seconds, failed = run_suite(fresh)
        print(json.dumps({"mutation": None, "passed": passed, "seconds": round(seconds, 1)}))
        if not passed:
            print(f"starter_mutations: the unmutated suite fails ({failed})", file=sys.stderr)
            return EXIT_SURVIVED
        caught = 0
        for mutation in chosen:
            folder = copy(fresh, Path(tmp) / "mutated")
            mutate(folder, mutation)
            passed, seconds, failed = run_suite(folder)
            caught += not passed
            line = {"mutation": mutation.name, "caught": not passed, "failed": failed}
            print(json.dumps({**line, "seconds": round(seconds, 1)}), flush=True)
    print(f"starter_mutations: {caught}/{len(chosen)} caught")
    return 0 if caught == len(chosen) else EXIT_SURVIVED


def copy(fresh, folder):
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(fresh, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


if __name__ == "__main__":
    sys.exit(main())
