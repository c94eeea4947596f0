"""make demo: the guides told to a room, each one checked against what really happens.

For each guide: its title and what it shows; then each console block's commands with what
they printed (stderr indented below), and the guide's own paragraph after the block (a section
with no command is told as text where the guide has it); before
the guide's reset, its "What to notice" bullets and a verdict computed from the receiver:
the tickets each operation the guide touched really has. The guide is the only copy of the
prose. The closing lines say what the labs showed and, separately, whether every command
printed what its guide says.

The demo runs in a lab of its own (a temporary folder and a free port; through Docker, the
Compose project stateful-lab-demo), so a learner's lab is never touched, and Ctrl-C at any
point removes what the demo made.

    python -m tools.demo [--backend auto|local|docker] [--step] [--projector|--plain]
        [--stderr] [--times FILE.json] [--pictures DIR] [GUIDE.md ...]

On a terminal it tells in projector mode (see Demo); --plain, the default for a pipe or a file,
prints everything as the guide has it. The verdict says each lab's lesson from what its
commands printed and the receiver holds (TicketsByOperation, Operation.lessons): the tickets and
refunds of each operation, what the ledger answered, a drain, a run that said done with no
ticket, the relay's deliveries, the messages a customer got, a status that went back; a drill's
own crash runs are its own line. --times adds each guide's wall time (and the backend, the
commit and the load) to a JSON file (tools/workshop-times.json is one, for labs/WORKSHOP.md);
--pictures writes each guide's timeline as DIR/lab-NN.svg and each drill's HTML report
(effectdrill --html) beside it (through Docker, by the drill service's /reports, which
compose.yaml binds to DIR when LAB_REPORTS names it).

Exit codes: 0 every command as its guide says; 1 some differ; 2 a guide that does not exist;
3 the lab could not run; 130 stopped with Ctrl-C. Through `make demo` on a terminal, make gets
the Ctrl-C too and dies of it once the demo has cleaned up, so the shell sees 130 from make and
make adds no "Error 130" (MakeParent).
"""

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from commandline import Parser
from labs import cli as lab
from labs.approval import EXIT_NOT_AUTHORIZED as NOT_AUTHORIZED
from tools import drilltable, safefiles
from tools.backends import (
    LEARNER_PROJECT,
    LabError,
    LocalBackend,
    choose_backend,
    parse_command,
)
from tools.local import ROOT
from tools.runner import LIFECYCLE, TERMINAL_CODES, Step, parse_block, run_step
from tools.tally import events_in, tally, tally_line

GUIDES = [
    ROOT / "labs" / name
    for name in ("01-the-duplicate.md", "02-the-keyed-fix.md", "03-a-retry-is-not-a-new-request.md")
]
DOCKER_PROJECT = "stateful-lab-demo"
COMPOSE_PROJECT = re.compile(r"[a-z0-9][a-z0-9_-]*")  # Compose v2's project name rule
IMAGE_GROUP = 10001  # the image's group, lab (Dockerfile: groupadd --gid 10001 lab)
EXIT_OK, EXIT_DIFFERS, EXIT_USAGE, EXIT_NO_LAB, EXIT_STOPPED = 0, 1, 2, 3, 130
WIDTH = 92
EFFECTS = ("start", "resume", "approve", "post")  # labs/cli.py's actions that can make a ticket
WORKER_EFFECTS = ("run", "wait")  # labs/workers.py's: run makes them, wait reports the background's
SAYS = ("hooks", "reconcile", "messages", "payments")  # labs/cli.py's: part of the verdict
FOLDED = re.compile(r".*\(checked against langgraph ")  # "What LangGraph does here (checked ...)"
END_OF_TABLE = re.compile(r"(requests|summary): ")  # the drill's lines after a table
FOLD_LINES = 20  # projector mode: a command's output longer than this is folded
FOLD_KEEP = 16  # a folded `logs`: its last lines stay
LISTS = (
    "tickets",
    "messages",
    "refunds",
    "payments",
    "jobs",
)  # labs/cli.py's, labs/workers.py's listings
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
    after: str = ""  # every paragraph, list and table up to the next block or heading
    notice: list = field(default_factory=list)  # the "What to notice" bullets, said before it
    before: str = ""  # the guide's text between the heading and the block

    @property
    def folded(self):
        """A section on LangGraph's own source: one line in projector mode, opened on request."""
        return bool(FOLDED.match(self.heading))


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
            section = list(itertools.takewhile(lambda i: i[0] != "heading", items[index + 1 :]))
            told = [t if k == "text" else textwrap.indent(t.rstrip(), "    ") for k, t in section]
            if index and heading != "What to notice" and told and "console" not in dict(section):
                chapters.append(Chapter(heading, [], before="\n\n".join(told)))  # no command
        elif kind == "text" and heading == "What to notice":
            notice += bullets(content)
        elif kind == "console":
            after = []
            for later, text in items[index + 1 :]:
                if later != "text" or text.startswith("Next:"):
                    break
                after.append(text)
            before = []
            for earlier, text in reversed(items[:index]):
                if earlier != "text":
                    break
                before.insert(0, text)
            chapters.append(Chapter(heading, parse_block(content), "\n\n".join(after)))
            chapters[-1].notice, notice = notice, []
            chapters[-1].before = "\n\n".join(before)
    if notice and chapters:
        chapters[-1].notice += notice
    return Story(title, shows.removeprefix("**What it shows.**").strip(), chapters)


