"""Shared fixtures: a real receiver process on a free loopback port, data in tmp_path."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labs.tools.local import ReceiverProcess, free_port, lab_env, run_workflow  # noqa: E402
from labs.tools.pg import PostgresUnavailable, find_bin_dir  # noqa: E402


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


@pytest.fixture
def lab(tmp_path):
    """The environment for one lab: its data folders under tmp_path and a free port."""
    return lab_env(tmp_path / "data", free_port())


@pytest.fixture
def receiver(lab, tmp_path):
    """A running api.py (stopped with SIGTERM after the test). Its stderr goes to receiver.log."""
    server = ReceiverProcess(lab, log_path=tmp_path / "receiver.log").start()
    yield server
    server.stop()


@pytest.fixture
def workflow(lab):
    """Run `python workflow.py ARGS` against this test's receiver and checkpoint folder."""

    def run(*args):
        return run_workflow(args, lab)

    return run
