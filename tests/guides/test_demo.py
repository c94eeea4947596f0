"""make demo: the story it tells, the verdict it computes, and how it stops.

In-process where no signal is needed (tools.demo.main with captured output); the
Ctrl-C tests run the demo as a process and send SIGINT to its process group, as a terminal
does. Checked elsewhere, on runs of the guides that happen anyway: the story of labs 01-02
(paragraphs, native lines, a verdict per operation, `logs api`) on the README's own `make demo
BACKEND=local` run (tests/guides/test_readme.py); the verdicts of labs 07, 10 and 14 (an ask for
approval, background workers' tickets, expired keys) on their native guide runs, through the
demo's own Demo.run (tests/guides/test_guides.py, test_guide_local and DEMO_VERDICTS), and so
are the lessons of labs 05 and 09-20 and the drills' own lines (11, 13, 16, 20); lab 16's native
run also fits its drill tables to 120 columns. Projector mode, the timeline SVG (in headless
Chromium) and --times ride on the lab 01-safe run below.
"""

import contextlib
import html
import io
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chromium_helpers import chromium

from tools import demo, native
from tools.backends import compose_command, parse_command
from tools.local import ROOT, wait_until
from tools.runner import parse_guide

LAB01 = ROOT / "labs" / "01-the-duplicate.md"
LAB06 = ROOT / "labs" / "06-the-lost-acknowledgement.md"
INTRO = re.compile(r"runs\s+on\s+127\.0\.0\.1:(\d+)\s+with\s+its\s+data\s+in\s+(\S+);")
STOP_DEADLINE_S = 60


