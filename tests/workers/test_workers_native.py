"""Lab 10 natively: the guide's native lines start, signal and stop the workers they started, by
pid, and nothing else; the reset stops them and the Postgres tool.

The lines run in bash, as a learner pastes them, in a folder of our own (never the repo's data/):
the lab's files are linked into it.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import require_postgres

from tools import native_workers
from tools.backends import LocalBackend
from tools.local import ROOT, wait_until

GUIDE = "docker compose -p stateful-lab "
LAB_FILES = (*(path.name for path in ROOT.glob("*.py")), "labs", "tools")  # what the lines run


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def pids(folder):
    return [int(f.read_text()) for f in native_workers.pid_files(folder / "data")]


def test_native_lab_10_lines_touch_only_their_own_workers_and_reset_stops_them(tmp_path):
    require_postgres()
    for name in LAB_FILES:
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "data").mkdir()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    backend = LocalBackend(tmp_path / "unused")

    def shell(guide_command):
        return bash(backend.native(GUIDE + guide_command))

    def bash(line):
        # Output to a file, not a pipe: the background pg tool keeps its stderr open for good.
        with open(tmp_path / "shell.log", "a+") as log:
            done = subprocess.run(
                ["bash", "-c", line], cwd=tmp_path, env=env, stdout=log, stderr=log, timeout=90
            )
            log.seek(0)
            assert done.returncode == 0, f"{line}\n{log.read()}"

    # Someone else's worker on the same machine: a command line a broad pkill would match.
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "labs.workers", "run"],
        start_new_session=True,
    )
    pg_started = False
    try:
        shell("up -d postgres")  # backgrounds the pg tool; its URL lands in data/pg.url
        pg_started = True
        url = (tmp_path / "data" / "pg.url").read_text().strip()
        env["CHECKPOINT_DB"] = url
        shell("up -d --scale worker=2 worker")
        first = pids(tmp_path)
        assert len(first) == 2 and all(map(alive, first))
        shell("kill -s SIGKILL worker")
        wait_until(lambda: not any(map(alive, first)), 10, "both workers gone")
        assert alive(decoy.pid)
        shell("up -d --scale worker=2 worker")  # dead ones started again
        second = pids(tmp_path)
        assert len(second) == 2 and not set(second) & set(first) and all(map(alive, second))
        pg_pid = int((tmp_path / "data" / "pg.pid").read_text())
        bash("python -m tools.native_workers stop")  # down -v and make reset: workers, then pg
        assert not any(map(alive, second)) and not alive(pg_pid)
        pg_started = False
        assert alive(decoy.pid)
        assert not native_workers.pid_files(tmp_path / "data")
    finally:
        if pg_started:
            native_workers.stop_workers(tmp_path / "data")
        decoy.send_signal(signal.SIGKILL)
        decoy.wait()
