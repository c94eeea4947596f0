"""The lab past one machine: LangGraph's checkpoints in Postgres, workers on a job queue.

Every test runs on a real throwaway PostgreSQL cluster (tools.pg, one per test process)
started from the machine's own binaries. Without them the tier is skipped with a loud reason;
with LAB_REQUIRE_POSTGRES=1 (CI) it fails instead.
"""

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import require_postgres

from tools import scale_chaos
from tools.backends import LocalBackend
from tools.local import ROOT, free_port, lab_env, run_command, run_workflow
from tools.runner import run_guide

LAB_10 = ROOT / "labs" / "10-two-workers-one-thread.md"
HANG_GUARD_S = 300  # a wait only a hang reaches, however busy the machine: not a speed bound


def outcomes_problems(outcomes):
    return [
        f"$ {o.step.command}\n  {o.problems}\n  got: {o.stdout!r} exit {o.exit_code}"
        for o in outcomes
        if not o.ok
    ]


@pytest.mark.parametrize(
    "guide", ["01-the-duplicate.md", "02-the-keyed-fix.md"], ids=lambda g: g[:2]
)
def test_guides_print_the_same_with_a_postgres_checkpointer(guide, database, tmp_path):
    backend = LocalBackend(tmp_path / "data", log_path=tmp_path / "receiver.log", in_process=True)
    backend.env["CHECKPOINT_DB"] = database
    try:
        outcomes = run_guide(ROOT / "labs" / guide, backend)
    finally:
        backend.close()
    assert outcomes and not outcomes_problems(outcomes), "\n".join(outcomes_problems(outcomes))


