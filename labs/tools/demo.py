"""make demo: the guides told to a room, each one checked against what really happens.

For each guide: its title and what it shows; then each console block's commands with what
they printed (stderr indented below), and the guide's own paragraph after the block; before
the guide's reset, its "What to notice" bullets and a verdict computed from the receiver:
the tickets each operation the guide touched really has. The guide is the only copy of the
prose. The closing lines say what the labs showed and, separately, whether every command
printed what its guide says.

The demo runs in a lab of its own (a temporary folder and a free port; through Docker, the
Compose project stateful-lab-demo), so a learner's lab is never touched, and Ctrl-C at any
point removes what the demo made.

    python -m labs.tools.demo [--backend auto|local|docker] [--step] [GUIDE.md ...]

Exit codes: 0 every command as its guide says; 1 some differ; 3 the lab could not run;
130 stopped with Ctrl-C.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import lab
from labs.tools.backends import LabError, LocalBackend, choose_backend, parse_command
from labs.tools.local import ROOT
from labs.tools.runner import LIFECYCLE, TERMINAL_CODES, parse_block, run_step
from labs.tools.tally import events_in, summary, tally
from workflow import Parser

GUIDES = [
    ROOT / "labs" / name
    for name in ("01-the-duplicate.md", "02-the-keyed-fix.md", "03-a-retry-is-not-a-new-request.md")
]
DOCKER_PROJECT = "stateful-lab-demo"
EXIT_OK, EXIT_DIFFERS, EXIT_USAGE, EXIT_NO_LAB, EXIT_STOPPED = 0, 1, 2, 3, 130
WIDTH = 92
EFFECTS = ("start", "resume", "approve", "post")  # lab.py's actions that can make a ticket
WORKER_EFFECTS = ("run", "wait")  # worker.py's: run makes them, wait reports the background's
SAYS = ("hooks", "reconcile", "messages")  # lab.py's: what they print is part of the verdict
FIGURES = re.compile(r'"(?:ticket_id|created)": (?:\d+|true|false)')


class Style:
    """Bold and colour for a terminal; plain text for pipes, files and NO_COLOR."""

    def __init__(self, enabled):
        self.enabled = enabled

    def wrap(self, code, text):
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def bold(self, text):
        return self.wrap("1", text)

    def dim(self, text):
        return self.wrap("2", text)

    def good(self, text):
        return self.wrap("1;32", text)

    def bad(self, text):
        return self.wrap("1;31", text)

    def figures(self, line):
        """A line of output with its ticket_id and created values in bold."""
        return FIGURES.sub(lambda m: self.bold(m.group(0)), line) if self.enabled else line


def style_for(stream, environ=os.environ):
    return Style(stream.isatty() and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb")


# ------------------------------------------------------------------ the guide as a story


@dataclass
class Chapter:
    """One console block, with the heading above it and the guide's paragraph after it."""

    heading: str
    steps: list
    after: str = ""
    notice: list = field(default_factory=list)  # the "What to notice" bullets, said before it


@dataclass
class Story:
    title: str
    shows: str
    chapters: list