def plain(text, style):
    """Markdown emphasis, code spans and links as terminal text."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*", lambda m: style.bold(m.group(1)), text)
    return re.sub(r"`([^`]+)`", lambda m: style.bold(m.group(1)), text)


def wrap_paragraph(text, style, indent="  ", first=None, width=WIDTH):
    """A paragraph of the guide, wrapped (escape codes are added after wrapping)."""
    words = " ".join(text.split())  # never broken at a hyphen: `--remove-orphans`, `term-at:`
    wrapped = textwrap.fill(
        words,
        width,
        initial_indent=first or indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    print(plain(wrapped, style))


def shown_command(command, width=WIDTH):
    """'$ COMMAND' in lines of at most `width` where it can (a word longer stays whole), broken
    between the shell's words with ` \\`: pasted, it is the same command (a quoted JSON
    argument is one word, never broken inside its quotes)."""
    words, word, quote = [], "", None
    for char in command:  # split at whitespace outside quotes, each word as written
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char.isspace():
            words, word = words + [word] * bool(word), ""
            continue
        word += char
    words += [word] * bool(word)
    lines, line = [], "$"
    for word in words:
        if line.strip() not in ("$", "") and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    return "\n".join(lines + [line])


def fitted(line, width, indent="    "):
    """A line longer than `width` (when given) as lines broken between words, the rest under
    `indent`: the terminal would break it mid-word (a drill's summary, labs/cli.py's stderr, a long
    JSON event). A word longer than the width stays whole."""
    if not width or len(line) <= width:
        return [line]
    return textwrap.wrap(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def pieces(text):
    """The guide's text as written: ('para'|'bullet'|'table'|'code', text) in order, so that a
    list stays a list and a table a table (`- ` items with their indented lines; `|` rows;
    lines indented four spaces, a graph's shape)."""
    found = []
    for line in text.splitlines():
        if not line.strip():
            found.append(("gap", ""))
        elif line.startswith(("- ", "* ")) or re.match(r"\d+\. ", line):
            found.append(("bullet", line))
        elif line.startswith("|"):
            found.append(("table", line))
        elif line.startswith("    ") and (not found or found[-1][0] in ("code", "gap")):
            found.append(("code", line))
        elif found and found[-1][0] in ("bullet", "para"):
            found[-1] = (found[-1][0], found[-1][1] + " " + line.strip())
        else:
            found.append(("para", line))
    return [(kind, text) for kind, text in found if kind != "gap"]


def tell_text(text, style, width=WIDTH):
    """Paragraphs wrapped, each list item on its own lines, tables and code as written; a blank
    line where the guide has one between a paragraph and what follows."""
    last = None
    for kind, piece in pieces(text):
        if last is not None and (kind != last or kind == "para"):
            print()
        last = kind
        if kind == "bullet":
            mark, _, rest = piece.partition(" ")
            first = f"  {mark} "  # a numbered item's lines under its text, as a bullet's are
            wrap_paragraph(rest, style, " " * len(first), first, width)
        elif kind in ("table", "code"):
            print(plain("  " + piece.rstrip(), style))
        else:
            wrap_paragraph(piece, style, width=width)


def fit_tables(lines, width):
    """The drill's tables (a header `point ...` or `thread ...`, rows to the next blank line),
    where a row is wider than the terminal: each column only as wide as its widest cell, two
    spaces between, and if that is still too wide the last column's cells (then the one before)
    wrapped onto lines of their own within it, as the drill wraps a long cell."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].startswith(("point ", "thread ")):
            out.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip() and not END_OF_TABLE.match(lines[end]):
            end += 1
        block = lines[i:end]
        if max(map(len, block)) > width:
            block = fit_table(block, width)
        out += block
        i = end
    return out


def fit_table(block, width):
    starts = [0] + [m.end() for m in re.finditer(r"  +(?=\S)", block[0])]
    ends = starts[1:] + [None]
    rows = [[row[a:b].rstrip() for a, b in zip(starts, ends, strict=True)] for row in block]
    widths = [max(len(row[c]) for row in rows) for c in range(len(starts))]
    for c in reversed(range(len(widths))):  # the verdict first, then leftwards
        excess = sum(widths) + 2 * (len(widths) - 1) - width
        if excess <= 0:
            break
        groups = row_groups(rows)
        header = groups[0]  # the header and its `(clean N)` line: never wrapped
        longest = max(
            [len(word) + 2 for row in rows for word in row[c].split()]
            + [len(row[c].strip()) for row in header]
        )
        if max(longest, widths[c] - excess) >= widths[c]:
            continue  # no narrower than its longest word (and the indent of a wrapped line)
        widths[c] = max(longest, widths[c] - excess)
        wrapped = []
        for group in groups:  # a row and the lines its long cells wrapped onto
            if group is header:
                wrapped += group
                continue
            text = " ".join(row[c].strip() for row in group if row[c].strip())
            parts = textwrap.wrap(text, widths[c] - 2) or [""]
            parts = parts[:1] + ["  " + part for part in parts[1:]]
            group += [[""] * len(widths) for _ in range(len(parts) - len(group))]
            for index, row in enumerate(group):
                row[c] = parts[index] if index < len(parts) else ""
            wrapped += group
        rows = wrapped
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def row_groups(rows):
    """A table's rows grouped: each starts with a row whose first cell starts at the margin."""
    groups = []
    for row in rows:
        if groups and not row[0][:1].strip():
            groups[-1].append(list(row))
        else:
            groups.append([list(row)])
    return groups


class Counted(contextlib.redirect_stdout):
    """Print as usual, and count the lines printed (Demo.page keeps them on screen)."""

    def __init__(self):
        super().__init__(self)
        self.lines, self.out = 0, sys.stdout

    def write(self, text):
        self.lines += text.count("\n")
        return self.out.write(text)

    def flush(self):
        self.out.flush()


class Running:
    """A live `running... N s` line under a command that takes more than a couple of seconds
    (a terminal only), erased when it ends; `building the image... N s` from the first second
    while Compose builds (a minute on a cold engine)."""

    AFTER_S = 2

    def __init__(self, enabled, doing="running", after_s=AFTER_S):
        self.enabled, self.stop = enabled, threading.Event()
        self.doing, self.after_s = doing, after_s

    def __enter__(self):
        if self.enabled:
            self.began = time.monotonic()
            self.thread = threading.Thread(target=self.show, daemon=True)
            self.thread.start()
        return self

    def show(self):
        shown = False
        while not self.stop.wait(1):
            elapsed = time.monotonic() - self.began
            if elapsed >= self.after_s:
                print(f"\r  {self.doing}... {elapsed:.0f} s", end="", flush=True)
                shown = True
        if shown:
            print("\r\033[K", end="", flush=True)

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()


@contextlib.contextmanager
def keys_unseen(fd=None):
    """While a command runs, keys typed on the terminal are not echoed: an Enter pressed twice
    would print an empty line into the command's output and push the `running... N s` line up,
    out of reach of its erasing. The next prompt drops them (Demo.prompt); Ctrl-C still works
    (ISIG is left on), and the terminal's echo is put back however the command ends."""
    try:
        fd = sys.stdin.fileno() if fd is None else fd
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (OSError, ValueError, io.UnsupportedOperation, termios.error):
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    with ignoring(signal.SIGTTOU), contextlib.suppress(termios.error):
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with ignoring(signal.SIGTTOU), contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, saved)


# ------------------------------------------------------------------ the verdict, from the receiver


def other_receipt(event):
    """An effect_receipt's answer for an effect other than the ticket: {"message_id": 1}."""
    if isinstance(event.get("receipt"), dict):
        return event["receipt"]
    return {k: v for k, v in event.items() if k.endswith("_id") and k != "ticket_id"}


@dataclass
class Operation:
    mode: str
    tickets: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    threads: set = field(default_factory=set)  # a tool's: the titles of the tickets it made
    found: bool = False  # a drill's: it exited 1 (an effect repeated or went missing)
    refused: bool = False  # a drill's: it did not run (exit 2, a usage mistake)
    done: bool = False  # a run said `done` without a ticket (lab 12: the effect silently lost)
    refunds: int = 0  # the receiver's refunds of this operation's charge (lab 13's saga)
    releases: int = 0  # the receiver's releases of its reservation (lab 13's saga)
    forward: list = field(default_factory=list)  # (thing, id) its saga made, in order (13)
    undos: list = field(default_factory=list)  # (undo, id) its saga made, in order (13)
    messages: list = field(default_factory=list)  # the texts sent about its ticket (15, 18)
    charges: list = field(default_factory=list)  # the provider's payment ids for it (lab 15)
    deliveries: list = field(default_factory=list)  # the relay's answers: created true/false
    makers: list = field(default_factory=list)  # (ticket_id, who) where a worker made it (10)
    sent: dict = field(default_factory=dict)  # a drill's: messages to each of its threads (20)
    keys: list = field(default_factory=list)  # the key each of its tickets carries (05)

    @property
    def duplicated(self):
        if self.mode == TOOL:
            return self.found
        repeated = len(set(self.messages)) < len(self.messages)
        twice = self.refunds > 1 or self.releases > 1 or len(self.charges) > 1
        undone = [undo for undo, _ in self.undos]
        return len(self.tickets) > 1 or twice or repeated or len(set(undone)) < len(undone)

    @property
    def lost(self):
        return self.mode != TOOL and self.done and not self.tickets

    def lessons(self, name):
        """What the room saw happen to this operation, in plain words, each with its count."""
        findings = []
        if len(set(self.keys)) > 1 and None not in self.keys and name not in self.keys:
            keys = len(set(self.keys))  # lab 05's node-uuid: a key made up on each attempt
            findings.append(
                f"under {keys} different keys, none the operation's (to the receiver, "
                f"{keys} operations)"
            )
        forgotten = set(self.keys) <= {name, None}  # a key no longer held shows as null (14)
        if self.mode in ("safe", "ledger") and len(self.tickets) > 1 and forgotten:
            findings.append("the receiver made a new ticket for a key it no longer held (expired)")
        if self.lost:
            findings.append("LOST: the run said done and no ticket was ever made (0 tickets)")
        workers = [f"ticket {t} by {who}" for t, who in self.makers]
        if workers and (len(self.makers) > 1 or self.makers[0][1] != BACKGROUND):
            findings.append(", ".join(workers))
        if self.undos:
            findings.append(self.undone())
        if self.releases:
            twice = " (the release ran twice: it freed seats nobody held)"
            findings.append(
                f"{self.releases} release{'' if self.releases == 1 else 's'} of its one "
                f"reservation{twice if self.releases > 1 else ''}"
            )
        if self.refunds:
            twice = " (the refund ran twice)" if self.refunds > 1 else ""
            findings.append(
                f"{self.refunds} refund{'' if self.refunds == 1 else 's'} of its one charge{twice}"
            )
        if self.charges:
            twice = f" (charged {len(self.charges)} times)" if len(self.charges) > 1 else ""
            findings.append(
                f"{len(self.charges)} charge{'' if len(self.charges) == 1 else 's'} for its one "
                f"payment{twice}"
            )
        if self.messages:
            count, same = len(self.messages), max(map(self.messages.count, self.messages))
            again = f", the same one {same} times (a double notice)" if same > 1 else ""
            findings.append(f"{count} message{'' if count == 1 else 's'} sent about it{again}")
        if self.deliveries:
            made = sum(self.deliveries)
            findings.append(
                f"the relay delivered it {len(self.deliveries)} "
                f"time{'' if len(self.deliveries) == 1 else 's'}, the receiver made {made} "
                f"and answered {len(self.deliveries) - made} from its key"
            )
        return findings

    def undone(self):
        """Lab 13's lesson: 'undone in reverse order: release 3, then refund 3', checked
        against the order its steps made what each undo undoes."""
        kinds = list(dict.fromkeys(undo for undo, _ in self.undos))
        ids = {k: [str(i) for undo, i in self.undos if undo == k] for k in kinds}
        said = ", then ".join(
            f"{k}{'s' if len(v) > 1 else ''} {' and '.join(v)}" for k, v in ids.items()
        )
        made = [UNDOES[k] for k in kinds]
        steps = list(dict.fromkeys(thing for thing, _ in self.forward))
        reverse = made == [thing for thing in reversed(steps) if thing in made]
        once = ", each once" if all(len(v) == 1 for v in ids.values()) else ""
        return f"undone {'in reverse order' if reverse else 'NOT in reverse order'}: {said}{once}"

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
            if self.sent:  # POST /messages: the drill's threads are their `to` (lab 20)
                said.append(sent_line(self.sent))
            return f"{name}: " + ", ".join(said + self.notes or ["nothing to count"])
        line = f"{name}: {count} ticket{'' if count == 1 else 's'}"
        if count > 1:
            line += " for one operation (duplicate)"
        return ", ".join([line, *self.notes, *self.lessons(name)])