def test_a_postgres_url_that_does_not_answer_is_one_line_and_exit_3(tmp_path):
    env = lab_env(tmp_path, free_port(), CHECKPOINT_DB=f"postgresql://x@127.0.0.1:{free_port()}/x")
    done = run_workflow(["state", "--thread", "demo"], env)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("labs: cannot open CHECKPOINT_DB (")
    assert "unset it for the SQLite default" in done.stderr  # lab 10's export lingers
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_malformed_postgres_url_is_a_usage_error(tmp_path):
    env = lab_env(tmp_path, free_port(), CHECKPOINT_DB="postgresql://[not-a-host")
    done = run_workflow(["state", "--thread", "demo"], env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def run_worker(env, *args):
    """python -m labs.workers ARGS, to its end (tools.local.run_command: output captured, no
    stdin)."""
    return run_command([sys.executable, "-m", "labs.workers", *args], env, timeout=HANG_GUARD_S)


def test_workers_refuse_a_sqlite_checkpointer(tmp_path):
    done = run_worker(lab_env(tmp_path, free_port()), "status")  # CHECKPOINT_DB: a SQLite path
    assert done.returncode == 2, done.stderr
    assert "CHECKPOINT_DB must be a postgresql:// URL" in done.stderr
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "url,code,says",
    [
        ("postgresql://x@127.0.0.1:{port}/x", 3, "labs.workers: cannot open CHECKPOINT_DB ("),
        ("postgresql://[not-a-host", 2, "labs.workers: CHECKPOINT_DB is not a usable URL ("),
    ],
    ids=["nobody-answers", "malformed"],
)
def test_a_worker_with_a_bad_queue_url_says_so_in_one_line(url, code, says, tmp_path):
    url = url.format(port=free_port())  # WORKER_DB_WAIT_S: give up on a refusal after 1 s
    done = run_worker(
        lab_env(tmp_path, free_port(), CHECKPOINT_DB=url, WORKER_DB_WAIT_S="1"), "status"
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith(says) and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.long
def test_scale_chaos_kills_and_freezes_and_the_key_prevents_duplicates(postgres, tmp_path):
    result = scale_chaos.chaos_run(
        workers_n=2, operations=4, mode="safe", seed=7, work_dir=tmp_path, ack_delay_s=2.0,
        faults=("kill", "freeze"), grace_s=HANG_GUARD_S, deadline_s=HANG_GUARD_S,
    )  # fmt: skip
    assert result["operations"] == 4
    assert result["unfinished"] == 0, result
    assert result["faults"]["kill"] >= 2, result  # the first strike: both workers in the window
    assert result["duplicates"] == 0 and result["tickets"] == 4, result


@pytest.mark.long
def test_scale_chaos_with_every_fault_kind_30_operations_3_workers(tmp_path):
    """Each fault strikes, nothing is duplicated or left unfinished, and a rolling deploy's
    workers all drain and exit 0. Every fault strikes once even if the queue drains first (the
    strike loop's first round), so the operations' count sets only how many random strikes
    follow: 30 gives several (make scale-chaos's default is 60). The grace period and the
    deadline are hang guards here: how long a run and its drains take is scale chaos's own
    figure (`done in N s`; a drain past compose's grace period shows as "past grace: SIGKILL"
    in deploy_exits), not a verdict."""
    require_postgres()
    result = scale_chaos.chaos_run(
        workers_n=3, operations=30, mode="safe", seed=11, work_dir=tmp_path, ack_delay_s=0.5,
        grace_s=HANG_GUARD_S, deadline_s=HANG_GUARD_S,
    )  # fmt: skip
    assert all(result["faults"][fault] >= 1 for fault in scale_chaos.FAULTS), result
    assert result["duplicates"] == 0 and result["unfinished"] == 0, result
    assert result["tickets"] == 30, result
    assert set(result["deploy_exits"]) == {"exit 0"}, result


@pytest.mark.long
def test_scale_chaos_in_naive_mode_prints_its_duplicates_as_the_finding_and_exits_0(
    postgres, capsys
):
    """The first strike kills every worker after the receiver's answer: naive runs repeat it.
    The window is held by the after-ack pause, not by time: with no sleep after the answer
    (--ack-delay 0) the first strike still lands in it, however loaded the machine."""
    exit_code = scale_chaos.main(
        ["--workers", "2", "--operations", "4", "--mode", "naive", "--faults", "kill,freeze",
         "--seed", "7", "--ack-delay", "0"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert out.strip(), f"scale chaos printed no result (exit {exit_code}): {err}"
    result = json.loads(out.splitlines()[-1])
    assert exit_code == 0, err
    assert result["duplicates"] >= 1 and result["unfinished"] == 0, result
    assert f"scale-chaos: finding: {result['duplicates']} duplicate ticket(s)" in err


def test_a_dead_job_stays_in_status_keeps_drain_from_waiting_and_makes_wait_exit_5(
    database, tmp_path
):
    """A job that fails for a reason no retry fixes, or has no attempts left, is held (dead) for
    the operator to see; `run --drain` does not wait for it; `wait` exits 5 and names it."""
    env = lab_env(
        tmp_path, free_port(), CHECKPOINT_DB=database, API_ATTEMPTS="1", WORKER_JOB_ATTEMPTS="1"
    )  # no receiver

    def worker(*args):
        return run_worker(env, *args)

    assert worker("submit", "--thread", "t", "--operation", "t:op").returncode == 0
    drained = worker("run", "--drain")
    assert drained.returncode == 0, drained.stderr
    assert "job_dead" in [json.loads(line)["event"] for line in drained.stdout.splitlines()]
    status = json.loads(worker("status").stdout)
    assert [(j["thread"], j["status"]) for j in status["jobs"]] == [("t", "dead")]
    waited = worker("wait", "--timeout", "5")
    assert waited.returncode == 5, waited.stderr
    assert "t:op" in waited.stderr and waited.stdout == ""


def test_the_pg_tool_stops_and_deletes_its_cluster_on_kill():
    """`python -m tools.pg &` in a shell gets no Ctrl-C; `kill` (SIGTERM) must clean up."""
    require_postgres()
    import psycopg

    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.pg"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        url = proc.stdout.readline().strip()
        port = url.rsplit(":", 1)[-1].split("/")[0]
        [folder] = [  # ours, among any cluster another test has running: pg_ctl's record of it
            f
            for f in Path(tempfile.gettempdir()).glob("stateful-lab-pg-*")
            if f'"port={port}"' in _read(f / "data" / "postmaster.opts")
        ]
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:  # a failed check above: SIGTERM still cleans up, SIGKILL would not
            proc.terminate()
            proc.wait(timeout=30)
    assert not folder.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5).close()


def _read(path):
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_second_ctrl_c_stops_a_worker_whose_job_does_not_finish(database, lab, receiver):
    """The first Ctrl-C drains the running graph at its next step; a job held in lab 10's hold
    reaches no step, so the second Ctrl-C stops the worker at once and says what becomes of it."""
    env = dict(lab, CHECKPOINT_DB=database, WORKER_HEARTBEAT_S="1")

    def worker(*args):
        return run_worker(env, *args)

    hold = ["--thread", "h", "--operation", "h:op", "--lab-hold", "after-ack"]
    assert worker("submit", *hold).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "labs.workers", "run"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker("wait", "--for", "hold", "--thread", "h").returncode == 0
        proc.send_signal(signal.SIGINT)
        first = proc.stderr.readline()
        assert first.startswith("labs.workers: draining 1 running job(s)"), first
        assert proc.poll() is None  # still waiting for its job
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        last = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert last.startswith("labs.workers: stopped with 1 job(s) running"), last
    assert "Traceback" not in first + last
    # The lab run again without `down -v`: the stopped worker's hold row must not answer for the
    # next submit's hold. Another worker finishes the thread first (its heartbeat is 1 s here).
    assert worker("run", "--drain").returncode == 0
    assert worker("submit", *hold).returncode == 0  # a finished thread: nothing will hold
    assert worker("wait", "--for", "hold", "--thread", "h", "--timeout", "1").returncode == 3


def test_pgqueuer_install_is_not_idempotent_and_upgrade_and_open_queue_are(postgres, database):
    """README's setup sentence: pgqueuer 1.6's Queries.install() fails on a second run, its
    Queries.upgrade() creates the schema in an empty database and runs again without error, and
    labs/workers.py's open_queue() (install only where nothing is installed) opens the queue
    twice."""
    import asyncio

    import asyncpg
    import psycopg
    from pgqueuer import Queries

    from labs import worker_queue

    empty = database + "_upgrade"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{empty.rsplit("/", 1)[1]}"')
        conn.execute(f'CREATE DATABASE "{empty.rsplit("/", 1)[1]}"')

    async def check():
        installed = Queries.from_asyncpg_connection(await asyncpg.connect(database))
        await installed.install()
        with pytest.raises(asyncpg.exceptions.DuplicateObjectError):
            await installed.install()
        upgraded = Queries.from_asyncpg_connection(await asyncpg.connect(empty))
        assert not await upgraded.schema_is_installed()
        await upgraded.upgrade()
        assert await upgraded.schema_is_installed()
        await upgraded.upgrade()  # a second run: nothing to do, no error
        opened = [await worker_queue.open_queue(database) for _ in range(2)]  # install()ed already
        opened += [await worker_queue.open_queue(empty) for _ in range(2)]  # upgrade()d already
        assert all([await queries.schema_is_installed() for queries in opened])
        for queries in (installed, upgraded, *opened):
            await queries.driver._connection.close()  # asyncpg's; Queries has no close()

    asyncio.run(check())
