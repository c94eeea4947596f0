"""The README and docs/ are executed too: lab 01 as the README shows it, the demo block, the
native block and table, the layout, the links.

docs/demo.md's block (`make demo BACKEND=local`: labs 01-03, every command a process) is also
where the story the demo tells is checked (tests/guides/test_demo.py checks the rest in-process),
and lab 01's picture (tests/pictures_helpers.py)."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.request

import pytest
from pictures_helpers import assert_each_picture_marks_what_was_told

from tools.backends import parse_command
from tools.local import ROOT, free_port, lab_env, wait_until
from tools.runner import BLOCK, lines_match, parse_guide

README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in (ROOT / "docs").glob("*.md")}
DEMO = DOCS["demo.md"]  # the demo, and the make targets
NATIVE = DOCS["native.md"]  # the lab without Docker: its bash block and its table
EVERYWHERE = README + "".join(DOCS.values())
LAB_01 = ROOT / "labs" / "01-the-duplicate.md"
SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
SHELLS = [shell for shell in ("bash", "zsh") if shutil.which(shell)]  # bash is always there


@pytest.mark.long
def test_the_readme_demo_block_prints_what_it_shows(tmp_path):
    (step,) = [s for s in parse_guide(DEMO) if s.command.startswith("make demo")]
    env = lab_env(tmp_path, free_port())  # PORT: a free port, not the default 8000
    for inherited in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):  # run it as a learner would, not
        env.pop(inherited, None)  # as a sub-make of `make test` (which prints "Entering ...")
    env["PICTURES"] = str(tmp_path / "pictures")  # the timelines: never the learner's data/
    done = subprocess.run(
        step.command.split(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == step.exit_code, done.stdout + done.stderr
    assert lines_match(step.expected, done.stdout.splitlines()), done.stdout
    assert done.stdout.startswith("backend: local")
    for lab in ("01", "02", "03"):  # each guide's timeline, where make was told to put it
        assert f"picture: {tmp_path / 'pictures' / f'lab-{lab}.svg'}\n" in done.stdout
    assert_the_demo_tells_labs_01_and_02_with_a_verdict_per_operation(done.stdout)
    # lab 01's picture, as make demo drew it (tests/pictures_helpers.py; 15, 16 and 18's:
    # test_guide_local), its part of the output read back: to the next lab's title
    lab_01 = done.stdout.split("=== Lab 01: ", 1)[1].split("\n=== Lab 02: ", 1)[0]
    assert_each_picture_marks_what_was_told({"01": lab_01}, tmp_path / "pictures", tmp_path)


def assert_the_demo_tells_labs_01_and_02_with_a_verdict_per_operation(out):
    """The story the demo tells around the commands (the block above checks its closing lines):
    the guide's title and paragraphs, the native lines, a verdict per operation before the
    reset, the receiver's side under `logs api`, and plain text when no terminal reads it."""
    assert "=== Lab 01: the duplicate ===" in out
    assert "The receiver starts empty." in out  # the guide's paragraph after its block
    assert "  natively: python -m labs tickets" in out
    assert (  # what the room saw, then the count: the kill, the resume that sent it again
        "case-naive:open-ticket:v1: 2 tickets for one operation (duplicate), start killed at "
        "after-ack, resume sent it again (ticket 2)"
    ) in out
    assert (
        "case-safe:open-ticket:v1: 1 ticket, start killed at after-ack, resume sent it again and "
        "got created: false (the key)"
    ) in out
    assert out.index("What to notice") < out.index("Verdict") < out.index("-- Reset")
    # `logs api` shows the receiver's side: lab 02's proof is its `replayed` line
    logs = out.split("$ docker compose -p stateful-lab logs api\n")
    assert len(logs) == 3 and "receiver: created key=None ticket=2\n" in logs[1], logs[1][:300]
    assert "\nreceiver: replayed key=case-safe:open-ticket:v1 ticket=1\n" in logs[2]
    assert "\033[" not in out  # not a terminal: plain text