def sent_line(sent):
    """'66 messages to its own 21 threads (its clean run's got 3, each crash run's 3 to 5)'.
    effectdrill names its clean run's thread drill-RUN-MODE-clean (effectdrill/runs.py)."""
    total, threads = sum(sent.values()), len(sent)
    line = f"{total} message{'' if total == 1 else 's'} to its own {threads} thread"
    line += "" if threads == 1 else "s"
    clean = [n for to, n in sent.items() if to.endswith("-clean")]
    crashes = sorted(n for to, n in sent.items() if not to.endswith("-clean"))
    parts = [f"its clean run's got {sum(clean)}"] if clean else []
    if crashes:
        low, high = crashes[0], crashes[-1]
        parts.append(f"each crash run's {low if low == high else f'{low} to {high}'}")
    return line + (f" ({', '.join(parts)})" if parts else "")


BACKGROUND = "a background worker"
MAKERS = {
    "worker run": "the worker started by hand (`worker run`)",
    "held": "the frozen worker, once woken",
}
AGAIN = ("start", "resume", "approve")  # labs/cli.py's commands that may send an effect again
TOOL = "tool"  # a drill's or another tool's command: its tickets are its own, not an operation's
ASK = (
    ":approval"  # an operation's ask for approval (labs/cli.py's ask_approval) is keyed OP:approval
)
SAGA_MADE = {"charged": "ticket", "reserved": "reservation", "shipped": "shipment"}  # lab 13
UNDOES = {"release": "reservation", "refund": "ticket"}  # each undo, and what it undoes
UNDONE = {"released": "release", "refunded": "refund"}
THINGS = ("release", "refund", "shipment", "reservation", "ticket")  # an event's id, first found


