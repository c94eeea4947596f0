"""Shared fixtures: a real receiver process on a free loopback port, data in tmp_path."""

import functools
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.local import ReceiverProcess, free_port, lab_env, run_workflow_here  # noqa: E402
from tools.pg import PostgresUnavailable, TempPostgres, find_bin_dir  # noqa: E402

# The Ctrl-C tests send SIGINT to a child process. A shell that starts the suite in the
# background (`make test &`) ignores SIGINT, and an ignored signal stays ignored across exec, so
# the child would never see it; a handler is reset to the default on exec, so this process
# (each pytest-xdist worker imports this file) installs Python's own.
signal.signal(signal.SIGINT, signal.default_int_handler)


LONG_S = 20.0  # a test marked long that tests/durations.txt does not list: "20 s or more"
DURATIONS = Path(__file__).with_name("durations.txt")


def measured_durations():
    """{test id: seconds} from tests/durations.txt (the `call` lines of a --durations report)."""
    found = {}
    lines = DURATIONS.read_text(encoding="utf-8").splitlines() if DURATIONS.exists() else []
    for line in lines:
        words = line.split(maxsplit=2)
        if len(words) == 3 and words[1] == "call" and words[0].endswith("s"):
            found[words[2]] = float(words[0][:-1])
    return found


def pytest_collection_modifyitems(items):
    """The longest tests go first, longest first: pytest-xdist hands tests out in this order (its
    first batch round-robin), and a long test that starts last keeps the whole run waiting for it
    alone. Measured ones by tests/durations.txt, then those marked long. (sort is stable: the rest
    keep their order)"""
    measured = measured_durations()

    def seconds(item):
        return measured.get(item.nodeid) or (LONG_S if item.get_closest_marker("long") else 0.0)

    items.sort(key=seconds, reverse=True)


def pytest_runtest_setup(item):
    """Every test marked docker checks the tier first, from here: skipped, the tier says why in
    one summary line (pytest -ra groups skips by where they were raised)."""
    if item.get_closest_marker("docker"):
        require_docker()


def examples(n):
    """A property test's number of examples: n, scaled by LAB_PROPERTY_SCALE (default 1; make
    test-fast's inner loop sets 0.25, make test runs each property at its full size)."""
    return max(2, round(n * float(os.environ.get("LAB_PROPERTY_SCALE", "1"))))


def require_docker(compose_v2=False):
    """The Docker tier: skip loudly without an engine that answers and Compose (v2 when asked),
    or fail when LAB_REQUIRE_DOCKER=1 (CI)."""
    reason = docker_tier_missing(compose_v2)
    if reason and os.environ.get("LAB_REQUIRE_DOCKER") == "1":
        pytest.fail(reason.replace("SKIPPED", "REQUIRED (LAB_REQUIRE_DOCKER=1)"), pytrace=False)
    if reason:
        pytest.skip(reason)


@functools.cache
def docker_tier_missing(compose_v2):
    """Why the Docker tier cannot run here, or "" (asked once per process: `docker info`)."""
    from tools.backends import compose_command, docker_engine_answers

    compose = compose_command()
    if docker_engine_answers() and compose and (compose[0] == "docker" or not compose_v2):
        return ""
    return (
        f"DOCKER TIER SKIPPED: no Docker engine with {'Compose v2' if compose_v2 else 'Compose'} "
        "answers on this machine (install Docker Engine or Desktop with Compose v2)"
    )


def require_postgres():
    """The Postgres tier: skip loudly without PostgreSQL's server binaries, or fail when
    LAB_REQUIRE_POSTGRES=1 (CI)."""
    try:
        find_bin_dir()
    except PostgresUnavailable as error:
        reason = f"POSTGRES TIER SKIPPED: {error}"
        if os.environ.get("LAB_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason.replace("SKIPPED", "REQUIRED (LAB_REQUIRE_POSTGRES=1)"))
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres():
    """One throwaway cluster for this test process (each pytest-xdist worker has its own),
    started when a test first asks for it: each test takes a database of its own in it
    (`database`). A test that halts it (a crash of Postgres) starts it again before it ends,
    so the next test finds it running; a test that must stop it for good takes a TempPostgres
    of its own. (One initdb per process instead of one per module or test: about 2 s each.)"""
    require_postgres()
    with TempPostgres() as cluster:
        yield cluster


@pytest.fixture
def database(postgres, request):
    """A new, empty database in the process's cluster for this test: its URL."""
    import re

    import psycopg

    name = "t_" + re.sub(r"\W", "_", request.node.name).lower()[:50] + f"_{os.getpid()}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def lab(tmp_path):
    """The environment for one lab: its data folders under tmp_path and a free port."""
    return lab_env(tmp_path / "data", free_port())


@pytest.fixture
def receiver(lab, tmp_path):
    """A running labs/receiver.py (stopped with SIGTERM after the test). Its stderr goes to
    receiver.log."""
    server = ReceiverProcess(lab, log_path=tmp_path / "receiver.log").start()
    yield server
    server.stop()


@pytest.fixture
def workflow(lab):
    """`workflow.py ARGS` against this test's receiver and checkpoint folder: a process that really
    dies when ARGS has a crash or SIGTERM switch (a fork of this one, LangGraph already imported),
    else workflow.main in this process (the same code without a new interpreter's second of
    LangGraph import)."""

    def run(*args):
        return run_workflow_here(args, lab)

    return run