@pytest.mark.fast
def test_every_console_block_in_the_readme_and_docs_is_run_by_a_test():
    """The README's one block is lab 01's commands and output (run below, and as lab 01 in both
    backends); docs/demo.md's is `make demo`; docs/native.md's bash block is run below."""
    lab_01 = [(s.command, s.expected, s.exit_code) for s in parse_guide(LAB_01.read_text())]
    shown = [(s.command, s.expected, s.exit_code) for s in parse_guide(README)]
    assert len(BLOCK.findall(README)) == 1 and shown, "a new README command needs a test"
    assert all(step in lab_01 for step in shown), "the README's lab 01 is not lab 01's"
    assert [s.command for s in parse_guide(DEMO)] == ["make demo BACKEND=local"]
    others = {name: text for name, text in DOCS.items() if name not in ("demo.md",)}
    assert not any(BLOCK.findall(text) for text in others.values()), "a new docs block needs a test"
    assert len(SHELL_BLOCK.findall(NATIVE)) == 1  # the native block, run below
    assert not any(SHELL_BLOCK.findall(t) for n, t in DOCS.items() if n != "native.md")


def test_the_readme_shows_lab_01_as_it_runs_natively(tmp_path):
    """The README's block, run through the local backend as a guide is: the duplicate it shows
    (two tickets for one operation) is the one a learner gets."""
    from tools.backends import LocalBackend
    from tools.runner import run_guide

    backend = LocalBackend(tmp_path / "data", log_path=tmp_path / "receiver.log", in_process=True)
    try:
        readme = tmp_path / "README.md"
        readme.write_text(README, encoding="utf-8")
        outcomes = run_guide(readme, backend)  # the README, read as a guide
    finally:
        backend.close()
    assert outcomes and all(o.ok for o in outcomes), [o.problems for o in outcomes]


@pytest.mark.fast
def test_the_layout_names_every_top_level_entry():
    """The README's layout tree names each folder and file at the top (root Python files as the
    core, requirements* as one word) and nothing that is not there."""
    (tree,) = re.findall(r"## Layout\n\n```\n(.*?)```", README, re.S)
    names = {w.rstrip("/") for line in tree.splitlines() for w in line.split("   ")[0].split()}
    names.discard("...")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    top = {path.split("/")[0] for path in tracked} - {"README.md", ".gitignore", ".dockerignore"}
    named = {t for t in top if t in names or (t.endswith(".py") and "/" not in t)}
    named |= {t for t in top if t.startswith("requirements") and "requirements*" in names}
    assert named == top, top - named
    assert names - {"requirements*"} <= top | {"docs"}, names - top


@pytest.mark.fast
def test_relative_links_point_at_files_that_exist():
    """Every relative link in README.md, docs/, labs/ and the READMEs beside the code, and
    every `#anchor` in one: a heading of that page with GitHub's slug for it."""
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "labs").glob("*.md")]
    pages += [ROOT / "effectdrill" / "README.md", ROOT / "tools" / "starter" / "README.md"]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s:]+)\)", page.read_text(encoding="utf-8")):
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            assert linked.exists(), f"{page.relative_to(ROOT)}: {target}"
            if anchor:
                assert anchor in heading_slugs(linked), f"{page.relative_to(ROOT)}: {target}"


def heading_slugs(page):
    """The anchors GitHub makes for a page's headings: lower case, spaces to hyphens, every
    character but letters, digits, hyphens and underscores dropped (code blocks skipped)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    titles = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def native_copy(tmp_path):
    """The tracked files in a temporary folder (mtimes kept), sharing this checkout's .venv."""
    copy = tmp_path / "lab"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, tracked):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    # The block's `make .venv/.installed` must find the venv up to date, not rebuild it here.
    fresh = subprocess.run(["make", "-q", ".venv/.installed"], cwd=copy, capture_output=True)
    assert fresh.returncode == 0, (
        "run `make .venv/.installed` first: the venv is older than the locks"
    )
    return copy


