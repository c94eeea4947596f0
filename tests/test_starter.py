"""`make starter`: the lab's files less every lab-only line, and a starter that works as written."""

import os
import subprocess
import sys

import pytest

from labs.tools import starter
from labs.tools.backends import compose_command, docker_engine_answers
from labs.tools.local import ROOT
from labs.tools.local import run as run_command

LAB_ONLY_WORDS = (  # what a copier must not find in the starter's code
    "lab-only",
    "--crash",
    "crash_at",
    "crash(",
    "CRASH_POINTS",
    "naive",
    "node-uuid",
    "uuid",
    "Lab-Lost-Ack",
    "LOST_ACK",
    "RECEIVER_LAB_FAULTS",
    "--durability",
    "args.durability",
    "stateful-lab",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("starter") / "ticket-starter"
    done = subprocess.run(
        [sys.executable, "-m", "labs.tools.starter", str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dest


def test_the_starter_has_the_promised_files(built):
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted([*starter.FENCED, *starter.COPIED, "README.md", "test_smoke.py"]), names


@pytest.mark.parametrize("name", starter.FENCED)
def test_the_starter_code_has_no_lab_only_part(built, name):
    text = (built / name).read_text(encoding="utf-8")
    found = [word for word in LAB_ONLY_WORDS if word in text]
    assert not found, f"{name} still mentions {found}"


def test_the_starter_still_explains_the_crash_window(built):
    assert "crash window" in (built / "workflow.py").read_text(encoding="utf-8")
    assert "crash window" in (built / "api.py").read_text(encoding="utf-8")


def test_the_starter_is_ruff_clean_with_the_labs_settings(built):
    config = str(ROOT / "pyproject.toml")
    for command in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--config", config, "."],
            cwd=built,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_starters_own_smoke_test_passes(built):
    """Receiver up, a run to `done`, the same operation again gets created: false."""
    done = subprocess.run(
        [sys.executable, "-m", "unittest", "-v", "test_smoke.py"],
        cwd=built,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "Ran 1 test" in done.stderr and "OK" in done.stderr


def test_strip_drops_marked_lines_and_blocks_and_keeps_the_rest():
    text = "a\nb  # lab-only\n# lab-only: begin\nc\n  # lab-only: end\nd\n"
    assert starter.strip_lab_only(text) == "a\nd\n"


@pytest.mark.parametrize("text", ["# lab-only: begin\nx\n", "x\n# lab-only: end\n"])
def test_an_unbalanced_fence_is_an_error_not_a_silent_drop(text):
    with pytest.raises(ValueError):
        starter.strip_lab_only(text)


def test_a_dest_that_is_not_empty_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me", encoding="utf-8")
    assert starter.main([str(tmp_path)]) == starter.EXIT_DEST_NOT_EMPTY
    assert "not an empty folder" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


@pytest.mark.docker
def test_the_starters_two_docker_commands_work(built):
    if not docker_engine_answers():
        if os.environ.get("LAB_REQUIRE_DOCKER") == "1":
            pytest.fail("DOCKER TIER REQUIRED (LAB_REQUIRE_DOCKER=1): no engine answers")
        pytest.skip("DOCKER TIER SKIPPED: no Docker engine with Compose answers")
    compose = [*compose_command(), "-p", "stateful-lab-starter-test"]
    env = dict(os.environ, LAB_IMAGE="stateful-agent-lab:starter-test")

    def run(*args, timeout=120):
        return run_command([*compose, *args], env, timeout, cwd=built)

    try:
        up = run("up", "-d", "--build", "api", timeout=900)
        assert up.returncode == 0, up.stderr[-2000:]
        first = run("run", "--rm", "workflow", "start", "--thread", "t1", "--operation", "o-1")
        assert first.returncode == 0, first.stderr[-2000:]
        assert '"event": "done"' in first.stdout
        again = run("run", "--rm", "workflow", "start", "--thread", "t2", "--operation", "o-1")
        assert again.returncode == 0, again.stderr[-2000:]
        assert '"created": false' in again.stdout
    finally:
        run("down", "-v")