class TicketsByOperation:
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
        self.reservations = {}  # reservation_id -> the operation whose saga made it (lab 13)
        self.workers = False  # a worker command ran: tickets at a verdict are the workers'
        self.messages_seen = set()  # message ids already counted (a drill's: sent_to)

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
        if action in SAYS or (action, sub) in (("saga", "refunds"), ("saga", "releases")):
            return "says", None  # makes nothing: lists what the receiver or the ledger holds
        if action not in EFFECTS:
            return None
        try:
            args = lab.build_lab_parser().parse_args(words)  # labs/cli.py's own defaults
        except SystemExit:
            return None
        if args.action == "start":
            self.declare(args.operation, args.mode, args.thread)
        elif args.action == "post":
            self.declare(args.operation, "post")
        name = args.operation if args.action in ("start", "post") else self.threads.get(args.thread)
        return args.action, name

    def worker(self, words):
        """labs.workers: submit names an operation (and makes no ticket); run and wait report the
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

    def record(self, action, name, stdout, tickets, exit_code=0, stderr=""):
        tool = name is not None and self.operations[name].mode == TOOL
        events = list(events_in(stdout.splitlines()))
        had = {n: len(op.tickets) for n, op in self.operations.items()}  # before this command
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
            op.keys.append(key)
            self.owners[ticket["ticket_id"]] = owner
            if action.startswith("worker") or action == "":
                held = any(e["event"] == "held_run" for e in events)
                who = MAKERS.get("held" if held else action, BACKGROUND)
                if op.mode != "?" and (action or self.workers):
                    op.makers.append((ticket["ticket_id"], who))
        if action.startswith("worker"):
            self.workers = True
        for owner, before in had.items():  # the room's duplicate, said as it happened
            op = self.operations[owner]
            if before and len(op.tickets) > before and action in AGAIN:
                made = ", ".join(map(str, op.tickets[before:]))
                note = (
                    f"{action} sent it again (ticket{'s' * (len(op.tickets) - before > 1)} {made})"
                )
                op.notes.append(note)
        self.said(events)
        if tool:
            self.tool_said(self.operations[name], stdout, exit_code, stderr)
            return
        kinds = [e["event"] for e in events]
        for event in events:  # each on the command's operation, else the one its key names
            target = name or self.owner_of_key(event.get("key") or "")
            if target is None:
                continue
            op = self.operations.setdefault(target, Operation("?"))
            kind = event["event"]
            thing = next((t for t in THINGS if f"{t}_id" in event), "ticket")
            number = event.get(f"{thing}_id")
            self.saga_made(op, target, kind, event)
            if kind == "crash":  # labs/cli.py's --crash-at: SIGKILL at a named point (exit 137)
                note = f"{action} killed at {event['at']}"
            elif kind == "held_run" and not event.get("sent"):  # lab 10: the woken worker
                note = f"{MAKERS['held']}, sent nothing (the ledger held ticket {number}'s receipt)"
            elif kind == "held_run" and event.get("created") is False:
                note = f"{MAKERS['held']}, sent it again and got created: false (the key)"
            elif kind == "reconcile" and event.get("found"):
                ids = ", ".join(map(str, event["found"]))
                note = f"{action} lost the answer and adopted ticket {ids}, found by its key"
            elif kind == "reconcile":
                note = f"{action} lost the answer, found nothing by its key and sent again"
            elif event.get("created") is False and "reconcile" not in kinds:
                note = f"{action} sent it again and got created: false (the key)"
            elif kind == "drained":
                note = f"{action} drained on SIGTERM at a step boundary"
            elif kind == "http_error":
                note = f"{action} refused ({event['status']})"
            elif kind == "after_ack_failed":  # lab 17: no crash, the node's RetryPolicy
                error = str(event.get("error", "")).split(":")[0]
                note = (
                    f"{action}'s node failed after the answer ({error}) and LangGraph ran it again"
                )
            elif kind == "done" and "ticket_id" not in event and "delivery" not in event:
                op.done = True
                continue
            elif number is None and kind != "effect_receipt":  # lab 07's ask, say
                continue
            elif kind == "effect_ack" and event.get("authorized"):  # lab 07's bound approval
                note = f"{action} sent it under {event['authorized']}"
            elif kind == "effect_adopted" or event.get("how") == "adopted":
                note = f"{action} adopted {thing} {number}, found by its key"
            elif event.get("how") == "receipt" or (kind == "effect_receipt" and number):
                note = f"{action} took {thing} {number} from the ledger's receipt"
            elif kind == "effect_receipt" and len(receipt := other_receipt(event)) == 1:
                # a receipt of another effect than the ticket (lab 15's message, which a person
                # may have recorded, or its payment): {"message_id": 1} reads "message 1"
                ((field, value),) = receipt.items()
                note = (
                    f"{action} took {field.removesuffix('_id')} {value} from the ledger's receipt"
                )
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
        if exit_code == 3:  # the request may or may not have taken effect (labs 06 and 15)
            notes.append(f"{action} got no answer (exit 3)")
        if exit_code == 6:
            notes.append(f"{action} stopped for a person (exit 6)")
        if exit_code == 4 and "no thread" in stderr:  # lab 04: "exit" durability saved nothing
            notes.append(f"{action} found no thread to resume (exit 4)")
        if exit_code == NOT_AUTHORIZED:  # lab 07's bound approval: refused before the send
            why = stderr.partition(" not sent: ")[2].partition("; ")[0]
            notes.append(f"{action} refused (exit {exit_code}): {why}, nothing sent")
        if exit_code == 65:  # lab 12's resume contract: another graph, or another key derivation
            other = "key derivation" if "keeps its keys" in stderr else "graph"
            notes.append(f"{action} refused: the thread was saved under another {other} (exit 65)")
        if action == "resume" and kinds == ["done"] and not op.done:
            notes.append("resume redid nothing")
        op.notes += [n for n in notes if n not in op.notes]

    def saga_made(self, op, name, kind, event):
        """Lab 13: what the saga made forward and undid backward, each (thing, id) once, in
        the order the commands said it; the reservations' owners, for `saga releases`."""
        if kind in SAGA_MADE:
            made, into = SAGA_MADE[kind], op.forward
        elif kind in UNDONE:
            made, into = UNDONE[kind], op.undos
        else:
            return
        pair = (made, event[f"{made}_id"])
        if pair not in into:
            into.append(pair)
        if made == "reservation":
            self.reservations[pair[1]] = name

    def sent_to(self, name, messages):
        """A drill's messages: those to its own threads (effectdrill's drill-RUN-..., which no
        other command names) that no earlier drill counted."""
        for message in messages:
            if message["message_id"] in self.messages_seen:
                continue
            if str(message.get("to", "")).startswith("drill-"):
                self.messages_seen.add(message["message_id"])
                sent = self.operations[name].sent
                sent[message["to"]] = sent.get(message["to"], 0) + 1

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
            elif kind == "releases":  # lab 13's: each on the saga that made its reservation
                for op in self.operations.values():
                    op.releases = 0
                for release in event["releases"]:
                    if (owner := self.reservations.get(release["reservation_id"])) is not None:
                        self.operations[owner].releases += 1
            elif kind == "messages":
                for op in self.operations.values():
                    op.messages = []
                for message in event["messages"]:
                    about = re.match(r"ticket (\d+) ", message.get("text", ""))
                    if about and (owner := self.owners.get(int(about.group(1)))) is not None:
                        self.operations[owner].messages.append(message["text"])
            elif kind == "payments":  # the provider's charges by reference, the payment's key
                charged = {}
                for payment in event["payments"]:
                    if (owner := self.owner_of_key(payment["reference"])) is not None:
                        charged.setdefault(owner, []).append(payment["payment_id"])
                for owner, ids in charged.items():  # a listing of one reference: only its own
                    self.operations[owner].charges = ids
            elif kind == "reconciled" and event.get("now") == "confirmed":
                if (owner := self.owner_of_key(event["key"])) is not None:
                    note = "reconcile found it at the provider (confirmed)"
                    if note not in self.operations[owner].notes:
                        self.operations[owner].notes.append(note)
            elif kind == "settled" and (owner := self.owner_of_key(event["key"])):
                note = f"settled by a person ({event['state']})"
                if note not in self.operations[owner].notes:
                    self.operations[owner].notes.append(note)
            elif kind == "answered" and event.get("message_id") in self.operations:
                self.operations[event["message_id"]].deliveries.append(bool(event["created"]))
        self.webhooks(events)

    def webhooks(self, events):
        """labs hooks: the status a ticket ends on, against the newest event applied to it;
        deliveries refused (a 403: another secret); and the endpoint's mode, which is the
        lesson's (lab 18: the naive endpoint applies every delivery, the inbox's flags each
        with "duplicate"), so the closing line counts by it, not by the ticket's `start`."""
        applied = [e for e in events if e["event"] == "webhook" and e.get("applied")]
        refused = [e for e in events if e["event"] == "webhook_refused"]
        for status in (e for e in events if e["event"] == "ticket_status"):
            owner = self.owners.get(status["ticket_id"])
            if owner is None:
                continue
            op = self.operations[owner]
            if refused:
                op.notes.append(
                    f"{len(refused)} deliver{'y' if len(refused) == 1 else 'ies'} refused "
                    f"({refused[0]['status']}), nothing applied"
                )
            if not applied:
                continue
            naive = any("duplicate" not in e for e in applied)
            op.mode = "webhooks, naive endpoint" if naive else "webhooks, inbox"
            newest = max(applied, key=lambda e: e["version"])
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
    def tool_said(op, stdout, exit_code, stderr=""):
        """A drill's verdict is its own summary line (effectdrill: `summary: ...`); exit 1 says
        it found an effect that repeated or went missing; a drill that did not run (a usage
        mistake, exit 2: lab 11's interrupt without --resume-with) says why, in its own line."""
        op.found = op.found or exit_code == 1
        summary = [line for line in stdout.splitlines() if line.startswith("summary: ")]
        why = [line for line in stderr.splitlines() if line.startswith("effectdrill: ")]
        if summary:
            op.notes.append("the drill says: " + summary[-1].removeprefix("summary: "))
        elif exit_code:
            op.refused = exit_code == EXIT_USAGE
            why_not = f": {why[-1].removeprefix('effectdrill: ')}" if why else ""
            op.notes.append(f"did not run (exit {exit_code}){why_not}")


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
    """Tells guides. Plain (a pipe, a file, --plain): every command as the guide has it, with its
    native line, and all it printed. Projector (a terminal, --projector): each command once (as
    it runs here), the drill's tables fitted to the terminal (a long one as its summary, the whole
    folded), one ticket a line, the graph's own stderr JSON hidden (--stderr shows it), long
    output and the sections on LangGraph's source folded to a line the presenter opens with `o`
    at the next prompt, with --step the guide's text paged so that a command's output is still
    on screen at the next prompt, and a live `running... N s` line for a command that takes
    more than a couple of seconds."""

    def __init__(
        self,
        backend,
        style,
        step_mode=False,
        projector=False,
        width=WIDTH,
        stderr=True,
        pictures=None,
        height=None,
    ):
        self.backend, self.style, self.step_mode = backend, style, step_mode
        # STEP=1 on a terminal of `height` lines: the guide's text after a command is paged so
        # that the command's output stays on screen at the next prompt (Demo.page)
        self.height = height if step_mode and projector else None
        self.watch = self.below = 0  # the output's lines kept on screen; lines printed since
        self.pictures, self.guide, self.drills = pictures, "", 0
        self.projector, self.width, self.stderr = projector, width, stderr or not projector
        self.outcomes, self.operations = [], []
        self.counts = tally([])  # what the commands it ran did (tools.tally, count())
        self.folds = []  # projector mode: what was folded since the last prompt
        self.durations = []  # (guide, seconds, load): what each guide took (labs/WORKSHOP.md)
        self.commit = subprocess.run(  # the tree the demo told, as it started
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        self.timeline = []  # (command, events, exit code): the picture of the run
        self.keys = {}  # ticket_id -> the key the receiver holds for it

    def tell(self, path):
        s = self.style
        began = time.monotonic()
        story = parse_story(Path(path).read_text(encoding="utf-8"))
        self.guide, self.drills = Path(path).name, 0
        if self.pictures is not None:
            Path(self.pictures).mkdir(parents=True, exist_ok=True)
        print("\n" + s.bold(f"=== {story.title} ==="))
        if story.shows:
            wrap_paragraph(story.shows, s, width=self.width)
        ledger = TicketsByOperation()
        heading = None
        self.timeline = []
        for chapter in story.chapters:
            if chapter.notice:
                self.page(self.notice, chapter.notice, ledger)
            fold = self.projector and chapter.folded
            if chapter.heading != heading and chapter.heading != story.title:
                heading = chapter.heading
                self.page(print, "\n" + s.bold(f"-- {heading}"))
                if chapter.before:
                    self.text(chapter.before, fold)
            if fold:
                commands = f" and its {len(chapter.steps)} command(s)" if chapter.steps else ""
                said = f"  (folded: the guide's section{commands}; o at the next prompt opens it)"
                self.page(print, s.dim(said))
            for step in chapter.steps:
                self.run(step, ledger, quiet=fold)
            if chapter.after:
                self.text(chapter.after, fold)
        if not any(c.notice for c in story.chapters):
            self.verdict(ledger)
        self.durations.append((Path(path).name, time.monotonic() - began, os.getloadavg()[0]))

    def notice(self, bullets, ledger):
        print("\n" + self.style.bold("What to notice"))
        for bullet in bullets:
            wrap_paragraph(bullet, self.style, "    ", "  - ", self.width)
        self.verdict(ledger)

    def text(self, text, fold=False):
        if fold:
            self.folds.append(("text", text))
            return
        last = None
        for kind, piece in pieces(text):  # paged between paragraphs, never inside one
            gap = last is None or kind != last or kind == "para"  # tell_text's blank lines
            self.page(self.piece, piece, gap)
            last = kind

    def piece(self, text, gap):
        print("\n" * gap, end="")
        tell_text(text, self.style, self.width)

    def page(self, show, *args):
        """Print what show(*args) prints; with STEP=1 on a terminal, first wait for Enter when it
        would push the last command's output off the screen (keeping a line for the prompt):
        the room reads the output with the text about it up to there, then the rest."""
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            show(*args)
        lines = shown.getvalue().count("\n")
        if self.height and self.watch and self.watch + self.below + lines + 1 > self.height:
            self.prompt("Enter to read on")
            self.watch = 0
        print(shown.getvalue(), end="", flush=True)
        self.below += lines

    def prompt(self, what="Enter to run"):
        """STEP=1: Enter runs the command (or, paging, shows more); o opens what was folded since
        the last prompt. Keys typed on a terminal while the last command ran are dropped first
        (an Enter pressed twice runs one command, not the next one unseen)."""
        s = self.style
        while True:
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
                if os.isatty(sys.stdin.fileno()):
                    termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)
            answer = input(
                s.dim(f"  ({what}" + ("; o opens the folded" if self.folds else "") + ") ")
            )
            if answer.strip().lower() != "o" or not self.folds:
                return
            for kind, folded in self.folds:  # the guide's text told as such, output as it came
                if kind == "text":
                    print()
                    tell_text(folded, s, self.width)
                else:
                    print(folded)
            self.folds = []

    def run(self, step, ledger, quiet=False):
        s = self.style
        native = None  # Compose runs the command as written: no other line to show
        if isinstance(self.backend, LocalBackend):
            native = self.backend.native(step.command)
        if self.projector:  # once: as it runs here, fitted to the room's width
            self.page(print, "\n" + self.command_line(native or step.command, quiet))
        else:
            print(f"\n$ {step.command}")
            if native:
                print(s.dim(f"  natively: {native}"))
        if self.step_mode:
            self.prompt()
        with Counted() as printed:  # what the room should still see at the next prompt
            self.perform(step, ledger, quiet)
        if self.height:
            self.watch, self.below = min(printed.lines, self.height - 2), 0

    def perform(self, step, ledger, quiet):
        """Run the step and print what it printed; count its effects, its events, its verdict."""
        s = self.style
        effect = ledger.operation(step.command)
        verb = parse_command(step.command).verb
        building = verb == "up" and self.backend.name == "docker"
        live = self.projector and self.style.enabled  # a terminal: a live counter
        if building and not live:
            print(s.dim("  building the image..."), end="", flush=True)
        began = time.monotonic()
        report = self.report_path(step)
        if report:  # the drill's own HTML report beside the timeline (effectdrill --html)
            written = report if self.backend.name == "local" else f"/reports/{report.name}"
            step = Step(
                f"{step.command} --html {shlex.quote(str(written))}", step.expected, step.exit_code
            )
        doing = "building the image" if building else "running"
        with Running(live, doing, 0 if building else Running.AFTER_S), keys_unseen():
            result = outcome = run_step(step, self.backend)
        if building:
            took = f"{time.monotonic() - began:.1f} s"
            print(s.dim(f"  building the image... {took}" if live else f" {took}"))
        self.outcomes.append(outcome)
        lifecycle = verb in LIFECYCLE  # Compose's own output (build steps, progress): not the story
        #                                 (`logs api` is: the receiver's side, lab 02's `replayed`)
        shown = [] if lifecycle else [TERMINAL_CODES.sub("", x) for x in result.stdout.splitlines()]
        if self.projector:
            shown = [
                part for line in self.fit(shown, step, quiet) for part in fitted(line, self.width)
            ]
        for line in shown:
            print(s.figures(line))  # `logs`: Compose 2 erases each line
        said = result.stderr.strip().splitlines()
        if lifecycle:  # only when it failed, and only its last words
            said = (
                (result.stdout + result.stderr).strip().splitlines()[-5:]
                if outcome.problems
                else []
            )
        if not self.stderr:  # the graph's own JSON lines (the drill's children): hidden
            graphs = [line for line in said if line.startswith("{")]
            said = [line for line in said if not line.startswith("{")]
            if graphs:
                print(
                    s.dim(
                        f"  ({len(graphs)} JSON lines on stderr, the graph's own; "
                        "--stderr shows them)"
                    )
                )
        for (
            line
        ) in said:  # projector: a long line (labs/cli.py's, the drill's) wrapped between words
            parts = fitted(f"  stderr: {line}", self.width if self.projector else 0, " " * 10)
            print("\n".join(map(s.dim, parts)))
        if result.exit_code:
            print(s.bold(f"[exit {result.exit_code}]"))
        if report and report.exists():
            print(f"report: {report}")
        for problem in outcome.problems:
            print(s.bad(f"  !! {problem}; the guide says:"))
            for line in step.expected + ([f"[exit {step.exit_code}]"] if step.exit_code else []):
                print("\n".join(fitted(f"     {line}", self.projector and self.width, " " * 9)))
        if effect:
            tickets = [] if effect[0] == "says" else self.backend.tickets()
            self.keys.update((t["ticket_id"], t["key"]) for t in tickets)
            ledger.record(*effect, result.stdout, tickets, result.exit_code, result.stderr)
            if effect[0] == "drill":  # what its runs sent: each email one more (lab 20)
                ledger.sent_to(effect[1], self.backend.messages())
        if verb == "run":
            lines = result.stdout.splitlines()
            last = [x for x in lines if x.startswith("summary: ")]
            self.timeline.append(
                (
                    step.command,
                    list(events_in(lines)),
                    result.exit_code,
                    last[-1].removeprefix("summary: ") if last else "",
                    drilltable.tables([TERMINAL_CODES.sub("", x) for x in lines]),
                )
            )
        self.count(step.command, result)

    def command_line(self, command, folded=False):
        """Projector mode: the command broken between its words to the room's width; in a folded
        section, one line, the whole command folded with its output (lab 08's `python -c`, a
        word wider than the room, was broken mid-word by the terminal)."""
        shown = shown_command(command, self.width)
        if folded and "\n" in shown:
            self.folds.append(("output", shown))
            return f"$ {command[: self.width - 32]} ... (o opens the whole)"
        return shown

    def report_path(self, step):
        """PICTURES/lab-NN-drill-K.html for the guide's Kth drill of a graph (not a replay).
        Natively the drill writes it there; through Docker to /reports, which compose.yaml binds
        to PICTURES when LAB_REPORTS names it (main sets it, and LAB_DRILL_USER)."""
        words = parse_command(step.command).run_env()[1]
        if self.pictures is None or words[1:2] != ["drill"] or words[2:3] == ["replay"]:
            return None
        if "--html" in words:
            return None
        self.drills += 1
        return Path(self.pictures).resolve() / f"lab-{self.guide[:2]}-drill-{self.drills}.html"

    def fit(self, lines, step, quiet):
        """Projector mode: tables fitted to the terminal, a ticket list one ticket a line, and
        long output (or a folded section's) folded to one line; a drill's long table to its
        summary (tools.drilltable: the rows not as the clean run), the whole folded."""
        verb = parse_command(step.command)
        drill = verb.run_env()[1][1:2] == ["drill"]
        if drill and not quiet and len(fit_tables(lines, self.width)) > FOLD_LINES:
            self.folds.append(("output", "\n".join(fit_tables(lines, self.width))))
            said = f"  (the whole table, {len(lines)} lines, folded; o at the next prompt opens it)"
            return [*fit_tables(drilltable.screen_summary(lines), self.width), self.style.dim(said)]
        lines = fit_tables(lines, self.width)
        out = []
        for line in lines:
            event = next(events_in([line]), None)
            listed = event and next((k for k in LISTS if event.get(k)), None)
            if listed:  # one item a line
                out.append(f'{{"event": "{event["event"]}", "{listed}": [')
                out += [f"  {json.dumps(item, sort_keys=True)}," for item in event[listed]]
                out.append("]}")
            else:
                out.append(line)
        if quiet or (len(out) > FOLD_LINES and not drill):
            self.folds.append(("output", "\n".join(out)))
            keep = [] if quiet else out[-FOLD_KEEP:] if verb.verb == "logs" else out[:3]
            said = f"  ({len(out) - len(keep)} lines folded; o at the next prompt opens them)"
            if verb.verb == "logs":  # the receiver's latest lines are the lesson: kept
                return [self.style.dim(said.replace("lines", "earlier lines")), *keep]
            return [*keep, self.style.dim(said)]
        return out

    def count(self, command, result):
        """Add the command's events to the tally; labs/cli.py prints no event when a run starts or
        resumes, so its start, resume and approve commands count as such (a usage or thread
        mistake, exit 2 or 4, ran nothing)."""
        cmd = parse_command(command)
        if cmd.verb != "run":
            return
        self.counts += tally(events_in(result.stdout.splitlines()))
        words = cmd.run_env()[1]
        if words[1:2] == ["workflow"] and result.exit_code not in (2, 4):
            action = words[2] if len(words) > 2 else ""
            if action in ("saga", "outbox"):  # lab 13's and lab 19's: `saga start`, ...
                action = words[3] if len(words) > 3 else ""
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
            if self.projector:  # wrapped, the rest of the line under its name
                line = textwrap.fill(
                    line,
                    self.width - 2,
                    subsequent_indent="    ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            paint = s.bad if op.duplicated or op.lost else s.good
            print("\n".join("  " + paint(part) for part in line.splitlines()))
            self.operations.append(op)
        if not ledger.operations:
            print("  no operation made a ticket")

    def closing(self, guides):
        s = self.style
        modes = {}
        for op in self.operations:
            total, duplicated, lost = modes.get(op.mode, (0, 0, 0))
            modes[op.mode] = (  # the third: lost operations, or drills that did not run
                total + (not op.refused),
                duplicated + op.duplicated,
                lost + (op.refused or op.lost),
            )
        shown = "; ".join(
            f"{dup} of {total} drill{'' if total == 1 else 's'} found an effect repeated or lost"
            + (f", {lost} more did not run (exit 2)" if lost else "")
            if mode == TOOL
            else f"{mode}: {dup} of {total} operation{'' if total == 1 else 's'} duplicated"
            + (f", {lost} lost" if lost else "")
            for mode, (total, dup, lost) in modes.items()
        )
        width = self.projector and self.width  # the room's: broken between words
        showed = fitted(f"What the labs showed: {shown or 'no operation made a ticket'}", width)
        print("\n" + "\n".join(map(s.bold, showed)))
        tallied = f"What the commands above did (tools.tally): {tally_line(self.counts)}"
        print("\n".join(fitted(tallied, width)))
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


# ------------------------------------------------------------------ the timeline, and the times


def timeline(demo):
    """The run the room just watched, as rows: (what ran, [(kind, text)], drill tables) for each
    command that ran a workflow, a worker, the relay or the drill, from the events it printed,
    the keys the receiver holds for its tickets and the drill's own table. A mark per event
    (MARKS says each kind); an effect made a second time for the same thing (a ticket for one
    operation, a notice for one webhook event, a charge for one reference) is a duplicate."""
    rows, seen = [], ShownSoFar()
    for command, events, exit_code, said, *more in demo.timeline:
        words = parse_command(command).run_env()[1][1:]
        if words[:1] == ["drill"] and said:  # its own crash runs: its summary and its table
            kind = "found" if exit_code else "passed"
            rows.append((tool_name("drill", words[1:]), [(kind, said)], more[0] if more else []))
            continue
        thread = option(words, "--thread")
        shown = words[1:3] if words[:1] == ["workflow"] else words[:3]  # labs/cli.py's: its action
        label = " ".join(w for w in shown if not w.startswith("-") and w != thread)
        said_of = [f"thread {thread}"] * bool(thread) + [f"mode {option(words, '--mode')}"] * bool(
            option(words, "--mode")
        )
        label += f" ({', '.join(said_of)})" if said_of else ""
        seen.command(words, thread, events)
        marks = [mark for event in events for mark in seen.marks(event, demo.keys)]
        if exit_code and not any(k == "killed" for k, _ in marks):
            marks.append(("stopped", f"exit {exit_code}"))
        if marks:
            rows.append((label, marks, []))
    return rows


class ShownSoFar:
    """What the picture has shown so far: which operation each thread runs, and each effect
    made (a ticket by its operation, a message by its key or the webhook event it is about, a
    payment by its reference), so that the second one is marked a duplicate."""

    def __init__(self):
        self.threads, self.made, self.deliveries = {}, set(), set()
        self.payments, self.messages = set(), set()  # the ids drawn
        self.operation = self.about = None
        self.applied = []

    def command(self, words, thread, events):
        operation = option(words, "--operation") or next(
            (
                e.get("operation") or e.get("operation_id")
                for e in events
                if e["event"] in ("prepare", "done")
                and (e.get("operation") or e.get("operation_id"))
            ),
            None,
        )
        if thread and operation:
            self.threads[thread] = operation
        self.operation = self.threads.get(thread, operation)
        self.about, self.applied = self.operation, []

    def new(self, what):
        """True the first time the picture meets this effect."""
        if what in self.made:
            return False
        self.made.add(what)
        return True

    def marks(self, event, keys):
        kind, ticket = event["event"], event.get("ticket_id")
        if kind in ("effect_ack", "held_run", "answered") and "created" in event:
            key = keys.get(ticket, "none") or "none"
            text = f"ticket {ticket}, key {key}: " + (
                "created" if event["created"] else "created: false"
            )
            if not event["created"]:
                return [("replayed", text)]
            asked = key if key.endswith(ASK) else None  # lab 07's ask: a ticket of its own
            if self.new(("ticket", asked or self.operation or ticket)):
                return [("sent", text)]
            return [("duplicate", f"{text}, a second ticket for {self.operation}")]
        if kind == "charged" and "created" in event:  # lab 13's charge: a ticket on the receiver
            text = f"{thing(event)}: " + ("created" if event["created"] else "created: false")
            if not event["created"]:
                return [("replayed", text)]
            if self.new(("charge", self.operation or ticket)):
                return [("payment", text)]
            return [("duplicate", f"{text}, a second charge for {self.operation}")]
        if kind in ("reserved", "shipped") and "created" in event:  # lab 13's other steps
            step = SAGA_MADE[kind]
            text = f"{step} {event[f'{step}_id']}: " + (
                "created" if event["created"] else "created: false"
            )
            if not event["created"]:
                return [("replayed", text)]
            if self.new((step, self.operation or event[f"{step}_id"])):
                return [("sent", text)]
            return [("duplicate", f"{text}, a second {step} for {self.operation}")]
        if kind == "refused" and "error" in event:  # lab 13's shipment: no carrier, nothing made
            return [("said", f"refused: {event['error']}")]
        if kind in UNDONE and event.get("created"):  # lab 13's: one of each undo an operation
            undo = UNDONE[kind]
            text = f"{undo} {event[f'{undo}_id']}: created"
            if self.new((undo, self.operation or event[f"{undo}_id"])):
                return [("sent", text)]
            return [("duplicate", f"{text}, a second {undo} for {self.operation}")]
        if kind == "message_sent":
            self.messages.add(event["message_id"])
            about = event.get("key") or self.about
            text = f"message {event['message_id']} sent" + (f" ({about})" if about else "")
            if self.new(("message", about or event["message_id"])):
                return [("message", text)]
            return [
                ("duplicate", f"message {event['message_id']} sent: a second notice for {about}")
            ]
        if kind == "messages":  # the provider's listing: a message no command printed (lab 15's)
            found = []
            for message in event["messages"]:
                if message["message_id"] in self.messages:
                    continue
                self.messages.add(message["message_id"])
                text = f"message {message['message_id']} to {message['to']}: {message['text']}"
                if self.new(("message text", message["text"])):
                    found.append(("message", text))
                else:
                    found.append(("duplicate", f"{text}: a second one"))
            return found
        if kind == "payments":  # the provider's listing: a second charge for one reference
            found = []
            for payment in event["payments"]:
                if payment["payment_id"] in self.payments:
                    continue
                self.payments.add(payment["payment_id"])
                text = (
                    f"payment {payment['payment_id']}: {payment['reference']}, {payment['amount']}"
                )
                if self.new(("payment", payment["reference"])):
                    found.append(("payment", text))
                else:
                    found.append(("duplicate", f"{text}: a second charge for one reference"))
            return found
        if kind == "effect_adopted" or event.get("how") == "adopted":
            return [("adopted", f"{thing(event)}: adopted (found by its key), nothing sent")]
        if kind == "effect_receipt" or event.get("how") == "receipt":
            return [("receipt", f"{thing(event)}: the ledger's receipt, sent nothing again")]
        if kind == "webhook":
            self.about = event["event_id"]
            name = f"{event['event_id']} {event['status']} v{event['version']}"
            again = event.get("duplicate") or event["event_id"] in self.deliveries
            self.deliveries.add(event["event_id"])
            if event.get("applied"):
                self.applied.append(event)
                if event.get("duplicate"):  # the inbox had it: its first delivery applied it
                    return [("ignored", f"{name}: seen before, applied once")]
                return [("delivered", f"{name}: applied" + (" again" if again else ""))]
            return [
                (
                    "ignored",
                    f"{name}: not applied ("
                    + ("seen before" if event.get("duplicate") else "older")
                    + ")",
                )
            ]
        if kind == "webhook_refused":
            return [("refused", f"delivery refused ({event['status']})")]
        if kind == "ticket_status":
            text = f"ticket {ticket} ends {event['status']} (v{event['version']})"
            newest = max(self.applied, key=lambda e: e["version"], default=None)
            if newest and newest["version"] > event["version"]:
                return [
                    ("back", f"{text}: went back from {newest['status']} (v{newest['version']})")
                ]
            return [("status", text)]
        if kind == "reconciled":
            return [("reconciled", f"{event['key']}: {event['was']} -> {event['now']}")]
        if kind == "settled":
            return [("reconciled", f"{event['key']}: {event['state']} by a person")]
        if kind == "crash":
            return [("killed", f"killed {event['at']}")]
        if kind in ("sigterm", "drained"):
            return [("stopped", "SIGTERM" if kind == "sigterm" else "drained")]
        if kind == "reconcile":
            return [("said", f"lost the answer; found {event.get('found') or 'nothing'}")]
        if kind == "after_ack_failed":
            return [("said", "failed after the answer; LangGraph ran the node again")]
        if kind == "done":
            return [("done", "done")]
        return []


def thing(event):
    """What an event is about, for a mark: 'refund 3', 'charge, ticket 4', 'ticket 2', 'message
    1' (a receipt of another effect), else its key."""
    if "refund_id" in event:
        return f"refund {event['refund_id']}"
    if event["event"] == "charged":
        return f"charge, ticket {event.get('ticket_id')}"
    if "ticket_id" in event:
        return f"ticket {event['ticket_id']}"
    receipt = other_receipt(event)
    named = ", ".join(f"{k.removesuffix('_id')} {v}" for k, v in receipt.items())
    return named or event.get("key", "")


MARKS = {  # kind: (colour, what the legend says)
    "sent": ("#2e7d32", "sent: a new effect (a ticket, a reservation, a refund...)"),
    "message": ("#558b2f", "message sent"),
    "payment": ("#00695c", "payment (a charge the provider holds)"),
    "duplicate": ("#b71c1c", "DUPLICATE: a second effect for the same thing"),
    "replayed": ("#1565c0", "replayed: the key, created: false"),
    "adopted": ("#4527a0", "adopted: found by its key, nothing sent"),
    "receipt": ("#6a1b9a", "receipt: from the ledger, nothing sent"),
    "reconciled": ("#00838f", "reconciled: a lookup or a person"),
    "delivered": ("#283593", "webhook delivered, applied"),
    "ignored": ("#78909c", "webhook delivered, not applied"),
    "refused": ("#ad1457", "webhook refused"),
    "status": ("#455a64", "the ticket's status at the end"),
    "back": ("#d84315", "status went back"),
    "killed": ("#c62828", "killed (SIGKILL)"),
    "stopped": ("#ef6c00", "stopped (SIGTERM, an exit code)"),
    "done": ("#616161", "done"),
    "said": ("#00838f", "what the run said"),
    "found": ("#c62828", "the drill found an effect repeated or missing"),
    "passed": ("#2e7d32", "the drill: every crash point as the clean run"),
}
CELLS = {  # a drill's matrix: a crash point's count of an effect against the clean run's
    "ok": ("#c8e6c9", "a count as the clean run's"),
    "duplicate": ("#ef9a9a", "DUPLICATE: a count above the clean run's"),
    "missing": ("#ffe082", "MISSING: a count below the clean run's"),
    "none": ("#eeeeee", "no count (not reached)"),
}
PICTURE_W = 1280  # a projector's width: every picture fits it


NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # XML 1.0's


def escape(text):
    """text for an SVG's <text>: &, < and > escaped, and each character XML 1.0 cannot hold (a
    control character in a thread id, a lone surrogate) shown as its \\xNN or \\uNNNN."""
    from xml.sax.saxutils import escape as xml_escape

    shown = NOT_XML.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)
    return xml_escape(shown)