@pytest.mark.parametrize("shell", SHELLS)
def test_the_native_block_runs_lab_01_and_cleans_up(tmp_path, shell):
    (block,) = SHELL_BLOCK.findall(NATIVE)
    copy = native_copy(tmp_path)
    port = free_port()  # never the default 8000
    env = {k: v for k, v in lab_env(copy / "data", port).items() if k not in _SET_BY_THE_BLOCK}
    env["PORT"] = str(port)
    for inherited in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VIRTUAL_ENV"):
        env.pop(inherited, None)
    done = subprocess.run(
        [shell, "-c", block], cwd=copy, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "[exit 137]" in lines, done.stdout
    events = [json.loads(line) for line in lines if line.startswith("{")]
    assert events[0] == {"event": "tickets", "tickets": []}
    assert events[-2]["event"] == "done" and events[-2]["ticket_id"] == 2
    assert [t["ticket_id"] for t in events[-1]["tickets"]] == [1, 2]  # the duplicate
    log = [line for line in lines if line.startswith("receiver: ")]
    assert log[0] == f"receiver: listening on 127.0.0.1:{port}, tickets in {_RECEIVER_DB}"
    assert log[1:] == ["receiver: created key=None ticket=1", "receiver: created key=None ticket=2"]
    assert not (copy / "data").exists()  # the reset deleted tickets and checkpoints
    with pytest.raises(ConnectionRefusedError):  # and the receiver is gone: nothing listens
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


_SET_BY_THE_BLOCK = ("API_URL", "RECEIVER_DB", "CHECKPOINT_DB", "HOST")
_RECEIVER_DB = "data/receiver/receiver.sqlite"


def override_up(section, file):
    """The native table's row for an `up` with the override file (lab 06's: the fault's setting
    in front of the receiver's command)."""
    (command,) = re.findall(rf"^\| \d\d \| `{re.escape(file)}` \| `([^`]+)` \|$", section, re.M)
    return command


def wait_line(block):
    """The native block's line that waits for the receiver (the table's "wait line")."""
    (line,) = [line for line in block.splitlines() if line.startswith("n=0; until ")]
    return line


def test_the_wait_line_gives_up_and_shows_the_receivers_error_when_the_port_is_taken(tmp_path):
    """Another program holds the port: the receiver exits at once with its one-line error in
    data/receiver.log, and the wait line stops waiting, prints that line and removes the pid
    file that names the receiver gone (no stale pid for make reset or the next wait line)."""
    (block,) = SHELL_BLOCK.findall(NATIVE)
    lines = block.splitlines()
    up = lines[: lines.index(wait_line(block)) + 1]  # from `make .venv/.installed` to the wait
    copy = native_copy(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as stranger:  # listens, never answers HTTP
        port = stranger.getsockname()[1]
        env = {k: v for k, v in lab_env(copy / "data", port).items() if k not in _SET_BY_THE_BLOCK}
        env["PORT"] = str(port)
        for inherited in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "VIRTUAL_ENV"):
            env.pop(inherited, None)
        done = subprocess.run(
            ["bash", "-c", "\n".join(up)],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1:] == [  # after make's "up to date" line
        f"receiver: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "stop what uses it, or set PORT to a free one"
    ]
    assert not (copy / "data" / "receiver.pid").exists()


TABLE_ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)`", re.M)  # compose verb -> native command
COMPOSE_PREFIX = re.compile(r"^[\w.-]+\s+\| ?")  # "api-1  | " before a guide's log lines
STEP_MARK, EXIT_MARK = "::step::", "::exit::"


def native_script(guide_text, block):
    """The guide's commands translated with the README's table into one shell script."""
    section = NATIVE.split("\n## PowerShell", 1)[0]
    table = dict(TABLE_ROW.findall(section))
    setup = [line for line in block.splitlines() if line.startswith((". ", "export "))]
    until = wait_line(block)
    script = list(setup)
    for step in parse_guide(guide_text):
        command = parse_command(step.command)
        verb, rest = command.verb, command.args
        if verb == "run":
            native = table["run --rm workflow ARGS"].replace("ARGS", shlex.join(rest[2:]))
        elif verb == "up" and command.overrides:  # lab 06: the fault, on the receiver alone
            (file,) = command.overrides
            native = override_up(section, file)
        else:
            native = table[" ".join([verb, *rest])]
        script += [f"echo {STEP_MARK}", native, f'echo "{EXIT_MARK} $?"']
        if verb in ("up", "restart"):
            script.append(until + " >/dev/null")
    return "\n".join(script) + "\n"


@pytest.mark.parametrize("name", ["02-the-keyed-fix.md", "06-the-lost-acknowledgement.md"])
def test_the_native_table_runs_a_guide_as_the_guide_says(tmp_path, name):
    """Lab 02 restarts the receiver and reads its log; lab 06 needs the lost-ack fault on."""
    (block,) = SHELL_BLOCK.findall(NATIVE)
    text = (ROOT / "labs" / name).read_text(encoding="utf-8")
    copy = native_copy(tmp_path)
    port = free_port()
    env = {k: v for k, v in lab_env(copy / "data", port).items() if k not in _SET_BY_THE_BLOCK}
    env["PORT"] = str(port)
    done = subprocess.run(
        ["bash", "-c", native_script(text, block)],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    chunks = done.stdout.split(STEP_MARK + "\n")[1:]
    steps = parse_guide(text)
    assert len(chunks) == len(steps), done.stdout
    for step, chunk in zip(steps, chunks, strict=True):
        *printed, last = chunk.rstrip("\n").split("\n")
        assert last.startswith(EXIT_MARK), chunk
        assert int(last.removeprefix(EXIT_MARK)) == step.exit_code, (step.command, chunk)
        verb = parse_command(step.command).verb
        expected = [COMPOSE_PREFIX.sub("", line) for line in step.expected]
        if verb in ("run", "logs"):
            assert lines_match(expected, printed), (step.command, printed)
    assert not (copy / "data").exists()


def makefile_targets():
    """The Makefile's public targets: those listed in .PHONY."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    (phony,) = re.findall(r"^\.PHONY:(.*)$", text, re.M)
    return phony.split()


def test_every_make_target_is_in_the_readme_and_every_documented_one_exists():
    targets = makefile_targets()
    missing = [t for t in targets if f"make {t}" not in DEMO]
    assert not missing, f"docs/demo.md does not mention: {missing}"
    documented = set(re.findall(r"`make ([a-z][a-z-]*)", EVERYWHERE))
    assert documented <= set(targets), documented - set(targets)


