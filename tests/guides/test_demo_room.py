"""make demo STEP=1 as a room sees it: a 120x32 terminal (tmux), Enter at each prompt, the
screen read at each prompt. The output a command printed is on screen, down to its last line,
at the first prompt after it (the guide's text about it is paged, never pushed above it), a
drill's long table is its summary with the whole folded, and no line is wider than the
terminal. Labs 01, 16 and 20, natively and through Docker (a Compose project of the test's own,
left empty).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tools.local import ROOT, run_command, wait_until
from tools.runner import parse_guide

ROWS, COLUMNS = 32, 120
PROMPT = re.compile(r"^  \(Enter to (run|read on)")
GUIDES = [
    "01-the-duplicate.md",
    "16-classify-your-effects.md",
    "20-the-assistant-that-sends-email.md",
]
DEADLINE_S = 300  # a hang guard for one command, not a speed bound
PROJECT = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test") + "-room"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux")


class Tmux:
    def __init__(self, socket):
        self.socket = socket

    def __call__(self, *args):
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)
        return done.stdout

    def screen(self):
        """(the visible lines, the line number of the top one in the whole history): one
        capture, the history and the screen below it."""
        every = self("capture-pane", "-p", "-S", "-", "-E", "-", "-t", "room").split("\n")
        every = every[:-1] if every[-1:] == [""] else every  # its final newline
        top = max(0, len(every) - ROWS)
        return every[top:], top


def tell_in_tmux(tmp_path, backend="local"):
    """Run the demo in tmux at 120x32 with --step; at each prompt, keep the screen and press
    Enter. Returns ([(the prompt's line, the screen's top line, the screen)], the whole
    history, lines numbered from its first, and the history with the lines the terminal
    wrapped joined again (capture-pane -J))."""
    tmux = Tmux(f"demo-room-{backend}-{os.getpid()}")  # its own server: xdist runs both at once
    command = [
        sys.executable, "-m", "tools.demo", "--backend", backend, "--step",
        "--project", PROJECT,
        "--pictures", str(tmp_path / "pictures"), *(str(ROOT / "labs" / g) for g in GUIDES),
    ]  # fmt: skip
    shell = f"cd {ROOT} && {shlex.join(command)}; echo DEMO-EXIT $?; sleep 3600"
    tmux("new-session", "-d", "-s", "room", "-x", str(COLUMNS), "-y", str(ROWS), shell)
    tmux("set-option", "-t", "room", "history-limit", "100000")
    seen, prompts, state = set(), [], {}

    def at_prompt_or_end():
        lines, top = tmux.screen()
        filled = [i for i, line in enumerate(lines) if line.strip()]
        last = lines[filled[-1]] if filled else ""
        state.update(lines=lines, top=top, row=top + (filled[-1] if filled else 0))
        if last.startswith("DEMO-EXIT"):
            return True
        return bool(PROMPT.match(last)) and state["row"] not in seen

    try:
        while True:
            wait_until(at_prompt_or_end, DEADLINE_S, "the demo's next prompt")
            if any(line.startswith("DEMO-EXIT") for line in state["lines"]):
                break
            seen.add(state["row"])
            prompts.append((state["row"], state["top"], state["lines"]))
            tmux("send-keys", "-t", "room", "Enter")
        history = tmux("capture-pane", "-p", "-S", "-", "-E", "-", "-t", "room").split("\n")
        joined = tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "room").split("\n")
    finally:
        tmux("kill-server")
    assert any(line == "DEMO-EXIT 0" for line in history), differing(history)
    return prompts, history, [line.rstrip() for line in joined]


def differing(history):
    """What a failed demo printed: each command that differs from its guide (its `$ ` line,
    its output and the `!!` lines), then the demo's last lines."""
    shown = []
    for at, line in enumerate(history):
        if line.lstrip().startswith("!! "):
            start = max((i for i in range(at) if history[i].startswith("$ ")), default=at)
            shown += history[max(start, at - 30) : at + 6] + ["..."]
    return "\n".join(shown + history[-40:])


def output_after(history, at):
    """A command's output: the lines after its run prompt, to the blank line before the guide's
    text (indented), a heading, the next command or a verdict."""
    out = []
    for index in range(at + 1, len(history)):
        line = history[index]
        if line.startswith("$ ") or PROMPT.match(line):
            break
        after = history[index + 1] if index + 1 < len(history) else ""
        if not line.strip() and (not after.strip() or after.startswith(("  ", "-- ", "$ "))):
            break
        if not line.strip() and after.startswith(("What to notice", "Verdict", "Timeline")):
            break
        out.append((index, line))
    return out


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_at_each_prompt_the_last_commands_output_is_on_screen(tmp_path, backend):
    prompts, history, joined = tell_in_tmux(tmp_path, backend)
    runs = [
        i for i, (row, _, _) in enumerate(prompts) if history[row].startswith("  (Enter to run")
    ]
    commands = sum(
        len(parse_guide((ROOT / "labs" / g).read_text(encoding="utf-8"))) for g in GUIDES
    )
    assert len(runs) == commands, "one run prompt per command of the guides"
    checked = 0
    for i in runs:
        output = output_after(history, prompts[i][0])
        if not output or i + 1 == len(prompts):
            continue  # it printed nothing, or it was the last command
        _, top, lines = prompts[i + 1]  # the first prompt after it: a page or the next command
        shown = output[-(ROWS - 2) :]  # its last screen
        command = history[prompts[i][0] - 1]
        assert shown[0][0] >= top, f"{command!r}: its output is above the screen at the next prompt"
        assert lines[shown[0][0] - top : shown[-1][0] - top + 1] == [line for _, line in shown]
        checked += 1
    assert checked >= 10
    # a drill's table: its summary on screen, the whole folded (o opens it)
    text = "\n".join(history)
    assert text.count("(the whole table, ") == 4
    assert "durability sync: 16 crash points: 11 ok (as the clean run), 5 not:" in text
    assert "durability sync: 20 crash points: 18 ok (as the clean run), 2 not:" in text
    wrapped = [line for line in joined if len(line) >= COLUMNS]  # the terminal broke them
    assert wrapped == [], wrapped
    if backend == "docker":
        assert_the_docker_demo_ran_in_its_own_project_and_left_nothing(" ".join(joined))


def assert_the_docker_demo_ran_in_its_own_project_and_left_nothing(text):
    """Through Docker the demo runs in a Compose project of its own (never the learner's
    stateful-lab), shows each command as the guide writes it, tells the build by its seconds
    and not its output, shows the receiver's own lines (`logs api`, Compose v2 `api-1  |`, v1
    `api_1  |`), and leaves no container, volume or network of its project behind."""
    text = re.sub(r"\s+", " ", text)  # the projector breaks long lines between words
    assert f"run in the Compose project {PROJECT}, not stateful-lab" in text
    assert "$ docker compose -p stateful-lab run --rm workflow tickets" in text  # as written
    assert "case-naive:open-ticket:v1: 2 tickets for one operation (duplicate)" in text
    assert re.search(r" building the image\.\.\. \d+\.\d s ", text)
    assert re.search(r" api[-_]1 +\| receiver: created key=None ticket=2 ", text), text
    assert "Step 1/" not in text  # no build output in the story
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in ("container", "volume", "network"):
        listing = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            listing.insert(3, "-a")
        assert run_command(listing).stdout.split() == [], f"{kind}s left behind"