def svg(title, rows):
    """The timeline as an SVG at most PICTURE_W wide: a row per command, its marks left to
    right (wrapped onto more lines within the row); a drill's row a matrix of its crash points
    x effects, each cell its count coloured against the clean run's; a legend of every kind
    the picture uses. Every text goes through escape() (control characters shown, not kept)."""
    line_h, left, char_w, right = 30, 300, 7.2, PICTURE_W - 10
    out, y, used, cells = [], 44, [], set()

    def text(x, y, said, **attrs):
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        out.append(f'<text x="{x:.0f}" y="{y:.0f}"{extra}>{escape(said)}</text>')

    def box(x, y, w, h, kind, fill):
        at = f'x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h}"'
        out.append(f'<rect class="{kind}" {at} rx="4" fill="{fill}"/>')

    for label, marks, *more in rows:
        tables = more[0] if more else []
        text(
            10,
            y + 17,
            label if len(label) <= 39 else label[:36] + "...",  # 39 characters: 290 px
            font_weight="bold" if tables else "normal",
        )
        x = left
        for kind, said in marks:
            words = textwrap.wrap(said, int((right - left - 14) / char_w)) or [""]
            w = max(map(len, words)) * char_w + 14
            if x > left and x + w > right:
                x, y = left, y + line_h
            box(x, y, w, 24 + 14 * (len(words) - 1), kind, MARKS[kind][0])
            for n, part in enumerate(words):
                text(x + 7, y + 16 + 14 * n, part, fill="white")
            used.append(kind)
            x += w + 8
            y += 14 * (len(words) - 1)
        y += line_h
        for table in tables:  # the drill's matrix: points down, effects across
            col_w = max([90] + [len(e) * char_w + 16 for e in table.effects])
            name_w = min(
                right - 280 - col_w * len(table.effects),  # and 270 px for a verdict
                max(len(p.name) for p in table.points) * char_w + 20,
            )
            chars = int((name_w - 20) / char_w)
            text(20, y + 14, table.title, font_style="italic")
            y += 22
            for c, effect in enumerate(table.effects):  # its name, the clean run's count below
                x = 20 + name_w + c * col_w + 6
                text(x, y + 12, effect[: int(col_w / char_w) - 1])
                text(x, y + 26, f"(clean {table.clean[effect]})")
            y += 32
            for point in table.points:
                text(
                    20,
                    y + 13,
                    point.name if len(point.name) <= chars else point.name[: chars - 3] + "...",
                )
                for c, effect in enumerate(table.effects):
                    state = point.state(effect, table.clean[effect])
                    cells.add(state)
                    box(20 + name_w + c * col_w, y, col_w - 4, 18, f"cell {state}", CELLS[state][0])
                    text(20 + name_w + c * col_w + 6, y + 13, point.counts.get(effect, ""))
                if point.verdict != "ok":
                    x = 20 + name_w + len(table.effects) * col_w + 6
                    room = int((right - x) / char_w)
                    verdict = point.verdict
                    text(
                        x, y + 13, verdict if len(verdict) <= room else verdict[: room - 3] + "..."
                    )
                y += 20
            y += 10
    y += 6
    legend = [(kind, *MARKS[kind]) for kind in MARKS if kind in used]
    legend += [(f"cell {state}", *CELLS[state]) for state in CELLS if state in cells]
    text(10, y + 14, "legend", font_weight="bold")
    x, y = 80, y
    for kind, fill, meaning in legend:
        w = len(meaning) * char_w + 30
        if x + w > right:
            x, y = 80, y + 22
        at = f'x="{x:.0f}" y="{y + 3}" width="14" height="14"'
        out.append(f'<g class="legend" data-kind="{kind}"><rect {at} rx="3" fill="{fill}"/>')
        text(x + 20, y + 14, meaning)
        out.append("</g>")
        x += w + 10
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PICTURE_W}" height="{y + 34:.0f}" '
        'font-family="monospace" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    text(10, 24, title, font_size="16", font_weight="bold")
    title_line = out.pop()
    return "\n".join(head + [title_line] + out + ["</svg>"]) + "\n"


