"""Run a lab guide's commands and compare what they print with what the guide promises.

A guide is Markdown. Its ```console blocks hold what a learner types and sees:

    $ docker compose -p stateful-lab run --rm workflow tickets
    {"event": "tickets", "tickets": []}
    [exit 1]                      <- the exit code, when it is not 0

Output lines that are JSON are compared as values, so key order and spacing do not
matter; a string "<anything>" in angle brackets matches any value (for what really
varies, like a freshly minted UUID). Other lines are compared word by word (a table's
column widths may vary). A line `...` matches any number of lines.

One command is not Compose: `$ sleep N` (N whole seconds) waits, for real, in every backend,
where a lab is about time passing (lab 14 waits out the receiver's key retention). A learner
types it as is: bash, zsh and PowerShell all have `sleep N`.

A backend (tools.backends) turns the learner's command into programs; docs/native.md
shows the native mapping. For up, restart and down only the exit code
is compared: Compose's own messages differ between versions. `logs` is compared without the
name Compose puts before each line (`api-1  | ` in v2, `api_1  | ` in v1; natively none) and
without the terminal codes it adds even when no terminal reads them (2.26 erases each line
first, 1.29 colours the name).
`make demo` (tools.demo) tells the same guides to a room; the tests run every guide
through every backend.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tools.backends import parse_command

BLOCK = re.compile(r"^```console\n(.*?)^```", re.M | re.S)
EXIT_LINE = re.compile(r"^\[exit (\d+)\]$")
LIFECYCLE = ("up", "restart", "down")  # Compose's own progress: not compared, not shown
COMPOSE_PREFIX = re.compile(r"^[\w.-]+\s+\| ?")  # "api-1  | " (v2) or "api_1  | " (v1)
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # `logs`: v2 erase-line, v1 colours


@dataclass
class Step:
    command: str
    expected: list = field(default_factory=list)
    exit_code: int = 0


@dataclass
class StepResult:
    step: Step
    stdout: str
    exit_code: int
    problems: list
    stderr: str = ""

    @property
    def ok(self):
        return not self.problems


def parse_block(block):
    """One console block's text -> its Steps."""
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:].strip()))
        elif not steps:
            raise ValueError(f"output before the first command: {line!r}")
        elif match := EXIT_LINE.match(line):
            steps[-1].exit_code = int(match.group(1))
        elif line.strip():
            steps[-1].expected.append(line)
    return steps


def parse_guide(text):
    """The guide's console blocks, in order, as Steps."""
    return [step for block in BLOCK.findall(text) for step in parse_block(block)]


def value_matches(expected, actual):
    if isinstance(expected, str) and expected.startswith("<") and expected.endswith(">"):
        return True
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(value_matches(expected[k], actual[k]) for k in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(value_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and expected == actual


def line_matches(expected, actual):
    """JSON lines as values; other lines word for word, whatever the spaces between the words (a
    table's columns are as wide as their widest cell, and some cells vary: lab 13's drill)."""
    try:
        return value_matches(json.loads(expected), json.loads(actual))
    except ValueError:
        return expected.split() == actual.split()


def lines_match(expected, actual):
    """Match output lines; `...` in expected matches any run of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(lines_match(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return (
        bool(actual)
        and line_matches(expected[0], actual[0])
        and lines_match(expected[1:], actual[1:])
    )


def check(step, stdout, exit_code):
    problems = []
    if exit_code != step.exit_code:
        problems.append(f"exit code {exit_code}, the guide says {step.exit_code}")
    shown = [line for line in stdout.splitlines() if line.strip()]  # blank lines, as parse_block
    expected, verb = step.expected, parse_command(step.command).verb
    if verb == "logs":  # the receiver's own lines, whichever Compose (or none) prefixed them
        expected = [COMPOSE_PREFIX.sub("", line) for line in expected]
        shown = [COMPOSE_PREFIX.sub("", TERMINAL_CODES.sub("", line)) for line in shown]
    if verb not in LIFECYCLE and not lines_match(expected, shown):
        problems.append("output differs from the guide")
    return problems


def run_step(step, backend):
    result = backend.run(step.command)
    problems = check(step, result.stdout, result.exit_code)
    return StepResult(step, result.stdout, result.exit_code, problems, result.stderr)


def run_guide(path, backend):
    """Run every command of the guide in order; return the Outcomes (stops at none)."""
    steps = parse_guide(Path(path).read_text(encoding="utf-8"))
    return [run_step(step, backend) for step in steps]
