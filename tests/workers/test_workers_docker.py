"""Workers under Compose: a rolling deploy while operations run, and lab 10's reset while a
`run --rm worker` is still attached. A real engine, in a project of our own (never stateful-lab).

The image is LAB_IMAGE (compose.yaml's default when unset); CI sets BASE_IMAGE and
LAB_POSTGRES_IMAGE for an engine with no registry, as for tests/tools/test_docker.py.
"""

import json
import os
import subprocess
import time
from collections import Counter

import pytest

from labs.tools.backends import compose_command
from labs.tools.local import ROOT, wait_until
from labs.tools.local import run as run_command
from labs.tools.runner import parse_guide

pytestmark = [pytest.mark.docker, pytest.mark.long]

PROJECT = "-".join(
    [os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test"), "workers"]
    + ([os.environ["PYTEST_XDIST_WORKER"]] if "PYTEST_XDIST_WORKER" in os.environ else [])
)
BUILD_TIMEOUT_S = 900
GRACE_S = 30  # compose.yaml's stop_grace_period for the worker
OPERATIONS = 24
# Each run pauses after prepare and after the receiver's answer: a SIGTERM finds graphs in flight.
OVERRIDE = """services:
  worker:
    environment:
      FAILPOINTS: "after-prepare=sleep(0.5);after-ack=sleep(0.5)"
"""


@pytest.fixture
def compose(tmp_path):
    override = tmp_path / "workers.override.yaml"
    override.write_text(OVERRIDE)

    def lab(*args, files=True, check=True, timeout=120):
        extra = ["-f", str(ROOT / "compose.yaml"), "-f", str(override)] if files else []
        done = run_command([*compose_command(), "-p", PROJECT, *extra, *args], timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail(f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    lab("down", "-v", "--remove-orphans", files=False)
    yield lab
    lab("down", "-v", "--remove-orphans", files=False, check=False)
    assert leftovers() == {"containers": [], "networks": [], "volumes": []}


def leftovers():
    label = f"label=com.docker.compose.project={PROJECT}"
    found = {}
    for kind, argv in (
        ("containers", ["docker", "ps", "-aq"]),
        ("networks", ["docker", "network", "ls", "-q"]),
        ("volumes", ["docker", "volume", "ls", "-q"]),
    ):
        found[kind] = run_command([*argv, "--filter", label], timeout=60).stdout.split()
    return found


def submit_all(lab):
    script = (
        f"for i in $(seq 0 {OPERATIONS - 1}); do "
        "python worker.py submit --thread op-$i --operation op-$i:open >/dev/null || exit 1; done"
    )
    lab("run", "--rm", "--entrypoint", "sh", "worker", "-c", script, timeout=300)


def statuses(lab):
    return [j["status"] for j in json.loads(lab("run", "--rm", "worker", "status").stdout)["jobs"]]


def test_a_rolling_deploy_under_compose_loses_and_duplicates_nothing(compose):
    lab = compose
    lab("up", "-d", "--build", "api", "postgres", timeout=BUILD_TIMEOUT_S)
    submit_all(lab)
    lab("up", "-d", "--scale", "worker=3", "worker")
    wait_until(lambda: statuses(lab).count("done") >= 3, 120, "3 operations done")
    exits = []
    for old in lab("ps", "-q", "worker").stdout.split():  # each worker in turn, as a deploy does
        started = time.monotonic()
        run_command(["docker", "stop", "--time", str(GRACE_S), old], timeout=GRACE_S + 30)
        state = json.loads(run_command(["docker", "inspect", old]).stdout)[0]["State"]
        exits.append((state["ExitCode"], time.monotonic() - started < GRACE_S))
        run_command(["docker", "rm", old])
        lab("up", "-d", "--no-recreate", "--scale", "worker=3", "worker")  # its replacement
    assert exits == [(0, True)] * 3, exits  # each drained and gone within its grace period
    waited = lab("run", "--rm", "worker", "wait", "--timeout", "180", check=False, timeout=240)
    assert waited.returncode == 0, waited.stderr
    assert statuses(lab) == ["done"] * OPERATIONS
    listed = json.loads(lab("run", "--rm", "workflow", "tickets").stdout)["tickets"]
    per_key = Counter(t["key"] for t in listed)
    assert per_key == Counter({f"op-{i}:open": 1 for i in range(OPERATIONS)}), per_key


def test_lab_10_reset_leaves_nothing_while_a_run_rm_worker_is_still_attached(compose):
    """`down -v` alone leaves the one-off container and its network (`Resource is still in
    use`): the worker service is in a profile `down` was not given. The guide's reset holds."""
    lab = compose
    lab("up", "-d", "--build", "api", "postgres", timeout=BUILD_TIMEOUT_S)
    lab("run", "--rm", "worker", "submit", "--thread", "a", "--operation", "a:op")
    waiting = subprocess.Popen(  # queued and no worker: it waits, attached, in its container
        [*compose_command(), "-p", PROJECT, "run", "--rm", "worker", "wait", "--timeout", "120"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        one_off = [
            "docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
            "--filter", "label=com.docker.compose.oneoff=True",
        ]  # fmt: skip
        wait_until(lambda: run_command(one_off).stdout.strip(), 60, "the run container up")
        guide = (ROOT / "labs" / "10-two-workers-one-thread.md").read_text(encoding="utf-8")
        reset = parse_guide(guide)[-1].command.split()
        assert reset[:4] == ["docker", "compose", "-p", "stateful-lab"], reset
        lab(*reset[4:], files=False)
        assert leftovers() == {"containers": [], "networks": [], "volumes": []}
    finally:
        waiting.kill()
        waiting.wait()