def draw(demo, guide, folder):
    """Write the guide's timeline as FOLDER/lab-NN.svg (and, in projector mode, draw it on the
    terminal); return the path. A file there that is not a picture of ours is refused."""
    rows = timeline(demo)
    path = picture(folder, guide)
    there = safefiles.read_regular(path)  # NotAFile: a link, a FIFO, a device
    if there is not None and not there.startswith("<svg xmlns"):
        raise LabError(f"{path} is not a picture the demo wrote; not overwriting it")
    safefiles.write_beside(path, svg(f"{Path(guide).stem}: what the commands printed", rows))
    if demo.projector:
        s = demo.style
        print("\n" + s.bold("Timeline"))
        paint = {"sent": s.good, "duplicate": s.bad, "back": s.bad, "killed": s.bad}
        paint |= {"stopped": s.bad, "refused": s.bad}
        for label, marks, *_ in rows:  # wrapped between marks, colour added after
            line, width = f"  {label}", demo.width
            for kind, text in marks:
                after = TERMINAL_CODES.sub("", line).rstrip().endswith("]")
                piece = f" -> [{text}]" if after else f" [{text}]"
                if len(TERMINAL_CODES.sub("", line)) + len(piece) > width:
                    print(line)
                    line = "     "
                    piece = piece.removeprefix(" ->")
                chunks = [f"[{text}]"]  # a mark longer than a line (a drill's summary) too
                if len(TERMINAL_CODES.sub("", line)) + len(piece) > width:
                    chunks = fitted(chunks[0], width - 6, "")
                prefix = piece[: piece.index("[")]
                for chunk in chunks[:-1]:
                    print(line + prefix + paint.get(kind, str)(chunk))
                    line, prefix = "      ", ""
                line += prefix + paint.get(kind, str)(chunks[-1])
            print(line)
    return path


