"""Workers under Compose: a rolling deploy while operations run, and lab 10's reset while a
`run --rm worker` is still attached. A real engine, in a project of our own (never stateful-lab).

The image is LAB_IMAGE (compose.yaml's default when unset); CI sets BASE_IMAGE and
LAB_POSTGRES_IMAGE for an engine with no registry, as for tests/tools/test_docker.py.
"""

import json
import os
import subprocess
from collections import Counter

import pytest

from tools.backends import compose_command
from tools.local import ROOT, run_command, wait_until
from tools.runner import parse_guide

pytestmark = [pytest.mark.docker, pytest.mark.long]

PROJECT = "-".join(
    [os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test"), "workers"]
    + ([os.environ["PYTEST_XDIST_WORKER"]] if "PYTEST_XDIST_WORKER" in os.environ else [])
)
BUILD_TIMEOUT_S = 900
HANG_GUARD_S = 300  # a wait only a hang reaches, however busy the machine: not a speed bound
OPERATIONS = 24
PAUSE = "/tmp/after-prepare"  # in each worker's own /tmp (a tmpfs): its runs wait there
# The first workers' runs wait inside prepare until the test lets them go on (failpoints.py's
# pause): the SIGTERM of a deploy finds each of them with graphs in flight. Their replacements
# start from the plain file and run freely.
PAUSED = f"""services:
  worker:
    environment:
      FAILPOINTS: "after-prepare=pause({PAUSE})"
"""
PLAIN = """services:
  worker:
    environment:
      FAILPOINTS: ""
"""


@pytest.fixture
def compose(tmp_path):
    overrides = {}
    for name, text in (("paused", PAUSED), ("plain", PLAIN)):
        overrides[name] = tmp_path / f"workers.{name}.yaml"
        overrides[name].write_text(text)

    def lab(*args, files="plain", check=True, timeout=HANG_GUARD_S):
        extra = ["-f", str(ROOT / "compose.yaml"), "-f", str(overrides[files])] if files else []
        done = run_command([*compose_command(), "-p", PROJECT, *extra, *args], timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail(f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    lab("down", "-v", "--remove-orphans", files=None)
    yield lab
    lab("down", "-v", "--remove-orphans", files=None, check=False)
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
    """OPERATIONS `labs/workers.py submit`s in one container, by one Python (worker.main: the same
    code, without an interpreter's start and imports per submit)."""
    script = (
        "import sys\nfrom labs import workers as worker\n"
        f"for i in range({OPERATIONS}):\n"
        "    code = worker.main(['submit', '--thread', f'op-{i}', '--operation', f'op-{i}:open'])\n"
        "    if code:\n"
        "        sys.exit(code)\n"
    )
    lab("run", "--rm", "--entrypoint", "python", "worker", "-c", script)


def statuses(lab):
    return [j["status"] for j in json.loads(lab("run", "--rm", "worker", "status").stdout)["jobs"]]


def in_container(container, *argv):
    return run_command(["docker", "exec", container, *argv], timeout=HANG_GUARD_S)


def deploy_sigterm(container):
    """Once a run of the worker waits at its pause: SIGTERM, then (once it says it drains) let
    its runs go on. (exit code, jobs it drained) once it has exited."""

    def paused():
        return in_container(container, "test", "-e", PAUSE).returncode == 0

    def draining():
        return "draining" in run_command(["docker", "logs", container]).stderr

    wait_until(paused, HANG_GUARD_S, "a run of the worker inside prepare")
    run_command(["docker", "kill", "--signal", "TERM", container])
    wait_until(draining, HANG_GUARD_S, "the worker to say it drains")
    unpause = f"import failpoints; failpoints.unpause({PAUSE!r})"
    assert in_container(container, "python", "-c", unpause).returncode == 0
    code = run_command(["docker", "wait", container], timeout=HANG_GUARD_S).stdout.strip()
    said = run_command(["docker", "logs", container]).stdout.splitlines()
    return code, sum('"event": "job_drained"' in line for line in said)


def test_a_rolling_deploy_under_compose_loses_and_duplicates_nothing(compose):
    """Each worker in turn gets a deploy's SIGTERM while its runs wait inside prepare, then its
    runs go on: each drains at the step boundary after prepare and exits 0, and its jobs are run
    by the others. Sent with `docker kill -s TERM`, which is `docker stop` without its SIGKILL at
    the end of the grace period: how long a drain takes is a figure (make bench-docker), and a
    test that a busy machine could push past the grace period would be a test of the machine."""
    lab = compose
    lab("up", "-d", "--build", "api", "postgres", timeout=BUILD_TIMEOUT_S)
    submit_all(lab)
    lab("up", "-d", "--scale", "worker=3", "worker", files="paused")
    ends = []
    for old in lab("ps", "-q", "worker").stdout.split():  # each worker in turn, as a deploy does
        ends.append(deploy_sigterm(old))
        run_command(["docker", "rm", old])
        lab("up", "-d", "--no-recreate", "--scale", "worker=3", "worker")  # its replacement
    # Each exited 0 with graphs in flight that it drained (job_drained: back to the queue).
    assert [(code, drained >= 1) for code, drained in ends] == [("0", True)] * 3, ends
    waited = lab(
        "run", "--rm", "worker", "wait", "--timeout", str(HANG_GUARD_S), check=False,
        timeout=2 * HANG_GUARD_S,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    assert statuses(lab) == ["done"] * OPERATIONS
    listed = json.loads(lab("run", "--rm", "workflow", "tickets").stdout)["tickets"]
    per_key = Counter(t["key"] for t in listed)
    assert per_key == Counter({f"op-{i}:open": 1 for i in range(OPERATIONS)}), per_key


def test_lab_10_reset_leaves_nothing_while_a_run_rm_worker_is_still_attached(compose):
    """`down -v` alone leaves the one-off container and its network (`Resource is still in
    use`): the worker service is in a profile `down` was not given. The guide's reset holds:
    it stops the run container, which the engine then removes on its own (`run --rm` makes it
    with HostConfig.AutoRemove), possibly just after `down` returned."""
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
        wait_until(lambda: run_command(one_off).stdout.strip(), HANG_GUARD_S, "the run container")
        guide = (ROOT / "labs" / "10-two-workers-one-thread.md").read_text(encoding="utf-8")
        reset = parse_guide(guide)[-1].command.split()
        assert reset[:4] == ["docker", "compose", "-p", "stateful-lab"], reset
        lab(*reset[4:], files=None)
        assert run_command(one_off).stdout.strip() == "", "the reset left the run container up"
        nothing = {"containers": [], "networks": [], "volumes": []}
        wait_until(lambda: leftovers() == nothing, HANG_GUARD_S, "the run container's removal")
    finally:
        waiting.kill()
        waiting.wait()