def run_demo(capsys, *args):
    code = demo.main(["--backend", "local", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_story_comes_from_the_guide_itself():
    story = demo.parse_story(LAB01.read_text(encoding="utf-8"))
    assert story.title == "Lab 01: the duplicate"
    assert story.shows.startswith("A checkpointed workflow recovers its own state after a crash")
    first, crash = story.chapters[0], story.chapters[1]
    assert first.heading == "Start the receiver" and first.after == "The receiver starts empty."
    assert crash.steps[0].exit_code == 137 and crash.after.startswith("Exit code 137 is 128 + 9")
    reset = story.chapters[-1]
    assert reset.heading == "Reset" and reset.steps[0].command.endswith("down -v --remove-orphans")
    assert len(reset.notice) == 3 and reset.notice[0].startswith("`prepare` did not run again")


def test_the_verdict_follows_the_receiver_not_the_guide(capsys, tmp_path, monkeypatch):
    """Lab 01 run in safe mode: its text still promises a duplicate, the receiver has one. The
    same run in projector mode, with its timeline and its time written: each command once (as
    it runs natively), a ticket a line, the timeline on the terminal and as an SVG that headless
    Chromium shows with this run's ticket ids and keys, and the guide's time in the times file."""
    text = LAB01.read_text(encoding="utf-8").replace("--mode naive", "--mode safe")
    guide = tmp_path / "01-safe.md"
    guide.write_text(text, encoding="utf-8")
    pictures, times = tmp_path / "pictures", tmp_path / "times.json"
    monkeypatch.setenv("COLUMNS", "120")  # the room's terminal (shutil.get_terminal_size)
    code, out, err = run_demo(
        capsys, "--projector", "--pictures", pictures, "--times", times, guide
    )
    assert code == demo.EXIT_DIFFERS
    assert (
        "case-naive:open-ticket:v1: 1 ticket, start killed at after-ack, resume sent it again and "
        "got created: false (the key)"
    ) in out
    assert "What the labs showed: safe: 0 of 1 operation duplicated" in out
    commands = len(parse_guide(text))
    assert re.search(rf"\d+ of {commands} commands differ from the guides", out)
    # projector: each command once, as it runs here; the tickets one a line; every line fits
    #   (the done events' JSON is longer: broken between its words, not mid-word by the terminal)
    assert [line for line in out.splitlines() if len(line) > 119] == []
    done = r'^\{"event": "done", [^\n]*,\n    [^\n]*"title": "Check supplier configuration"\}$'
    assert re.search(done, out, re.M), out
    assert "natively:" not in out and "$ docker compose" not in out
    assert out.count("\n$ python -m labs start --thread naive ") == 1
    (ticket,) = set(re.findall(r"^  (\{\"key\": .*\"ticket_id\": \d+\}),$", out, re.M))
    ticket = json.loads(ticket)  # the receiver's one ticket, as the run printed it
    assert ticket["key"] == "case-naive:open-ticket:v1"
    timeline = out.split("\nTimeline\n")[1].split("\npicture: ")[0]
    made = f"[ticket {ticket['ticket_id']}, key {ticket['key']}: created]"
    again = f"[ticket {ticket['ticket_id']}, key {ticket['key']}: created: false]"
    assert made in timeline and again in timeline and "[killed after-ack]" in timeline
    # the picture: what Chromium shows of it
    svg = pictures / "lab-01.svg"
    assert f"picture: {svg}" in out
    shown = chromium_text(svg)
    assert [line for line in shown if line.startswith("ticket ")] == [made[1:-1], again[1:-1]]
    assert "killed after-ack" in shown
    recorded = json.loads(times.read_text(encoding="utf-8"))["guides"]["01-safe.md"]
    assert recorded["backend"] == "local" and recorded["seconds"] > 0


def chromium_text(page):
    """The text of each <text> of the page as headless Chromium's DOM holds it (one launch);
    a page Chromium cannot parse fails here."""
    dom = chromium(page.as_uri(), "--dump-dom")
    assert "<svg" in dom and "parsererror" not in dom, dom[:500]
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", dom)]


def test_projector_mode_keeps_the_guides_lists():
    """The lists after lab 16's and 18's blocks are said as lists, a bullet a line (lab 16's
    drill table fitted to a 119-column terminal: on its native guide run, test_guides.py)."""
    for name, first in (
        ("16-classify-your-effects.md", "- `quote` re-ran"),
        ("18-the-webhook-that-came-twice.md", "- "),
    ):
        story = demo.parse_story((ROOT / "labs" / name).read_text(encoding="utf-8"))
        afters = [c.after for c in story.chapters if first in c.after]
        assert afters, name
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            demo.tell_text(afters[0], demo.Style(False), 119)
        bullets = [line for line in out.getvalue().splitlines() if line.startswith("  - ")]
        assert len(bullets) == afters[0].count("\n- ") + afters[0].startswith("- "), out.getvalue()


def test_stderr_comes_with_its_exit_code_and_lab_06_turns_its_fault_on(capsys):
    code, out, err = run_demo(capsys, LAB06)
    assert code == 0, out + err
    up = "natively: mkdir -p data; FAILPOINTS=before-answer=drop-answer python -m labs.receiver"
    up += " 2>>data/"
    assert up in out
    lines = out.splitlines()
    reason = lines.index(
        "  stderr: labs: no answer from the receiver at "
        f"{demo_url(out)} (Remote end closed connection without response); the request may or "
        "may not have taken effect"
    )
    assert lines[reason + 1] == "[exit 3]"
    assert "case-lost-naive:open-ticket:v1: 2 tickets for one operation (duplicate)" in out
    assert (
        "case-lost-safe:open-ticket:v1: 1 ticket, "
        "start lost the answer and adopted ticket 3, found by its key"
    ) in out
    (tally,) = [line for line in out.splitlines() if line.startswith("What the commands above did")]
    counts = json.loads(tally.split(": ", 1)[1])  # the first start lost its answer: no ack
    assert counts == {
        "event": "tally",
        "started": 2,
        "resumed": 1,
        "drained": 0,
        "acknowledged": 1,
        "replayed": 0,
        "settled": 1,
    }


def demo_url(out):
    return f"http://127.0.0.1:{INTRO.search(out).group(1)}"


def test_colour_only_on_a_terminal_and_never_with_no_color():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert demo.style_for(Terminal(), {}).enabled
    assert not demo.style_for(Terminal(), {"NO_COLOR": "1"}).enabled
    assert not demo.style_for(io.StringIO(), {}).enabled
    on = demo.Style(True)
    line = '{"created": true, "event": "effect_ack", "ticket_id": 2}'
    assert on.figures(line) == (
        '{\033[1m"created": true\033[0m, "event": "effect_ack", \033[1m"ticket_id": 2\033[0m}'
    )
    assert demo.Style(False).figures(line) == line


def test_a_taken_port_is_one_line_naming_it(capsys):
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        code, out, err = run_demo(capsys, "--port", port, LAB01)
    assert code == demo.EXIT_NO_LAB
    assert err.count("\n") == 1 and f"port {port} is already taken" in err, err


def start_demo(*args, env=()):
    return subprocess.Popen(
        [sys.executable, "-m", "tools.demo", "--backend", "local", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **dict(env)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal gives it
    )


def read_until(proc, marker, count=1, seen=b""):
    """The demo's stdout (bytes, read as it comes) until marker has appeared count times."""
    while seen.count(marker.encode()) < count:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"the demo ended before {marker!r}: {seen.decode()}")
        seen += chunk
    return seen


READ = {"x86_64": "0", "aarch64": "63"}[os.uname().machine]  # read(2)'s number, /proc/PID/syscall


def reading_stdin(pid):
    """PID is blocked in read(0, ...). A Ctrl-C sent as soon as the prompt shows can land
    between CPython's check for signals and its read of stdin; the read then waits for the next
    line (the KeyboardInterrupt with it), so the tests type Ctrl-C only once the demo reads."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[:2] == [READ, "0x0"]
    except OSError:
        return False


def children_of(pid):
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def descendants(pid):
    found = [pid]
    for parent in found:
        found += children_of(parent)
    return found


def nothing_listens(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("step", [True, False], ids=["waiting-for-enter", "mid-run"])
def test_ctrl_c_stops_the_demo_and_leaves_nothing_behind(step):
    proc = start_demo(*(["--step"] if step else []), str(LAB01))
    try:
        if step:  # Enter runs the reset, Enter runs `up`; Ctrl-C at the next prompt
            seen = b""
            for prompts in (1, 2):
                seen = read_until(proc, "(Enter to run)", prompts, seen)
                proc.stdin.write(b"\n")
                proc.stdin.flush()
            seen = read_until(proc, "(Enter to run)", 3, seen)
            wait_until(lambda: reading_stdin(proc.pid), 10, "the demo reading its stdin")
        else:
            seen = read_until(proc, '"event": "crash"')
        port, data_dir = INTRO.search(seen.decode()).groups()
        assert not nothing_listens(int(port))  # the demo's receiver is up
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=STOP_DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.decode() == "demo stopped; nothing left behind\n"
    wait_until(lambda: nothing_listens(int(port)), 5, f"port {port} free")
    assert not Path(data_dir).exists()
    if step:  # a stop at a prompt leaves the same as mid-run: the next demo runs once, below
        return
    again = subprocess.run(
        [sys.executable, "-m", "tools.demo", "--backend", "local", str(LAB01)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr


DRILLING = """# Lab 99: a drill still running

**What it shows.** The demo stopped while a drill runs natively.

## Start

```console
$ docker compose -p stateful-lab run --rm drill effectdrill_graphs.sidebyside:build --input \
'{"run": "{thread}"}' --observe effectdrill_graphs.sidebyside:observe
```
"""


def test_ctrl_c_mid_drill_leaves_nothing_in_the_temporary_folder(tmp_path):
    """The demo kills the command a Ctrl-C stops (local.run_command): a drill killed so removes
    none of its temporary files (its checkpoints' folder, a --context's ledger). They are in the
    lab's folder, and go with it. The drill is held in its clean run: sidebyside's gate, in every
    process (SIDE_DRILL_PID names none), waits for a second mark that does not come."""
    guide, side, temp = tmp_path / "99-drilling.md", tmp_path / "side", tmp_path / "temp"
    guide.write_text(DRILLING, encoding="utf-8")
    (side / "marks").mkdir(parents=True)
    temp.mkdir()
    env = {"TMPDIR": str(temp), "SIDE_DIR": str(side), "SIDE_DRILL_PID": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    proc = start_demo(str(guide), env=env)
    try:
        read_until(proc, "python -m labs.drill")
        wait_until(lambda: any((side / "marks").iterdir()), 60, "the drill's clean run held")
        assert any(temp.glob("stateful-lab-*/tmp/effectdrill-*"))  # its checkpoints' folder
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=STOP_DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.decode() == "demo stopped; nothing left behind\n"
    assert list(temp.iterdir()) == []


@pytest.mark.fast
@pytest.mark.parametrize(
    "project, words",
    [
        ("stateful-lab", "'stateful-lab' is your own lab's project"),
        ("Class_A", "'Class_A' is not a Compose project name"),
    ],
)
def test_make_demo_project_names_a_project_of_its_own_and_never_the_learners(project, words):
    """Issue 49: two instructors on one engine shared stateful-lab-demo; PROJECT=... names one.
    The learner's own project is refused before anything runs: the demo starts with `down -v`."""
    make = [
        "make", "--no-print-directory", "-o", ".venv/.installed", f"PY={sys.executable}", "demo",
        "BACKEND=docker",
        f"PROJECT={project}", f"GUIDES={LAB01}",
    ]  # fmt: skip
    done = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    line, *makes = done.stderr.splitlines()  # the demo's one line, then make's own
    assert line.startswith("python -m tools.demo: argument --project: " + words), line
    assert [m for m in makes if not re.match(r"make(\[\d+\])?: ", m)] == [], done.stderr


@pytest.mark.fast
def test_an_image_build_counts_its_seconds_from_the_first_on_a_terminal():
    """Issue 49: "building the image..." stood still for 54 s. On a terminal the build's line
    counts from its first second (a command's `running...` waits two), and is erased after."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        with demo.Running(True, "building the image", 0):
            wait_until(lambda: "building the image... 1 s" in shown.getvalue(), 10, "a count")
    assert shown.getvalue().startswith("\r  building the image... ")
    assert shown.getvalue().endswith("\r\x1b[K")  # erased: the demo prints the total after it


def test_a_guide_that_does_not_exist_is_one_line_and_exit_2(capsys):
    assert demo.main(["--backend", "local", "labs/99-no-such-guide.md"]) == demo.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such guide labs/99-no-such-guide.md" in err


HOLDING = "import signal; print('holding', flush=True); signal.pause()"  # until stopped
HOLD = f"""# Lab 99: a command still running

**What it shows.** The demo stopped while a command runs in its container.

## Start

```console
$ docker compose -p stateful-lab down -v --remove-orphans
$ docker compose -p stateful-lab up -d --build api
$ docker compose -p stateful-lab run --rm workflow tickets
{{"event": "tickets", "tickets": []}}
$ docker compose -p stateful-lab run --rm --entrypoint python workflow -c "{HOLDING}"
holding
```
"""


@pytest.mark.docker
def test_ctrl_c_while_a_docker_command_runs_leaves_nothing_behind(tmp_path):
    """Ctrl-C while a `run --rm` container runs (it mounts the checkpoint volume): the demo's
    Compose client dies, the engine removes the container only once it has stopped, and a
    `down -v` in between keeps the volume ("Resource is still in use", exit 0). The demo must
    remove everything, and say so only when the engine lists nothing of its project."""
    from tools.local import run_command

    project = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test") + "-demo-stop"
    guide = tmp_path / "99-hold.md"
    guide.write_text(HOLD, encoding="utf-8")
    label = f"label=com.docker.compose.project={project}"
    one_off = [
        "docker",
        "ps",
        "-q",
        "--filter",
        label,
        "--filter",
        "label=com.docker.compose.oneoff=True",
    ]

    def left(kind):
        listing = ["docker", kind, "ls", "-q", "--filter", label]
        return run_command(
            listing + (["-a"] if kind == "container" else []), timeout=30
        ).stdout.split()

    def holding():  # its container runs, and Python in it has printed its line
        ids = run_command(one_off, timeout=30).stdout.split()
        return bool(ids) and "holding" in run_command(["docker", "logs", ids[0]], timeout=30).stdout

    demo_command = [
        "-m",
        "tools.demo",
        "--backend",
        "docker",
        "--project",
        project,
        str(guide),
    ]
    proc = subprocess.Popen(
        [sys.executable, *demo_command],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a terminal gives it
    )
    try:
        read_until(proc, HOLDING)  # the demo has started the holding command
        wait_until(holding, 120, "the holding command running in its container")
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        leftovers = {kind: left(kind) for kind in ("container", "volume", "network")}
    finally:
        if proc.poll() is None:
            proc.kill()
        run_command(
            [*compose_command(), "-p", project, "down", "-v", "--remove-orphans"], timeout=120
        )
    assert proc.returncode == 130, err
    assert err.decode() == "demo stopped; nothing left behind\n"
    assert leftovers == {"container": [], "volume": [], "network": []}


HELD = """# Lab 99: commands that take a while

**What it shows.** Two commands, each held at a failpoint until the test lets it go.

## Hold

```console
$ docker compose -p stateful-lab down -v --remove-orphans
$ docker compose -p stateful-lab up -d --build api
$ docker compose -p stateful-lab run --rm -e FAILPOINTS=after-prepare=pause({first}) \
    workflow start --thread held --operation held:v1
{{"event": "prepare", "operation": "held:v1"}}
{{"created": true, "event": "effect_ack", "ticket_id": 1}}
{{"event": "done", "key": "held:v1", "mode": "ledger", "operation_id": "held:v1", \
"ticket_id": 1, "title": "Check supplier configuration"}}
$ docker compose -p stateful-lab run --rm -e FAILPOINTS=after-prepare=pause({second}) \
    workflow start --thread held-2 --operation held:v2
```
"""
RUNNING = re.compile(rb"\r  running\.\.\. (\d+) s")


def read_pty(master, marker, seen, deadline_s=180):  # a hang guard, not a speed bound
    """The pty's output until the pattern marker matches after what was seen (bytes)."""
    import select

    start, deadline = len(seen), time.monotonic() + deadline_s
    while not re.search(marker, seen[start:]):
        if not select.select([master], [], [], max(0, deadline - time.monotonic()))[0]:
            raise AssertionError(f"no {marker!r} within {deadline_s} s: {seen.decode()}")
        seen += os.read(master, 4096)
    return seen


def drain(master):
    """What the pty holds now, without waiting for more."""
    import select

    out = b""
    while select.select([master], [], [], 0)[0]:
        chunk = os.read(master, 4096)
        if not chunk:
            break
        out += chunk
    return out


def test_make_demo_shows_a_long_command_running_and_ctrl_c_ends_it_with_status_130(tmp_path):
    """`make demo` on a terminal (a real pty; make is its session's foreground, as in a shell),
    a guide whose commands are held at a failpoint (pause(PATH)) until the test lets them go, so
    each must outlast the couple of seconds: a live `running... N s` line appears under the
    command, and is erased (\\r, erase line) before its output (keys typed meanwhile are not
    echoed into it: an Enter pressed twice left the line above the output). The second is
    stopped with a typed Ctrl-C: the demo's one line and nothing from make after it (no
    "Error 130", no "Interrupt"), and make itself dies of the SIGINT, which a shell reports as
    status 130 (a script's `make demo && ...` stops there)."""
    import pty

    import failpoints

    first, second = tmp_path / "first", tmp_path / "second"
    guide = tmp_path / "99-held.md"
    guide.write_text(HELD.format(first=first, second=second), encoding="utf-8")
    make = [
        "make", "-o", ".venv/.installed", f"PY={sys.executable}", "demo",
        "BACKEND=local", f"GUIDES={guide}", f"PICTURES={tmp_path}",
    ]  # fmt: skip
    pid, master = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty, as a shell's is
        os.chdir(ROOT)
        os.environ.pop("NO_COLOR", None)
        os.execvp("make", make)
    seen, typed = b"", False
    try:
        seen = read_pty(master, rb"--operation held:v1\r\n", seen)  # shown as it runs
        seen = read_pty(master, RUNNING, seen)  # held: the line must come
        wait_until(first.exists, 30, "the command at its point")  # it waits there
        os.write(master, b"typed ahead\r")  # keys pressed while it runs: not echoed into it
        failpoints.unpause(first)
        seen = read_pty(master, rb'"event": "done"', seen)
        assert b"typed ahead" not in seen, seen
        *_, shown = RUNNING.finditer(seen)
        assert int(shown.group(1)) >= demo.Running.AFTER_S
        after = seen[shown.end() :]
        assert after.startswith(b"\r\x1b[K"), after[:80]  # erased before the output
        assert after.index(b"\r\x1b[K") < after.index(b'"event": "prepare"')
        if b"--operation held:v2\r\n" not in after:  # it may have come with the first's output
            seen = read_pty(master, rb"--operation held:v2\r\n", seen)
        seen = read_pty(master, RUNNING, seen)  # the second, held until Ctrl-C
        os.write(master, b"\x03")  # Ctrl-C, typed: the terminal sends SIGINT to its foreground
        typed = True
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the pty closed: every process on it has exited
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if not typed:  # failed before its Ctrl-C: each process group under make gets one
            for group in {os.getpgid(p) for p in descendants(pid)}:
                os.killpg(group, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        os.close(master)
    said = seen.decode(errors="replace").replace("\r\n", "\n")
    assert said.count("demo stopped; nothing left behind\n") == 1, said
    assert said.rstrip().endswith("demo stopped; nothing left behind"), said
    assert "make:" not in said and "Traceback" not in said, said
    assert os.waitstatus_to_exitcode(status) == -signal.SIGINT  # a shell's $?: 130


def test_an_enter_pressed_twice_runs_one_command_not_the_next(tmp_path):
    """STEP=1 on a terminal (a real pty): Enter typed twice at a prompt runs that command; the
    second Enter, typed while it ran, does not answer the next prompt, which waits."""
    import pty

    pid, master = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execvp(sys.executable, [sys.executable, "-m", "tools.demo", "--backend", "local",
                                   "--step", "--pictures", str(tmp_path), str(LAB01)])  # fmt: skip
    seen, typed = b"", False
    try:
        seen = read_pty(master, rb"\(Enter to run", seen)
        wait_until(lambda: reading_stdin(pid), 10, "the demo reading the terminal")
        os.write(master, b"\r\r")  # the reset's prompt, answered twice at once
        seen = read_pty(master, rb"\(Enter to run", seen)  # the next: `up`
        wait_until(lambda: reading_stdin(pid), 30, "the demo reading the terminal")
        seen += drain(master)  # all it printed before it began to wait
        said = seen.decode(errors="replace")
        assert said.count("(Enter to run") == 2, said  # waiting at `up`, which has not run
        os.write(master, b"\x03")  # Ctrl-C: the demo's own group (it took the foreground)
        typed = True
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 4096):
                seen += chunk
    finally:
        if not typed:
            os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == demo.EXIT_STOPPED


def test_o_at_the_prompt_opens_what_was_folded(monkeypatch, capsys):
    """STEP=1 in projector mode: `o` tells the folded text as the guide's text (a list a bullet a
    line) and prints the folded output as it came; Enter then runs the command."""
    teller = demo.Demo(None, demo.Style(False), step_mode=True, projector=True, width=100)
    teller.folds = [
        ("text", "- `graph/state.py`: a channel\n- the next"),
        ("output", "out 1\nout 2"),
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO("o\n\n"))
    teller.prompt()
    out = capsys.readouterr().out
    assert "  - graph/state.py: a channel\n  - the next\n" in out and "out 1\nout 2\n" in out
    assert out.count("(Enter to run") == 2 and teller.folds == []  # asked again, then Enter


def bash_words(command):
    """The words bash reads in COMMAND (one per line), as a paste into a shell would give them."""
    done = subprocess.run(
        ["bash", "-c", "f() { printf '%s\\n' \"$@\"; }; f " + command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.fast
def test_the_projector_breaks_a_long_command_between_its_words_and_bash_reads_the_same():
    """Through Docker the room sees each guide command as written, some longer than 120 columns
    (lab 11's drills): broken mid-word by the terminal, a pasted line would not run. Fitted, each
    line fits and bash reads the same words (a quoted JSON argument stays one word)."""
    lab11 = ROOT / "labs" / "11-drill-your-own-graph.md"
    commands = [step.command for step in parse_guide(lab11.read_text(encoding="utf-8"))]
    assert max(map(len, commands)) > 119  # the guide has them: otherwise this checks nothing
    for command in commands:
        shown = demo.shown_command(command, 119)
        lines = shown.splitlines()
        assert lines[0].startswith("$ ") and all(len(line) <= 119 for line in lines), shown
        assert bash_words(shown[2:]) == bash_words(command), shown


@pytest.mark.fast
def test_the_projector_fits_the_backend_line_to_the_room(capsys):
    """The demo's first line, long through Docker, is wrapped between words in projector mode
    (not cut mid-word by the room's terminal); for a file it stays one line."""
    backend = type("Backend", (), {"name": "docker", "project": "stateful-lab-demo"})()
    demo.introduce(backend, "chosen", projector=True, width=60)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines)
    assert " ".join(line.strip() for line in lines).endswith("your own lab is left alone.")
    demo.introduce(backend, "chosen")
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.fast
def test_the_terminal_timeline_breaks_a_long_mark_between_words(tmp_path):
    """Lab 11's approval drill has a summary longer than the room's terminal: its mark in the
    timeline is broken between words, every line within the width, every word kept."""
    said = (
        "10 crash points, 3 duplicate (request), 0 missing, 0 failed resumes, the clean run "
        "repeated request (request_refund re-ran it after an interrupt)"
    )
    teller = demo.Demo(None, demo.Style(False), projector=True, width=60)
    teller.timeline = [
        ("docker compose -p stateful-lab run --rm drill labs.graphs.a:g", [], 1, said)
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        demo.draw(teller, "labs/11-x.md", tmp_path)
    drawn = out.getvalue().split("Timeline\n")[1].splitlines()
    assert drawn[0] == "  drill labs.graphs.a:g" and all(len(line) <= 60 for line in drawn)
    assert " ".join(" ".join(drawn[1:]).split()) == f"[{said}]"


@pytest.mark.fast
def test_the_guides_text_and_a_verdict_break_between_words_never_at_a_hyphen(capsys):
    """At 120 columns lab 01's paragraph broke `--remove-orphans` as `--remove-` / `orphans` and
    lab 09's `term-at:after-ack` as `term-` / `at:after-ack` (textwrap breaks at hyphens by
    default): a room reads, and an instructor pastes, the word whole."""
    text = (ROOT / "labs" / "01-the-duplicate.md").read_text(encoding="utf-8")
    paragraph = next(p for p in text.split("\n\n") if "--remove-orphans" in p)
    words = demo.plain(" ".join(paragraph.split()), demo.Style(False)).split()
    for width in range(40, 121):
        demo.wrap_paragraph(paragraph, demo.Style(False), width=width)
        lines = capsys.readouterr().out.splitlines()
        assert [w for line in lines for w in line.split()] == words, (width, lines)
    op = demo.Operation("naive", tickets=[1, 2], notes=["start was killed at crash-at:after-ack"])
    teller = demo.Demo(None, demo.Style(False), projector=True, width=60)
    ledger = demo.TicketsByOperation()
    ledger.operations["case-a-long-operation-name:open-ticket:v1"] = op
    teller.backend = type("B", (), {"tickets": lambda self: []})()
    teller.verdict(ledger)
    said = capsys.readouterr().out.split("Verdict, counted on the receiver\n")[1].splitlines()
    assert " ".join(" ".join(said).split()) == op.verdict(
        "case-a-long-operation-name:open-ticket:v1"
    ) and all(len(line) <= 60 for line in said)
    assert not any(line.rstrip().endswith("-") for line in said), said


def ticket(number, key=None, title="Check supplier configuration"):
    return {"ticket_id": number, "key": key, "payload": {"title": title}}


@pytest.mark.fast
def test_the_verdict_says_where_the_run_was_killed_and_which_command_sent_it_again():
    """What the room saw, in the verdict: the kill (labs/cli.py's crash event names its point), the
    command that sent the effect again (lab 01's resume, lab 07's approve, lab 04's second
    start), lab 12's refusal by the resume contract, and lab 10's woken worker (sent nothing,
    or sent again and got created: false). The commands' own output, as labs/cli.py and
    labs/workers.py print it, fed to the demo's TicketsByOperation."""
    ledger, op = demo.TicketsByOperation(), "case-naive:open-ticket:v1"
    start = f"start --thread naive --operation {op} --mode naive --crash"
    say = "docker compose -p stateful-lab run --rm workflow "
    action, name = ledger.operation(say + start)
    crashed = (
        '{"created": true, "event": "effect_ack", "ticket_id": 1}\n'
        '{"at": "after-ack", "event": "crash"}\n'
    )
    ledger.record(action, name, crashed, [ticket(1)], 137)
    action, name = ledger.operation(say + "resume --thread naive")
    done = f'{{"event": "done", "operation_id": "{op}", "ticket_id": 2}}\n'
    resumed = '{"created": true, "event": "effect_ack", "ticket_id": 2}\n' + done
    ledger.record(action, name, resumed, [ticket(1), ticket(2)])
    assert ledger.operations[op].verdict(op) == (
        f"{op}: 2 tickets for one operation (duplicate), start killed at after-ack, "
        "resume sent it again (ticket 2)"
    )
    # a command that made the operation's first ticket sent nothing again (lab 17's start, whose
    #   two tickets LangGraph's retry made, says so in its own words)
    ledger, op = demo.TicketsByOperation(), "case-017-naive:open-ticket:v1"
    action, name = ledger.operation(say + f"start --thread r --operation {op} --mode naive")
    ledger.record(action, name, "", [ticket(1), ticket(2)])
    assert "again" not in ledger.operations[op].verdict(op)
    # lab 12: the resume refused by the contract, then the migrated resume makes the ticket
    ledger, op = demo.TicketsByOperation(), "case-guarded:open-ticket:v1"
    action, name = ledger.operation(say + f"start --thread guarded --operation {op}")
    ledger.record(action, name, '{"event": "drained", "next": ["create_ticket"]}', [], 75)
    action, name = ledger.operation(say + "resume --thread guarded")
    ledger.record(action, name, '{"event": "contract_mismatch"}', [], 65)
    made = '{"created": true, "event": "effect_ack", "ticket_id": 1}\n'
    ledger.record(action, name, made + done.replace("2}", "1}"), [ticket(1, op)])
    assert ledger.operations[op].verdict(op) == (
        f"{op}: 1 ticket, start drained on SIGTERM at a step boundary, "
        "resume refused: the thread was saved under another graph (exit 65)"
    )
    # lab 10: the woken worker's run, as `worker wait --thread` reports it
    ledger = demo.TicketsByOperation()
    for thread, outcome, verdict in (
        (
            "case-6",
            '"created": false, "sent": true, "ticket_id": 7',
            "1 ticket, the frozen worker, once woken, sent it again and got created: false "
            "(the key), ticket 7 by the worker started by hand (`worker run`)",
        ),
        (
            "case-7",
            '"sent": false, "ticket_id": 8',
            "1 ticket, the frozen worker, once woken, sent nothing (the ledger held ticket 8's "
            "receipt), ticket 8 by the worker started by hand (`worker run`)",
        ),
    ):
        op = f"{thread}:open-ticket:v1"
        work = "docker compose -p stateful-lab run --rm worker "
        ledger.operation(work + f"submit --thread {thread} --operation {op} --lab-hold x")
        number = int(outcome.rsplit(" ", 1)[1])
        ran = f'{{"event": "done", "operation_id": "{op}", "ticket_id": {number}}}'
        ledger.record(*ledger.operation(work + "run --drain"), ran, [ticket(number, op)])
        woke = f'{{"at": "before-request", "event": "held_run", "thread": "{thread}", {outcome}}}'
        ledger.record(*ledger.operation(work + f"wait --thread {thread}"), woke, [])
        assert ledger.operations[op].verdict(op) == f"{op}: {verdict}"


@pytest.mark.fast
def test_every_section_of_every_guide_is_told_and_each_on_langgraphs_source_folds():
    """A section with no command (lab 09's grace period, lab 15's "When is 'nothing found'
    proof?", lab 06's receiver that offers neither, ...) was dropped from the demo: every
    heading but "What to notice" is now a chapter, its text and code as the guide has them.
    Every section on LangGraph's own source, titled "(checked against langgraph ...)", folds
    in projector mode (lab 17's "Which exceptions LangGraph retries" was told in full)."""
    for path in sorted((ROOT / "labs").glob("[0-9][0-9]-*.md")):
        text = path.read_text(encoding="utf-8")
        items = demo.markdown_items(text)
        headings = [t for kind, t in items if kind == "heading"][1:]
        story = demo.parse_story(text)
        told = [c.heading for c in story.chapters]
        assert set(headings) - {"What to notice"} <= set(told), path.name
        for chapter in story.chapters:
            assert chapter.folded == ("(checked against langgraph " in chapter.heading)
    lab09 = demo.parse_story((ROOT / "labs" / "09-a-deploy-mid-run.md").read_text("utf-8"))
    (grace,) = [c for c in lab09.chapters if c.heading.startswith("What a deploy sends")]
    assert grace.steps == [] and "\n      workflow:\n        stop_grace_period: 2m" in grace.before
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        demo.tell_text(grace.before, demo.Style(False), 100)
    assert "\n        workflow:\n" in out.getvalue()  # the guide's yaml, indented as a block


@pytest.mark.fast
def test_a_resume_that_finds_no_thread_says_so_and_one_waiting_for_approval_does_not():
    """Lab 04's "exit" durability: the resume finds no thread (exit 4, stderr `no thread ...`)
    and the start again sends it again; lab 07's refused resume (exit 4, the thread waits for
    approval) is no such thing."""
    ledger, op = demo.TicketsByOperation(), "case-exit:open-ticket:v1"
    say = "docker compose -p stateful-lab run --rm workflow "
    start = say + f"start --thread exit --operation {op} --mode naive --durability exit"
    crashed = (
        '{"created": true, "event": "effect_ack", "ticket_id": 6}\n'
        '{"at": "after-ack", "event": "crash"}\n'
    )
    ledger.record(*ledger.operation(start + " --crash-at after-ack"), crashed, [ticket(6)], 137)
    missing = "labs: no thread 'exit' to resume; check --thread\n"
    ledger.record(*ledger.operation(say + "resume --thread exit"), "", [], 4, missing)
    again = '{"created": true, "event": "effect_ack", "ticket_id": 7}\n'
    ledger.record(*ledger.operation(start), again, [ticket(6), ticket(7)])
    assert ledger.operations[op].verdict(op) == (
        f"{op}: 2 tickets for one operation (duplicate), start killed at after-ack, resume found "
        "no thread to resume (exit 4), start sent it again (ticket 7)"
    )
    ledger, op = demo.TicketsByOperation(), "case-in-node:open-ticket:v1"
    ledger.record(*ledger.operation(say + f"start --thread t --operation {op}"), "", [ticket(1)])
    waits = "labs: thread 't' waits for approval; answer with approve (or --reject)\n"
    ledger.record(*ledger.operation(say + "resume --thread t"), "", [ticket(1)], 4, waits)
    assert ledger.operations[op].verdict(op) == f"{op}: 1 ticket"


@pytest.mark.fast
def test_a_folded_sections_long_command_is_one_line_and_o_opens_it_whole():
    """Lab 08's native `python -c '...'` in its folded section on LangGraph's source is one
    quoted word wider than 120 columns: the terminal broke it mid-word. Folded, it is one line
    within the width, and the whole command (as bash reads it) is among what `o` opens;
    outside a folded section a long command is still shown whole, broken between words."""
    lab08 = ROOT / "labs" / "08-the-window-is-longer-than-the-node.md"
    story = demo.parse_story(lab08.read_text(encoding="utf-8"))
    (chapter,) = [c for c in story.chapters if c.folded]
    command = native.line(parse_command(chapter.steps[0].command), {}, True, False)
    whole = demo.shown_command(command, 119)  # its quoted word stays whole: too wide
    assert max(map(len, whole.splitlines())) > 119  # else this checks nothing
    teller = demo.Demo(None, demo.Style(False), projector=True, width=119)
    line = teller.command_line(command, folded=True)
    assert "\n" not in line and len(line) <= 119 and line.endswith("(o opens the whole)")
    ((kind, whole),) = teller.folds
    assert kind == "output" and bash_words(whole[2:]) == bash_words(command)
    start = story.chapters[1].steps[0].command  # a start, not folded: whole, between words
    assert bash_words(teller.command_line(start)[2:]) == bash_words(start)


@pytest.mark.fast
def test_a_numbered_items_lines_stand_under_its_text(capsys):
    """Lab 18's "How the inbox holds" is a numbered list: each item's later lines start where
    its text does ("  1. " is five columns), as a bullet's do ("  - ", four)."""
    lab18 = ROOT / "labs" / "18-the-webhook-that-came-twice.md"
    story = demo.parse_story(lab18.read_text(encoding="utf-8"))
    (holds,) = [c for c in story.chapters if c.heading == "How the inbox holds"]
    demo.tell_text(holds.before, demo.Style(False), 100)
    lines = capsys.readouterr().out.splitlines()
    items = [i for i, line in enumerate(lines) if re.match(r"  \d\. ", line)]
    assert len(items) == 3 and lines[items[0] + 1].startswith("     ")  # wrapped: five spaces
    for i in items:
        for line in itertools.takewhile(str.strip, lines[i + 1 :]):
            if not re.match(r"  \d\. ", line):
                assert re.match(r" {5}\S", line), line


@pytest.mark.parametrize("case", ["link to a file", "dangling link", "FIFO", "inside the source"])
def test_a_picture_path_the_demo_must_not_write_to_is_one_line_and_exit_2(tmp_path, case):
    """REVIEW part B: a link at PICTURES/lab-01.svg was written through (a dangling one made its
    target outside the folder), a FIFO there hung the demo. Each is refused before anything
    runs: one line, exit 2, and the file a link points to is unchanged."""
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    target, elsewhere = pictures / "lab-01.svg", tmp_path / "elsewhere.svg"
    if case == "link to a file":
        elsewhere.write_text("someone's file", encoding="utf-8")
        target.symlink_to(elsewhere)
    elif case == "dangling link":
        target.symlink_to(elsewhere)
    elif case == "FIFO":
        os.mkfifo(target)
    else:
        pictures = ROOT / "labs"  # the guides' own folder
    done = subprocess.run(
        [sys.executable, "-m", "tools.demo", "--backend", "local", "--plain",
         "--pictures", str(pictures), str(LAB01)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == demo.EXIT_USAGE and done.stdout == "", done
    (line,) = done.stderr.splitlines()
    why = {
        "link to a file": "is a symbolic link, not a file",
        "dangling link": "is a symbolic link, not a file",
        "FIFO": "is a FIFO, not a file",
        "inside the source": "inside the lab's own source",
    }[case]
    assert line.startswith("demo: ") and why in line, line
    if case == "link to a file":
        assert elsewhere.read_text(encoding="utf-8") == "someone's file"
    if case == "dangling link":
        assert not elsewhere.exists()
    assert not (ROOT / "labs" / "lab-01.svg").exists()


def test_a_thread_id_with_control_characters_makes_a_well_formed_picture(tmp_path):
    """A command's words reach the picture as its label: a thread id holding control
    characters (ESC, BEL, NUL) is shown escaped, and the SVG is XML an XML parser and Chromium
    read (before: a character XML 1.0 cannot hold, and Chromium's parser error)."""
    import types
    import xml.etree.ElementTree as ElementTree

    thread = "t\x1b[2J\x07\x00x"
    ran = types.SimpleNamespace(
        timeline=[
            (
                f"docker compose -p stateful-lab run --rm workflow start --thread '{thread}'",
                [{"event": "effect_ack", "created": True, "ticket_id": 1}],
                0,
                "",
            )
        ],
        keys={1: "case-\x01:open-ticket:v1"},
        projector=False,
    )
    path = demo.draw(ran, LAB01, tmp_path)
    page = path.read_text(encoding="utf-8")
    parsed = ElementTree.fromstring(page)  # well-formed, or a ParseError here
    texts = [t.text for t in parsed.iter("{http://www.w3.org/2000/svg}text")]
    for shown in (texts, chromium_text(path)):  # as an XML parser reads it, then Chromium
        assert "start (thread t\\x1b[2J\\x07\\x00x)" in shown, shown
        assert "ticket 1, key case-\\x01:open-ticket:v1: created" in shown, shown