def picture(folder, guide):
    return Path(folder) / f"lab-{Path(guide).name[:2]}.svg"


def refuse_outputs(args):
    """Where the demo will write, checked before anything runs: NotAFile says why not. Its
    pictures go to a real folder, outside the lab's source (data/demo by default), each
    lab-NN.svg absent or a file; the times file too."""
    if args.pictures is not None:
        folder = args.pictures
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise safefiles.NotAFile(f"PICTURES {folder} is not a folder; name a folder")
        safefiles.refuse_source(folder, "PICTURES")
        for guide in args.guides:
            safefiles.refuse_special(picture(folder, guide))
    if args.times is not None:
        safefiles.refuse_special(args.times)


def record_times(path, demo, backend):
    """Add each guide's time to PATH (JSON), with the backend, the commit and the load: what
    labs/WORKSHOP.md's times are checked against. A file that is not ours is refused."""
    data = {"guides": {}}
    if (there := safefiles.read_regular(path)) is not None:
        try:
            data = json.loads(there)
        except ValueError:
            data = None
        if not isinstance(data, dict) or "guides" not in data:
            raise LabError(f"{path} is not a times file the demo wrote; not writing to it")
    for name, seconds, load in demo.durations:  # the load average as each guide ended
        data["guides"][name] = {
            "backend": backend.name,
            "seconds": round(seconds, 1),
            "commit": demo.commit,
            "load": round(load, 1),
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    safefiles.write_beside(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


class MakeParent:
    """`make demo` started the demo (the recipe execs it, so make is its parent) and shares its
    process group: the terminal's Ctrl-C reaches make too. GNU make's SIGINT handler (4.3,
    commands.c fatal_error_signal) waits for its child, then dies of the signal itself: the shell
    sees status 130 and make prints nothing more, unless the child failed (job.c reap_children
    calls child_error: "Error 130"). So when make is seen handling the SIGINT (Linux's
    /proc/PID/status: pending, or no longer caught), the demo exits 0 after its one line and
    make's own death says 130; otherwise (no /proc, a SIGINT sent to the demo alone) it exits
    130, and make adds its line."""

    SIGINT_BIT = 1 << (signal.SIGINT - 1)

    def __init__(self, pid):
        self.pid = pid

    @classmethod
    def find(cls, environ=os.environ):
        pid = os.getppid()
        status = cls.status(pid)
        if "MAKELEVEL" not in environ or status.get("Name", "") not in ("make", "gmake"):
            return None
        try:
            shares_group = os.getpgid(pid) == os.getpgrp()
        except OSError:
            return None
        catches = int(status.get("SigCgt", "0"), 16) & cls.SIGINT_BIT
        return cls(pid) if shares_group and catches else None

    def interrupted(self):
        """make got the SIGINT: pending, or its handler running (it sets the default first)."""
        status = self.status(self.pid)
        if not status:
            return False
        pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
        caught = int(status["SigCgt"], 16)
        return bool(pending & self.SIGINT_BIT or not caught & self.SIGINT_BIT)

    @staticmethod
    def status(pid):
        try:
            text = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
        except OSError:
            return {}
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


class Foreground:
    """On a terminal (and not under make: see MakeParent), the demo takes the terminal's
    foreground in a process group of its own, so that Ctrl-C reaches the demo and the commands
    it runs, not the shell or another tool that started it; given back on the way out."""

    def __init__(self, fd, group):
        self.fd, self.group = fd, group

    @classmethod
    def take(cls):
        try:
            fd = sys.stdin.fileno()
            if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
                return None
            group = os.getpgrp()
            os.setpgid(0, 0)
            with ignoring(signal.SIGTTOU):
                os.tcsetpgrp(fd, os.getpgrp())
            return cls(fd, group)
        except (OSError, ValueError, io.UnsupportedOperation):
            return None

    def give_back(self):
        with ignoring(signal.SIGTTOU), contextlib.suppress(OSError):
            os.tcsetpgrp(self.fd, self.group)


@contextlib.contextmanager
def ignoring(signum):
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def docker_reports(folder):
    """The environment compose.yaml reads for the drill's /reports: FOLDER (made here, so it is
    yours) bound there, and the drill run as you, so that its --html report is yours too. Its
    group stays the image's: replay reads the workflow's checkpoints, in a folder (/data) only
    the image's user and group may enter, and the container has no capability to pass by (as
    root:root, lab 11's replay said "no checkpoint database" and exited 2)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return {
        "LAB_REPORTS": str(Path(folder).resolve()),
        "LAB_DRILL_USER": f"{os.getuid()}:{IMAGE_GROUP}",
    }


def introduce(backend, why, projector=False, width=WIDTH):
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
        if projector:
            where = (
                f"The receiver runs on 127.0.0.1:{backend.port} with its data in "
                f"{backend.data_dir}; each command is shown as it runs natively, with the "
                "defaults (data/, port 8000), to paste."
            )
    line = f"backend: {backend.name} ({why}). {where}"
    if projector:  # the room's terminal would break it mid-word; a path stays whole
        line = textwrap.fill(
            line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    print(line)


def demo_project(name):
    """--project: a name Compose takes (its rule, checked against `docker compose -p`), and never
    the learner's own project, which the demo's first `down -v` would empty."""
    if not COMPOSE_PROJECT.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a Compose project name: lowercase letters, digits, - and _, "
            "starting with a letter or a digit"
        )
    if name == LEARNER_PROJECT:
        raise argparse.ArgumentTypeError(
            f"{name!r} is your own lab's project: the demo runs in one of its own "
            f"(default {DOCKER_PROJECT}), and would empty yours"
        )
    return name


def main(argv=None):
    parser = Parser(prog="python -m tools.demo", description="Tell the lab guides to a room.")
    parser.add_argument("guides", nargs="*", type=Path, default=GUIDES)
    parser.add_argument("--backend", choices=("auto", "local", "docker"), default="auto")
    parser.add_argument("--step", action="store_true", help="wait for Enter before each command")
    parser.add_argument("--port", type=int, help="local backend: this port (default: a free one)")
    parser.add_argument(
        "--project",
        default=DOCKER_PROJECT,
        type=demo_project,
        help="docker backend: the Compose project (two instructors on one engine: one each)",
    )
    screen = parser.add_mutually_exclusive_group()
    screen.add_argument(
        "--projector",
        action="store_true",
        help="for a room (the default on a "
        "terminal): each command once, tables fitted, long output folded",
    )
    screen.add_argument(
        "--plain",
        action="store_true",
        help="everything, as the guide has it (the default for a pipe or a file)",
    )
    parser.add_argument(
        "--stderr",
        action="store_true",
        help="projector: show the graph's own JSON lines on stderr too",
    )
    parser.add_argument("--times", type=Path, help="write each guide's time here (JSON)")
    parser.add_argument(
        "--pictures", type=Path, help="write each guide's timeline here (lab-NN.svg)"
    )
    args = parser.parse_args(argv)
    missing = [str(g) for g in args.guides if not g.is_file()]
    if missing:  # before anything starts: one line, and nothing to clean up
        print(
            f"demo: no such guide {', '.join(missing)}; the guides are labs/NN-*.md",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        refuse_outputs(args)
    except safefiles.NotAFile as error:  # before anything starts, as a missing guide
        print(f"demo: {error}", file=sys.stderr)
        return EXIT_USAGE
    style = style_for(sys.stdout)
    projector = args.projector or (sys.stdout.isatty() and not args.plain)
    size = shutil.get_terminal_size((120, 32))
    width = size.columns - 1 if projector else WIDTH
    backend = code = None
    make = MakeParent.find()  # Ctrl-C reaches make too: it reports it (see MakeParent)
    terminal = Foreground.take() if projector and make is None else None
    try:
        backend, why = choose_backend(args.backend, args.project, args.port)
        introduce(backend, why, projector, width)
        if backend.name == "docker":
            backend.down()  # what an interrupted demo may have left
            if args.pictures:  # the drill's --html to /reports lands in PICTURES, as yours
                os.environ.update(docker_reports(args.pictures))
        demo = Demo(
            backend, style, args.step, projector, width, args.stderr, args.pictures, size.lines
        )
        for guide in args.guides:
            demo.tell(guide)
            if args.pictures:
                print(f"picture: {draw(demo, guide, args.pictures)}")
        code = demo.closing(args.guides)
        if args.times:
            record_times(args.times, demo, backend)
    except (KeyboardInterrupt, EOFError):
        code = None
    except (LabError, ValueError, subprocess.TimeoutExpired, safefiles.NotAFile) as error:
        print(f"demo: {error}", file=sys.stderr)
        code = EXIT_NO_LAB
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # clean up uninterrupted
        left = []
        if backend is not None:
            backend.close()
            left = backend.leftovers()  # looked at, not assumed: see DockerBackend.down
        signal.signal(signal.SIGINT, previous)
        if terminal is not None:
            terminal.give_back()
    if left:
        how = f" (docker compose -p {backend.project} down -v --remove-orphans)"
        print(
            f"demo: left behind: {', '.join(left)}{how if backend.name == 'docker' else ''}",
            file=sys.stderr,
        )
    if code is None:
        print(f"demo stopped; {'see above' if left else 'nothing left behind'}", file=sys.stderr)
        return EXIT_OK if make is not None and make.interrupted() else EXIT_STOPPED
    return code


if __name__ == "__main__":
    sys.exit(main())