def test_a_bare_make_lists_every_target_with_what_it_does():
    """`make` alone (and `make help`) prints one line per public target: no venv is made."""
    for argv in (["make"], ["make", "help"]):
        shown = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        listed = re.findall(r"^  make ([a-z][a-z-]*) +\S", shown.stdout, re.M)
        assert sorted(listed) == sorted(makefile_targets()), shown.stdout


def test_every_labs_tool_is_in_the_readme():
    modules = sorted(p for p in (ROOT / "tools").glob("*.py") if p.stem != "__init__")
    for module in modules:
        name = module.stem
        assert f"{name}.py" in EVERYWHERE or f"tools.{name}" in EVERYWHERE, f"docs: {name}"


def test_the_docs_list_exactly_workflow_pys_actions_and_exit_codes():
    import argparse

    EXITS = DOCS["exit-codes.md"]

    import workflow

    parser = workflow.build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subparsers.choices:
        assert f"`{action}`" in EXITS, f"docs/exit-codes.md does not name the `{action}` action"
    import exitcodes
    from labs import approval as approval_lesson  # lab 07's exit 77
    from labs import cli as lab
    from labs import contract as contract_lesson  # lab 12's exit 65
    from labs import trace_keys  # lab 05's exit 8

    modules = (exitcodes, lab, contract_lesson, approval_lesson, trace_keys)
    codes = {v for m in modules for k, v in vars(m).items() if k.startswith("EXIT_")}
    codes |= {0}
    table = EXITS.split("## Exit codes of workflow.py", 1)[1].split("\n## ", 1)[0]
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == codes


def test_the_cleanup_names_every_volume_compose_yaml_declares():
    """`down -v` removes the project's volumes: the README names each one, and counts them."""
    yaml = pytest.importorskip("yaml")
    declared = set(yaml.safe_load((ROOT / "compose.yaml").read_text())["volumes"])
    cleanup = DOCS["troubleshooting.md"].split("## Cleanup", 1)[1]
    (sentence,) = re.findall(r"The first removes [^;]*;", cleanup.replace("\n", " "))
    named = set(re.findall(r"`([a-z-]+-data)`", sentence))
    words = {2: "two", 3: "three", 4: "four", 5: "five"}
    assert named == declared and f" {words[len(declared)]} volumes" in sentence, sentence


