"""The demo, the drill and the chaos run never touch a learner's lab.

A copy of the repository holds a learner's half-done lab 01 in data/ (a crashed naive run:
ticket 1 on the receiver, a checkpoint waiting at create_ticket), served by a receiver the
learner started, whose PORT and API_URL are exported in the learner's shell. Each tool then
runs from that copy, as `make` runs it, and afterwards the learner's receiver, its tickets
and the checkpoint file are exactly as they were. (A copy, so the real data/ is never used.)
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from labs.tools import drill
from labs.tools.local import ROOT, ReceiverProcess, free_port, lab_env, run_workflow

TOOL_TIMEOUT_S = 600  # the whole drill on a busy 2-core machine


def fingerprint(repo, receiver):
    from workflow import TicketClient

    files = sorted(str(p.relative_to(repo)) for p in (repo / "data").rglob("*") if p.is_file())
    checkpoints = repo / "data" / "workflow" / "checkpoints.sqlite"
    return {
        "files": files,
        "checkpoints": hashlib.sha256(checkpoints.read_bytes()).hexdigest(),
        "tickets": TicketClient(receiver.url).tickets(),
        "running": receiver.running,
    }


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    repo = tmp_path_factory.mktemp("learner-repo")
    for path in [*ROOT.glob("*.py"), ROOT / "compose.yaml"]:
        shutil.copy(path, repo)
    shutil.copytree(ROOT / "labs", repo / "labs", ignore=shutil.ignore_patterns("__pycache__"))
    env = lab_env(repo / "data", free_port())  # data/receiver, data/workflow: the native layout
    receiver = ReceiverProcess(env, repo / "learner-receiver.log", script=repo / "api.py").start()
    crashed = run_workflow(
        ["start", "--thread", "naive", "--operation", "case-naive:open-ticket:v1"]
        + ["--mode", "naive", "--crash"],
        env,
    )
    assert crashed.returncode == -9, crashed.stderr
    shell = {**os.environ, "PORT": env["PORT"], "API_URL": env["API_URL"]}  # learner's exports
    before = fingerprint(repo, receiver)
    assert len(before["tickets"]) == 1 and before["running"]
    yield repo, receiver, shell, before
    receiver.stop()


def run_tool(learner, *args):
    repo, receiver, shell, before = learner
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=repo,
        env=shell,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
    )
    assert fingerprint(repo, receiver) == before, "the tool touched the learner's lab"
    return done


def test_the_demo_leaves_the_learners_lab_alone(learner):
    done = run_tool(learner, "labs.tools.demo", "--backend", "local", "labs/01-the-duplicate.md")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "case-naive:open-ticket:v1: 2 tickets for one operation (duplicate)" in done.stdout


def test_the_drill_leaves_the_learners_lab_alone_and_keeps_stdout_for_json(learner):
    """One boundary's rows as `make drill` runs them (tests/test_drill.py runs every cell)."""
    done = run_tool(learner, "labs.tools.drill", "--json", "--boundary", "after-checkpoint")
    assert done.returncode == 0, done.stdout + done.stderr
    cells = [json.loads(line) for line in done.stdout.splitlines()]  # every line is JSON
    chosen = drill.cells(["after-checkpoint"])
    expected = [(c.row.boundary, c.mode, c.row.durability, c.expected("tickets")) for c in chosen]
    got = [(c["boundary"], c["mode"], c["durability"], c["tickets"]) for c in cells]
    assert got == expected
    assert all(c["ok"] and c["why"] == [] for c in cells)
    progress = [line for line in done.stderr.splitlines() if line.startswith("drill: [")]
    total = len(chosen)
    assert len(progress) == total and progress[-1].startswith(f"drill: [{total}/{total}] ")


def test_chaos_leaves_the_learners_lab_alone(learner):
    done = run_tool(learner, "labs.tools.chaos", "--runs", "2", "--seed", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["tickets"] == 2


def test_make_reset_stops_the_native_receiver_and_deletes_data_but_not_the_venv(tmp_path):
    """`make reset` in a copy of the repository; no docker on PATH, so only the native half."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in [p.name for p in ROOT.glob("*.py")]:
        shutil.copy(ROOT / name, repo)
    shutil.copytree(ROOT / "labs", repo / "labs", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".venv").mkdir()
    env = lab_env(repo / "data", free_port())
    receiver = ReceiverProcess(env, tmp_path / "receiver.log", script=repo / "api.py").start()
    (repo / "data" / "receiver.pid").write_text(f"{receiver.proc.pid}\n")  # as the native up does
    bin_dir = tmp_path / "bin"  # ps, and no docker
    bin_dir.mkdir()
    (bin_dir / "ps").symlink_to(shutil.which("ps"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "labs.tools.backends", "reset"],
            cwd=repo,
            env={**os.environ, "PATH": str(bin_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            f"native: receiver (pid {receiver.proc.pid}) stopped",
            "native: data/ deleted",
        ]
        assert receiver.proc.wait(10) == 0  # it got SIGTERM and exited cleanly
    finally:
        receiver.stop()
    assert not (repo / "data").exists() and (repo / ".venv").is_dir()


def test_make_recipes_for_tools_are_silent_so_stdout_stays_machine_readable():
    """make echoes a recipe line unless it starts with @: on stdout, before the tool's JSON."""
    recipes, target = {}, None
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")  # join continued lines
    for line in text.splitlines():
        if rule := re.match(r"([^\s:#=]+):(?!=)", line):
            target = rule.group(1)
        elif line.startswith("\t") and target:
            recipes.setdefault(target, []).append(line.strip())
    for target in ("$(VENV)/.installed", "demo", "reset", "drill", "chaos"):
        assert recipes[target] and all(r.startswith("@") for r in recipes[target]), target