def markdown_items(text):
    """The guide's top-level pieces, in order: (kind, text), kind heading|console|code|text."""
    items, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            kind = "console" if line.strip() == "```console" else "code"
            items.append((kind, "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
        elif line.startswith("#"):
            items.append(("heading", line.lstrip("#").strip()))
            i += 1
        elif line.strip():
            end = i
            while (
                end < len(lines) and lines[end].strip() and not lines[end].startswith(("```", "#"))
            ):
                end += 1
            items.append(("text", "\n".join(lines[i:end])))
            i = end
        else:
            i += 1
    return items


def bullets(text):
    """'- a\\n  b\\n- c' -> ['a b', 'c']"""
    found = []
    for line in text.splitlines():
        if line.startswith("- "):
            found.append(line[2:].strip())
        elif found:
            found[-1] += " " + line.strip()
    return found


def parse_story(text):
    items = markdown_items(text)
    title = next(t for kind, t in items if kind == "heading")
    shows = next((t for kind, t in items if t.startswith("**What it shows.**")), "")
    chapters, heading, notice = [], "", []
    for index, (kind, content) in enumerate(items):
        if kind == "heading":
            heading = content
        elif kind == "text" and heading == "What to notice":
            notice += bullets(content)
        elif kind == "console":
            after = items[index + 1] if index + 1 < len(items) else ("", "")
            said = after[1] if after[0] == "text" and not after[1].startswith("Next:") else ""
            chapters.append(Chapter(heading, parse_block(content), said))
            chapters[-1].notice, notice = notice, []
    if notice and chapters:
        chapters[-1].notice += notice
    return Story(title, shows.removeprefix("**What it shows.**").strip(), chapters)


def plain(text, style):
    """Markdown emphasis, code spans and links as terminal text."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*", lambda m: style.bold(m.group(1)), text)
    return re.sub(r"`([^`]+)`", lambda m: style.bold(m.group(1)), text)


def say(text, style, indent="  ", first=None):
    """A paragraph of the guide, wrapped (escape codes are added after wrapping)."""
    words = " ".join(text.split())
    wrapped = textwrap.fill(words, WIDTH, initial_indent=first or indent, subsequent_indent=indent)
    print(plain(wrapped, style))


# ------------------------------------------------------------------ the verdict, from the receiver


@dataclass
class Operation:
    mode: str
    tickets: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    threads: set = field(default_factory=set)  # a tool's: the titles of the tickets it made
    found: bool = False  # a drill's: it exited 1 (an effect repeated or went missing)
    done: bool = False  # a run said `done` without a ticket (lab 12: the effect silently lost)
    refunds: int = 0  # the receiver's refunds of this operation's charge (lab 13's saga)
    messages: list = field(default_factory=list)  # the texts sent about its ticket (15, 18)
    deliveries: list = field(default_factory=list)  # the relay's answers: created true/false
    makers: list = field(default_factory=list)  # (ticket_id, who) where a worker made it (10)

    @property
    def duplicated(self):
        if self.mode == TOOL:
            return self.found
        repeated = len(set(self.messages)) < len(self.messages)
        return len(self.tickets) > 1 or self.refunds > 1 or repeated

    @property
    def lost(self):
        return self.mode != TOOL and self.done and not self.tickets

    def lessons(self):
        """What the room saw happen to this operation, in plain words, each with its count."""
        said = []
        if self.lost:
            said.append("LOST: the run said done and no ticket was ever made (0 tickets)")
        workers = [f"ticket {t} by {who}" for t, who in self.makers]
        if workers and (len(self.makers) > 1 or self.makers[0][1] != BACKGROUND):
            said.append(", ".join(workers))
        if self.refunds:
            twice = " (the refund ran twice)" if self.refunds > 1 else ""
            said.append(
                f"{self.refunds} refund{'' if self.refunds == 1 else 's'} of its one charge{twice}"
            )
        if self.messages:
            count, same = len(self.messages), max(map(self.messages.count, self.messages))
            again = f", the same one {same} times (a double notice)" if same > 1 else ""
            said.append(f"{count} message{'' if count == 1 else 's'} sent about it{again}")
        if self.deliveries:
            made = sum(self.deliveries)
            said.append(
                f"the relay delivered it {len(self.deliveries)} "
                f"time{'' if len(self.deliveries) == 1 else 's'}, the receiver made {made} "
                f"and answered {len(self.deliveries) - made} from its key"
            )
        return said

    def verdict(self, name):
        count = len(self.tickets)
        if self.mode == TOOL:  # its own threads, summed in one line
            said = []
            if count:
                threads = len(self.threads)
                said.append(
                    f"{count} ticket{'' if count == 1 else 's'} on its own {threads} "
                    f"thread{'' if threads == 1 else 's'}"
                )
            return f"{name}: " + ", ".join(said + self.notes or ["nothing to count"])
        line = f"{name}: {count} ticket{'' if count == 1 else 's'}"
        if count > 1:
            line += " for one operation (duplicate)"
        return ", ".join([line, *self.notes, *self.lessons()])


BACKGROUND = "a background worker"
MAKERS = {
    "worker run": "the worker started by hand (`worker run`)",
    "held": "the frozen worker, once woken",
}
TOOL = "tool"  # a drill's or another tool's command: its tickets are its own, not an operation's
ASK = ":approval"  # an operation's ask for approval (lab.py's ask_approval) is keyed OP:approval


class Ledger:
    """Tickets per operation, counted on the receiver's own ledger: after each command that can
    make a ticket (a workflow's start, resume, approve or post; a worker's run or wait, which
    report what the background workers did), and before each verdict, every ticket the receiver
    holds that was not there before is attributed to an operation by

      1. its key, when the key is an operation a command named (start, post, worker submit);
      2. else the command's own output: a `done` event with its operation_id, or an event with
         a thread (a woken worker's `held_run`), for that ticket_id;
      3. else the command's own operation (its --thread, or its --operation);
      4. else its key as an operation of its own, or "no key" for a ticket nobody can name.

    Keys do not suffice alone: naive mode sends none, node-uuid mode a new one per attempt, and
    a key past the receiver's retention (lab 14) shows as null."""

    def __init__(self):
        self.operations, self.threads, self.seen, self.owners = {}, {}, set(), {}
        self.workers = False  # a worker command ran: tickets at a verdict are the workers'

    def operation(self, command):
        """(action, operation name or None) for a command that can make a ticket or says what
        happened to one, else None."""
        cmd = parse_command(command)
        words = cmd.run_env()[1]  # without `-e K=V` (lab 12)
        if cmd.verb != "run" or words[:1] != ["--rm"] or len(words) < 3:
            return None
        service, words = words[1], words[2:]
        if service == "worker":
            return self.worker(words)
        if service == "drill":  # its own threads: a verdict of its own
            name = tool_name(service, words)
            if name in self.operations:
                name += f" #{sum(n.startswith(name) for n in self.operations) + 1}"
            self.declare(name, TOOL)
            return service, name
        if service == "relay":  # its `answered` events name the operation (the message id)
            return "relay", None
        if service != "workflow":  # `--entrypoint python workflow -c ...`: its own, if any
            return "tool", None
        action, sub = words[0], (words[1:2] or [""])[0]
        if action in ("saga", "outbox") and sub in ("start", "resume"):
            thread = option(words, "--thread")
            if sub == "start":
                mode = option(words, "--mode", "safe" if action == "saga" else "ledger")
                self.declare(option(words, "--operation"), mode, thread)
            return f"{action} {sub}", self.threads.get(thread)
        if action in SAYS or (action, sub) == ("saga", "refunds"):
            return "says", None  # makes nothing: lists what the receiver or the ledger holds
        if action not in EFFECTS:
            return None
        try:
            args = lab.build_parser().parse_args(words)  # lab.py's own defaults
        except SystemExit:
            return None
        if args.action == "start":
            self.declare(args.operation, args.mode, args.thread)
        elif args.action == "post":
            self.declare(args.operation, "post")
        name = args.operation if args.action in ("start", "post") else self.threads.get(args.thread)
        return args.action, name

    def worker(self, words):
        """worker.py: submit names an operation (and makes no ticket); run and wait report the
        background workers' tickets."""
        action, thread = words[0], option(words, "--thread")
        if action == "submit":
            self.declare(option(words, "--operation"), option(words, "--mode", "ledger"), thread)
            return None
        if action not in WORKER_EFFECTS:
            return None
        return f"worker {action}", self.threads.get(thread)

    def declare(self, name, mode, thread=None):
        if name is None:
            return
        self.operations.setdefault(name, Operation(mode))
        if thread is not None:
            self.threads[thread] = name

    def record(self, action, name, stdout, tickets, exit_code=0):
        tool = name is not None and self.operations[name].mode == TOOL
        events = list(events_in(stdout.splitlines()))
        named = {}  # ticket_id -> operation, as the command's own output says
        for event in events:
            if "ticket_id" not in event:
                continue
            if event.get("operation_id"):
                named[event["ticket_id"]] = event["operation_id"]
            elif event.get("thread") in self.threads:
                named[event["ticket_id"]] = self.threads[event["thread"]]
            elif event.get("message_id") in self.operations:  # the relay's (lab 19)
                named[event["ticket_id"]] = event["message_id"]
        for ticket in tickets:
            if ticket["ticket_id"] in self.seen:
                continue
            self.seen.add(ticket["ticket_id"])
            key = ticket["key"]
            asking = (key or "").removesuffix(ASK)
            if key != asking and asking in self.operations:  # lab 07's ask: not its ticket
                self.operations[asking].notes.append("asked for approval once")
                continue
            if (tool or action == "tool") and key not in self.operations:  # its own runs
                if name is None:  # a command of its own (`--entrypoint python`) made one
                    name = f"the command `{' '.join(action.split())}`"
                    self.declare(name, TOOL)
                self.operations[name].tickets.append(ticket["ticket_id"])
                self.operations[name].threads.add(ticket.get("payload", {}).get("title"))
                continue
            owner = (
                key
                if key in self.operations
                else named.get(ticket["ticket_id"]) or name or key or "no key"
            )
            op = self.operations.setdefault(owner, Operation("?"))
            op.tickets.append(ticket["ticket_id"])
            self.owners[ticket["ticket_id"]] = owner
            if action.startswith("worker") or action == "":
                held = any(e["event"] == "held_run" for e in events)
                who = MAKERS.get("held" if held else action, BACKGROUND)
                if op.mode != "?" and (action or self.workers):
                    op.makers.append((ticket["ticket_id"], who))
        if action.startswith("worker"):
            self.workers = True
        self.said(events)
        if tool:
            self.tool_said(self.operations[name], stdout, exit_code)
            return
        kinds = [e["event"] for e in events]
        for event in events:  # each on the command's operation, else the one its key names
            target = name or self.owner_of_key(event.get("key") or "")
            if target is None:
                continue
            op = self.operations.setdefault(target, Operation("?"))
            kind, thing = event["event"], "refund" if "refund_id" in event else "ticket"
            number = event.get("refund_id", event.get("ticket_id"))
            if kind == "reconcile" and event.get("found"):
                ids = ", ".join(map(str, event["found"]))
                note = f"{action} lost the answer and adopted ticket {ids}, found by its key"
            elif kind == "reconcile":
                note = f"{action} lost the answer, found nothing by its key and sent again"
            elif event.get("created") is False and "reconcile" not in kinds:
                note = f"{action} got created: false"
            elif kind == "drained":
                note = f"{action} drained on SIGTERM at a step boundary"
            elif kind == "http_error":
                note = f"{action} refused ({event['status']})"
            elif kind == "done" and "ticket_id" not in event and "delivery" not in event:
                op.done = True
                continue
            elif number is None and kind != "effect_receipt":  # lab 07's ask, say
                continue
            elif kind == "effect_adopted" or event.get("how") == "adopted":
                note = f"{action} adopted {thing} {number}, found by its key"
            elif event.get("how") == "receipt" or (kind == "effect_receipt" and number):
                note = f"{action} took {thing} {number} from the ledger's receipt"
            elif kind == "effect_receipt" and "settled" in event.get("receipt", {}):
                note = f"{action} took the person's answer from the ledger"
            else:
                continue
            if note not in op.notes:
                op.notes.append(note)
        if name is None:
            return
        op = self.operations.setdefault(name, Operation("?"))
        notes = []
        if "sigterm" in kinds and "drained" not in kinds and "done" in kinds:
            notes.append(f"{action} finished its step after SIGTERM")
        if exit_code == 6:
            notes.append(f"{action} stopped for a person (exit 6)")
        if action == "resume" and kinds == ["done"] and not op.done:
            notes.append("resume redid nothing")
        op.notes += [n for n in notes if n not in op.notes]

    def said(self, events):
        """What listing commands and the relay printed, on the operations they concern: the
        receiver's refunds and messages (as listed), a person's settling, the relay's answers."""
        for event in events:
            kind = event["event"]
            if kind == "refunds":
                for op in self.operations.values():
                    op.refunds = 0
                for refund in event["refunds"]:
                    if (owner := self.owners.get(refund["ticket_id"])) is not None:
                        self.operations[owner].refunds += 1
            elif kind == "messages":
                for op in self.operations.values():
                    op.messages = []
                for message in event["messages"]:
                    about = re.match(r"ticket (\d+) ", message.get("text", ""))
                    if about and (owner := self.owners.get(int(about.group(1)))) is not None:
                        self.operations[owner].messages.append(message["text"])
            elif kind == "settled" and (owner := self.owner_of_key(event["key"])):
                note = f"settled by a person ({event['state']})"
                if note not in self.operations[owner].notes:
                    self.operations[owner].notes.append(note)
            elif kind == "answered" and event.get("message_id") in self.operations:
                self.operations[event["message_id"]].deliveries.append(bool(event["created"]))
        self.webhooks(events)

    def webhooks(self, events):
        """lab.py hooks: the status a ticket ends on, against the newest event applied to it."""
        applied = [e for e in events if e["event"] == "webhook" and e.get("applied")]
        for status in (e for e in events if e["event"] == "ticket_status"):
            owner = self.owners.get(status["ticket_id"])
            if owner is None or not applied:
                continue
            newest = max(applied, key=lambda e: e["version"])
            op = self.operations[owner]
            if status["version"] < newest["version"]:
                op.notes.append(
                    f"its status went back from {newest['status']} (v{newest['version']}) "
                    f"to {status['status']} (v{status['version']})"
                )
            again = sum(bool(e.get("duplicate")) for e in events if e["event"] == "webhook")
            if again:
                op.notes.append(f"{again} deliveries seen before, flagged duplicate: true")

    def owner_of_key(self, key):
        """The operation an effect's key belongs to: OPERATION or OPERATION:EFFECT."""
        names = [n for n in self.operations if key == n or key.startswith(n + ":")]
        return max(names, key=len) if names else None

    @staticmethod
    def tool_said(op, stdout, exit_code):
        """A drill's verdict is its own summary line (effectdrill: `summary: ...`); exit 1 says
        it found an effect that repeated or went missing."""
        op.found = op.found or exit_code == 1
        summary = [line for line in stdout.splitlines() if line.startswith("summary: ")]
        if summary:
            op.notes.append("the drill says: " + summary[-1].removeprefix("summary: "))
        elif exit_code:
            op.notes.append(f"exit {exit_code}")


def tool_name(service, words):
    """`drill GRAPH --input '{..."mode": "naive"}' --durability exit` -> 'drill GRAPH naive,
    durability exit': what tells one drill of a guide from the next."""
    name = " ".join([service, *words[: 2 if words[:1] == ["replay"] else 1]])
    try:
        mode = json.loads(option(words, "--input", "{}")).get("mode")
    except (ValueError, AttributeError):
        mode = None
    extra = [mode] if mode else []
    if option(words, "--durability"):
        extra.append(f"durability {option(words, '--durability')}")
    return name + (f" ({', '.join(extra)})" if extra else "")


def option(words, name, default=None):
    """The value after `name` in a command's words (`--thread T`), else default."""
    for word, value in zip(words, words[1:], strict=False):
        if word == name:
            return value
    return default


# ------------------------------------------------------------------ telling it


class Demo:
    def __init__(self, backend, style, step_mode=False):
        self.backend, self.style, self.step_mode = backend, style, step_mode
        self.outcomes, self.operations = [], []
        self.counts = tally([])  # what the workflow and the workers did (labs.tools.tally)

    def tell(self, path):
        s = self.style
        story = parse_story(Path(path).read_text(encoding="utf-8"))
        print("\n" + s.bold(f"=== {story.title} ==="))
        if story.shows:
            say(story.shows, s)
        ledger = Ledger()
        heading = None
        for chapter in story.chapters:
            if chapter.notice:
                print("\n" + s.bold("What to notice"))
                for bullet in chapter.notice:
                    say(bullet, s, "    ", "  - ")
                self.verdict(ledger)
            if chapter.heading != heading and chapter.heading != story.title:
                heading = chapter.heading
                print("\n" + s.bold(f"-- {heading}"))
            for step in chapter.steps:
                self.run(step, ledger)
            if chapter.after:
                print()
                say(chapter.after, s)
        if not any(c.notice for c in story.chapters):
            self.verdict(ledger)

    def run(self, step, ledger):
        s = self.style
        print(f"\n$ {step.command}")
        native = None  # Compose runs the command as written: no other line to show
        if isinstance(self.backend, LocalBackend):
            native = self.backend.native(step.command)
        if native:
            print(s.dim(f"  natively: {native}"))
        if self.step_mode:
            input(s.dim("  (Enter to run) "))
        effect = ledger.operation(step.command)
        verb = parse_command(step.command).verb
        building = verb == "up" and self.backend.name == "docker"
        if building:
            print(s.dim("  building the image..."), end="", flush=True)
        began = time.monotonic()
        result = outcome = run_step(step, self.backend)
        if building:
            print(s.dim(f" {time.monotonic() - began:.1f} s"))
        self.outcomes.append(outcome)
        lifecycle = verb in LIFECYCLE  # Compose's own output (build steps, progress): not the story
        #                                 (`logs api` is: the receiver's side, lab 02's `replayed`)
        for line in [] if lifecycle else result.stdout.splitlines():
            print(s.figures(TERMINAL_CODES.sub("", line)))  # `logs`: Compose 2 erases each line
        said = result.stderr.strip().splitlines()
        if lifecycle:  # only when it failed, and only its last words
            said = (
                (result.stdout + result.stderr).strip().splitlines()[-5:]
                if outcome.problems
                else []
            )
        for line in said:
            print(s.dim(f"  stderr: {line}"))
        if result.exit_code:
            print(s.bold(f"[exit {result.exit_code}]"))
        for problem in outcome.problems:
            print(s.bad(f"  !! {problem}; the guide says:"))
            for line in step.expected + ([f"[exit {step.exit_code}]"] if step.exit_code else []):
                print(f"     {line}")
        if effect:
            tickets = [] if effect[0] == "says" else self.backend.tickets()
            ledger.record(*effect, result.stdout, tickets, result.exit_code)
        self.count(step.command, result)

    def count(self, command, result):
        """Add the command's events to the tally; lab.py prints no event when a run starts or
        resumes, so its start, resume and approve commands count as such (a usage or thread
        mistake, exit 2 or 4, ran nothing)."""
        cmd = parse_command(command)
        if cmd.verb != "run":
            return
        self.counts += tally(events_in(result.stdout.splitlines()))
        if cmd.args[1:2] == ["workflow"] and result.exit_code not in (2, 4):
            action = cmd.args[2] if len(cmd.args) > 2 else ""
            if action == "start":
                self.counts["started"] += 1
            elif action in ("resume", "approve"):
                self.counts["resumed"] += 1

    def verdict(self, ledger):
        s = self.style
        try:  # tickets no command reported (a background worker's): counted by their key
            ledger.record("", None, "", self.backend.tickets())
        except LabError as error:
            print(s.dim(f"  (the receiver did not answer for the last count: {error})"))
        print("\n" + s.bold("Verdict, counted on the receiver"))
        for name, op in ledger.operations.items():
            line = op.verdict(name)
            print("  " + (s.bad(line) if op.duplicated else s.good(line)))
            self.operations.append(op)
        if not ledger.operations:
            print("  no operation made a ticket")

    def closing(self, guides):
        s = self.style
        modes = {}
        for op in self.operations:
            total, duplicated, lost = modes.get(op.mode, (0, 0, 0))
            modes[op.mode] = (total + 1, duplicated + op.duplicated, lost + op.lost)
        shown = "; ".join(
            f"{dup} of {total} drill{'' if total == 1 else 's'} found an effect repeated or lost"
            if mode == TOOL
            else f"{mode}: {dup} of {total} operation{'' if total == 1 else 's'} duplicated"
            + (f", {lost} lost" if lost else "")
            for mode, (total, dup, lost) in modes.items()
        )
        print("\n" + s.bold(f"What the labs showed: {shown or 'no operation made a ticket'}"))
        print(f"What the workflow did (labs.tools.tally): {summary(self.counts)}")
        wrong = [o for o in self.outcomes if not o.ok]
        where = f"{len(guides)} guide{'' if len(guides) == 1 else 's'}, {self.backend.name} backend"
        if wrong:
            matched = s.bad(
                f"{len(wrong)} of {len(self.outcomes)} commands differ from the guides (!! above)"
            )
        else:
            matched = s.good(f"all {len(self.outcomes)} commands printed what the guides say")
        print(f"Output against the guides ({where}): {matched}")
        return EXIT_DIFFERS if wrong else EXIT_OK


def introduce(backend, why):
    if backend.name == "docker":
        where = (
            f"The guides' commands run in the Compose project {backend.project}, not "
            "stateful-lab: your own lab is left alone."
        )
    else:
        where = (
            f"The receiver runs on 127.0.0.1:{backend.port} with its data in {backend.data_dir}; "
            "the `natively:` lines are the same commands with the defaults (data/, port 8000), "
            "to paste."
        )
    print(f"backend: {backend.name} ({why}). {where}")


def main(argv=None):
    parser = Parser(prog="python -m labs.tools.demo", description="Tell the lab guides to a room.")
    parser.add_argument("guides", nargs="*", type=Path, default=GUIDES)
    parser.add_argument("--backend", choices=("auto", "local", "docker"), default="auto")
    parser.add_argument("--step", action="store_true", help="wait for Enter before each command")
    parser.add_argument("--port", type=int, help="local backend: this port (default: a free one)")
    parser.add_argument("--project", default=DOCKER_PROJECT, help="docker backend: the project")
    args = parser.parse_args(argv)
    missing = [str(g) for g in args.guides if not g.is_file()]
    if missing:  # before anything starts: one line, and nothing to clean up
        print(
            f"demo: no such guide {', '.join(missing)}; the guides are labs/NN-*.md",
            file=sys.stderr,
        )
        return EXIT_USAGE
    style = style_for(sys.stdout)
    backend = code = None
    try:
        backend, why = choose_backend(args.backend, args.project, args.port)
        introduce(backend, why)
        if backend.name == "docker":
            backend.down()  # what an interrupted demo may have left
        demo = Demo(backend, style, args.step)
        for guide in args.guides:
            demo.tell(guide)
        code = demo.closing(args.guides)
    except (KeyboardInterrupt, EOFError):
        code = None
    except (LabError, ValueError, subprocess.TimeoutExpired) as error:
        print(f"demo: {error}", file=sys.stderr)
        code = EXIT_NO_LAB
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # clean up uninterrupted
        left = []
        if backend is not None:
            backend.close()
            left = backend.leftovers()  # looked at, not assumed: see DockerBackend.down
        signal.signal(signal.SIGINT, previous)
    if left:
        how = f" (docker compose -p {backend.project} down -v --remove-orphans)"
        print(
            f"demo: left behind: {', '.join(left)}{how if backend.name == 'docker' else ''}",
            file=sys.stderr,
        )
    if code is None:
        print(f"demo stopped; {'see above' if left else 'nothing left behind'}", file=sys.stderr)
        return EXIT_STOPPED
    return code


if __name__ == "__main__":
    sys.exit(main())
