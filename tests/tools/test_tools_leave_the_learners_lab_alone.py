"""The demo, the drill and the chaos run never touch a learner's lab.

A copy of the repository holds a learner's half-done lab 01 in data/ (a crashed naive run:
ticket 1 on the receiver, a checkpoint waiting at create_ticket), served by a receiver the
learner started, whose PORT and API_URL are exported in the learner's shell. Each tool then
runs from that copy, as `make` runs it, and afterwards the learner's receiver, its tickets
and the checkpoint file are exactly as they were. (A copy, so the real data/ is never used.)
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tools import drill
from tools.local import ROOT, ReceiverProcess, free_port, lab_env, run_workflow, wait_until

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


def copy_folders(repo):
    """The lessons, the tools and the drill, as a clone has them beside the core's files."""
    for name in ("labs", "tools", "effectdrill"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    repo = tmp_path_factory.mktemp("learner-repo")
    for path in [*ROOT.glob("*.py"), ROOT / "compose.yaml"]:
        shutil.copy(path, repo)
    copy_folders(repo)
    env = lab_env(repo / "data", free_port())  # data/receiver, data/workflow: the native layout
    receiver = ReceiverProcess(
        env, repo / "learner-receiver.log", script="labs.receiver", cwd=repo
    ).start()
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
    done = run_tool(learner, "tools.demo", "--backend", "local", "labs/01-the-duplicate.md")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "case-naive:open-ticket:v1: 2 tickets for one operation (duplicate)" in done.stdout


def test_the_drill_leaves_the_learners_lab_alone_and_keeps_stdout_for_json(learner):
    """One boundary's rows as `make drill` runs them (tests/tools/test_drill.py runs every cell)."""
    done = run_tool(learner, "tools.drill", "--json", "--boundary", "after-checkpoint")
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
    done = run_tool(learner, "tools.chaos", "--runs", "2", "--seed", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["tickets"] == 2


def reset_copy(tmp_path):
    """A copy of the repository with a .venv folder, and a PATH with ps and no docker, so
    `python -m tools.reset` (make reset) does only its native half."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in [p.name for p in ROOT.glob("*.py")]:
        shutil.copy(ROOT / name, repo)
    copy_folders(repo)
    (repo / ".venv").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ps").symlink_to(shutil.which("ps"))
    return repo, {**os.environ, "PATH": str(bin_dir)}


def make_reset(repo, env):
    done = subprocess.run(
        [sys.executable, "-m", "tools.reset"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_reset_stops_the_native_receiver_and_deletes_data_but_not_the_venv(tmp_path):
    """`make reset` in a copy of the repository; no docker on PATH, so only the native half."""
    repo, env = reset_copy(tmp_path)
    receiver_env = lab_env(repo / "data", free_port())
    receiver = ReceiverProcess(
        receiver_env, tmp_path / "receiver.log", script="labs.receiver", cwd=repo
    )
    receiver.start()
    (repo / "data" / "receiver.pid").write_text(f"{receiver.proc.pid}\n")  # as the native up does
    try:
        assert make_reset(repo, env) == [
            f"native: receiver (pid {receiver.proc.pid}) stopped",
            "native: data/ deleted",
        ]
        assert receiver.proc.wait(10) == 0  # it got SIGTERM and exited cleanly
    finally:
        receiver.stop()
    assert not (repo / "data").exists() and (repo / ".venv").is_dir()


def test_make_reset_started_by_the_readme_stops_the_receiver_the_readme_started(tmp_path):
    """The README's native `up` line, typed in a shell (python -m labs.receiver, its own pid
    file): a later `make reset`, from another shell, finds that receiver and stops it."""
    repo, env = reset_copy(tmp_path)
    up = [line for line in README_NATIVE.splitlines() if line.startswith("python -m labs.receiver")]
    receiver_env = {**lab_env(repo / "data", free_port()), "PATH": os.environ["PATH"]}
    receiver_env["PATH"] = f"{Path(sys.executable).parent}:{receiver_env['PATH']}"
    shell = f"mkdir -p data; {up[0].split(' #')[0]}"  # the receiver's stdout: not our pipe
    started = subprocess.run(
        ["bash", "-c", shell], cwd=repo, env=receiver_env, stdout=subprocess.DEVNULL, timeout=30
    )
    assert started.returncode == 0
    pid = int((repo / "data" / "receiver.pid").read_text())
    try:
        wait_until(lambda: receiver_answers(receiver_env["API_URL"]), 10, "the receiver answering")
        assert make_reset(repo, env) == [
            f"native: receiver (pid {pid}) stopped",
            "native: data/ deleted",
        ]
        with pytest.raises(OSError):
            urllib.request.urlopen(receiver_env["API_URL"] + "/health", timeout=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("stranger", ["a sleeping python", "another folder's labs/receiver.py"])
def test_make_reset_leaves_a_stranger_with_the_pid_alone(tmp_path, stranger):
    """A pid file that names a process that is not this lab's receiver (a pid reused after a
    reboot, another copy of the lab): make reset says so, signals nothing, deletes data/."""
    repo, env = reset_copy(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    for module in ROOT.glob("*.py"):  # the core labs/receiver.py imports
        shutil.copy(module, other)
    copy_folders(other)
    argv = {
        "a sleeping python": [sys.executable, "-c", "import time; time.sleep(120)"],
        "another folder's labs/receiver.py": [sys.executable, "-m", "labs.receiver"],
    }[stranger]
    proc = subprocess.Popen(
        argv, cwd=other, env=lab_env(other / "data", free_port()), stderr=subprocess.DEVNULL
    )
    try:
        (repo / "data").mkdir()
        (repo / "data" / "receiver.pid").write_text(f"{proc.pid}\n")
        assert make_reset(repo, env) == [
            f"native: data/receiver.pid names pid {proc.pid}, not this lab's receiver: left alone",
            "native: data/ deleted",
        ]
        assert proc.poll() is None  # still running: no signal reached it
    finally:
        proc.kill()
        proc.wait()
    assert not (repo / "data").exists()


def test_make_reset_stops_the_live_receiver_a_failed_second_up_hid(tmp_path):
    """A receiver started twice (lab 19 without lab 18's reset): the second could not listen
    and exited, and its pid is the one the file keeps. make reset says that pid is not running,
    and still stops the first, which serves data/, before it deletes data/; a receiver of the
    same folder serving another folder's data is left alone."""
    repo, env = reset_copy(tmp_path)
    first_env = lab_env(repo / "data", free_port())
    first = ReceiverProcess(
        first_env, tmp_path / "first.log", script="labs.receiver", cwd=repo
    ).start()
    elsewhere = (
        ReceiverProcess(  # a test's receiver: this folder's labs/receiver.py, its data in tmp
            lab_env(tmp_path / "elsewhere", free_port()), script="labs.receiver", cwd=repo
        ).start()
    )
    second = subprocess.Popen(
        [sys.executable, "-m", "labs.receiver"], env=first_env, cwd=repo, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    _, err = second.communicate(timeout=60)  # exited and reaped: its pid names no process
    assert second.returncode == 3 and "Address already in use" in err
    (repo / "data" / "receiver.pid").write_text(f"{second.pid}\n")  # as `echo $!` left it
    try:
        assert make_reset(repo, env) == [
            f"native: data/receiver.pid names pid {second.pid}, which is not running: "
            "nothing to stop",
            f"native: receiver (pid {first.proc.pid}) stopped: it served data/ (not in "
            "data/receiver.pid)",
            "native: data/ deleted",
        ]
        assert first.proc.wait(10) == 0 and elsewhere.running
    finally:
        first.stop()
        elsewhere.stop()


def receiver_answers(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=1):
            return True
    except OSError:
        return False


README_NATIVE = (ROOT / "docs" / "native.md").read_text(encoding="utf-8")  # the native block


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