def test_the_worker_benchmark_is_described_as_it_runs():
    """make bench and make bench-workers both run bench_workers with its ROUNDS and OPERATIONS;
    the README's sentence on the figures says how many."""
    from tools import bench_workers

    text = " ".join(DOCS["past-one-machine.md"].split())
    assert f"medians of {bench_workers.ROUNDS} rounds of {bench_workers.OPERATIONS}" in text


ASYNC_GRAPH = """
from pathlib import Path
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
class State(TypedDict, total=False):
    order: str
async def charge(state):
    with open(Path(state["order"] + ".charges"), "a") as charges:  # the effect, unkeyed
        charges.write("charged\\n")
    return {"order": state["order"]}
builder = StateGraph(State)
builder.add_node("charge", charge)
builder.add_edge(START, "charge")
builder.add_edge("charge", END)
graph = builder.compile()
def observe(thread):
    path = Path(thread + ".charges")
    return {"charge": len(path.read_text().splitlines()) if path.exists() else 0}
"""


def test_the_drill_drills_a_graph_with_async_nodes(tmp_path, monkeypatch, capsys):
    """README's "Drill your own graph": an `async def` node is drilled through the async API,
    and its unkeyed effect repeats when the kill lands after it, before its writes are saved."""
    from effectdrill.__main__ import main

    (tmp_path / "async_shop.py").write_text(ASYNC_GRAPH, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = [
        "async_shop:graph",
        "--observe",
        "async_shop:observe",
        "--input",
        '{"order": "{thread}"}',
    ]
    assert main(args) == 1  # a repeated effect: the drill's failing verdict
    out = capsys.readouterr().out
    assert "DUPLICATE" in out and "charge" in out, out


def test_the_reset_typed_in_a_second_shell_keeps_a_live_receivers_data(tmp_path):
    """docs/native.md's `down` line, typed in a shell that did not start the receiver (its `kill
    %1` stops nothing): data/ stays, with one line that says why and what stops it; the
    receiver still answers. Typed again once it is gone, the reset deletes data/."""
    table = dict(TABLE_ROW.findall(NATIVE.split("\n## PowerShell", 1)[0]))
    up, down = table["up -d --build api"], table["down -v --remove-orphans"]
    copy = native_copy(tmp_path)
    port = free_port()
    env = {k: v for k, v in lab_env(copy / "data", port).items() if k not in _SET_BY_THE_BLOCK}
    env.update(PORT=str(port), API_URL=f"http://127.0.0.1:{port}")
    env["PATH"] = f"{copy / '.venv' / 'bin'}:{env['PATH']}"  # `python` as the activated venv's
    first = subprocess.Popen(  # the first shell: its receiver, and the shell waits for it
        ["bash", "-c", f"{up}\nwait"], cwd=copy, env=env, start_new_session=True
    )
    try:
        wait_for_answer(port)
        second = subprocess.run(["bash", "-c", down], cwd=copy, env=env, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        pid = (copy / "data" / "receiver.pid").read_text().strip()
        assert second.stdout == (
            f"data/ kept: the receiver (pid {pid}) still serves it; make reset stops it\n"
        )
        assert (copy / "data" / "receiver" / "receiver.sqlite").exists()
        wait_for_answer(port)  # still serving its own files
        os.kill(int(pid), signal.SIGTERM)  # as the first shell's `kill %1`: its `wait` reaps it
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:  # the test failed first: nothing of it is left running
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(60)
    again = subprocess.run(["bash", "-c", down], cwd=copy, env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.stdout == "" and not (copy / "data").exists()


def wait_for_answer(port):
    """Until the receiver on port answers /health (a hang guard of 60 s)."""

    def answers():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
                return json.load(reply) == {"ok": True}
        except OSError:
            return False

    wait_until(answers, 60, f"a receiver on port {port}")


@pytest.mark.fast
def test_the_docs_count_the_lock_files_make_lock_renews():
    """REVIEW F: the README said `make lock` renews four lock files (it renews six)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nlock:", 1)[1].split("\n\n", 1)[0]
    renewed = re.findall(r"\$\(UV\) -o (\S+)", recipe)
    (said,) = re.findall(r"regenerate the (\w+) hashed lock files", DOCS["demo.md"])
    words = {4: "four", 5: "five", 6: "six", 7: "seven"}
    assert said == words[len(renewed)], (said, renewed)
