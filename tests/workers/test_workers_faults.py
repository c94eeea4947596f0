"""Workers against the faults of their own dependencies: Postgres restarting, the receiver down for
a while or for good, nobody to run the jobs, and a deploy's SIGTERM.

Everything is real: a throwaway Postgres cluster (labs.tools.pg) halted with `pg_ctl -m immediate`
and started again on the same port, a receiver process killed and started again, and
`python worker.py run` processes.
"""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from conftest import require_postgres

from labs.tools.local import ROOT, ReceiverProcess, free_port, lab_env, run, wait_until
from labs.tools.pg import TempPostgres

OPERATIONS = 24
RECOVERY_S = 60  # the bound: everything done within this long after the fault ends


@pytest.fixture
def cluster():
    require_postgres()
    with TempPostgres() as pg:
        yield pg


@pytest.fixture
def env(cluster, tmp_path):
    # The pause after each answer keeps every worker inside a run when a fault strikes.
    return lab_env(
        tmp_path / "data",
        free_port(),
        CHECKPOINT_DB=cluster.url,
        WORKER_HEARTBEAT_S="2",
        FAILPOINTS="after-ack=sleep(0.2)",
    )


def start_receiver(env, tmp_path):
    """api.py with the workers' environment, less their FAILPOINTS (the receiver has its own)."""
    env = {k: v for k, v in env.items() if k != "FAILPOINTS"}
    return ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()


@pytest.fixture
def receiver(env, tmp_path):
    proc = start_receiver(env, tmp_path)
    yield proc
    proc.stop()


class Workers:
    """worker.py run processes, each logging to its own files."""

    def __init__(self, env, folder):
        self.env, self.folder, self.procs = env, folder, []

    def start(self, n):
        for _ in range(n):
            index = len(self.procs)
            out = open(self.folder / f"worker{index}.out", "wb")
            err = open(self.folder / f"worker{index}.err", "wb")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(ROOT / "worker.py"), "run"],
                    env=self.env,
                    cwd=ROOT,
                    stdout=out,
                    stderr=err,
                )
            )
        return self

    def stderr(self, index):
        return (self.folder / f"worker{index}.err").read_text()

    def events(self, name):
        lines = "".join(
            (self.folder / f"worker{i}.out").read_text() for i in range(len(self.procs))
        )
        return [json.loads(line) for line in lines.splitlines() if f'"event": "{name}"' in line]

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(env, tmp_path):
    started = Workers(env, tmp_path)
    yield started
    started.close()


def worker(env, *args, timeout=120):
    return run([sys.executable, str(ROOT / "worker.py"), *args], env, timeout=timeout)


def submit_all(env, n=OPERATIONS):
    for i in range(n):
        done = worker(env, "submit", "--thread", f"op-{i}", "--operation", f"op-{i}:open")
        assert done.returncode == 0, done.stderr


def tickets(env):
    with urllib.request.urlopen(env["API_URL"] + "/tickets", timeout=10) as response:
        return json.load(response)["tickets"]


def assert_each_operation_has_one_ticket(env, n=OPERATIONS):
    per_key = Counter(t["key"] for t in tickets(env))
    assert per_key == Counter({f"op-{i}:open": 1 for i in range(n)}), per_key


def assert_all_done(env, n=OPERATIONS):
    status = json.loads(worker(env, "status").stdout)["jobs"]
    assert [j["status"] for j in status] == ["done"] * n, status


@pytest.mark.long
def test_postgres_stopped_3_s_mid_run_no_worker_exits_and_every_operation_has_one_ticket(
    env, cluster, receiver, workers
):
    submit_all(env)
    workers.start(2)
    wait_until(lambda: len(workers.events("done")) >= 4, 60, "4 operations done")
    cluster.halt()
    time.sleep(3)  # the outage itself, not a synchronisation
    cluster.start_server()
    back = time.monotonic()
    waited = worker(env, "wait", "--timeout", str(RECOVERY_S))
    assert waited.returncode == 0, waited.stderr
    assert time.monotonic() - back < RECOVERY_S
    assert [p.poll() for p in workers.procs] == [None, None]  # no worker exited
    assert_each_operation_has_one_ticket(env)
    assert_all_done(env)
    for index in range(2):
        said = workers.stderr(index)
        assert "Traceback" not in said, said
        lost = [line for line in said.splitlines() if "lost the database" in line]
        back_lines = [line for line in said.splitlines() if "the database is back" in line]
        assert len(lost) == len(back_lines) >= 1, said  # one line lost, one line back


@pytest.mark.long
def test_the_receiver_down_8_s_mid_run_every_operation_finishes_with_one_ticket(
    env, receiver, workers, tmp_path
):
    submit_all(env)
    workers.start(2)
    wait_until(lambda: len(workers.events("done")) >= 4, 60, "4 operations done")
    receiver.kill()
    time.sleep(8)  # the outage: longer than the client's 4 attempts (~1.75 s)
    again = start_receiver(env, tmp_path)
    try:
        back = time.monotonic()
        waited = worker(env, "wait", "--timeout", str(RECOVERY_S))
        assert waited.returncode == 0, waited.stderr
        assert time.monotonic() - back < RECOVERY_S
        assert workers.events("job_retry"), "the outage made no job fail: it proved nothing"
        assert_each_operation_has_one_ticket(env)
        assert_all_done(env)
    finally:
        again.stop()


def test_a_receiver_down_for_good_makes_dead_jobs_and_wait_names_them(env, workers):
    """No receiver at all: each job runs WORKER_JOB_ATTEMPTS times, then is dead; status shows
    its last error; wait exits 5 and names the operations."""
    env.update(WORKER_JOB_ATTEMPTS="2", WORKER_RETRY_S="0.2", API_ATTEMPTS="1")
    submit_all(env, 2)
    workers.start(1)

    def all_dead():
        listed = json.loads(worker(env, "status").stdout)["jobs"]
        return [j["status"] for j in listed] == ["dead", "dead"]

    wait_until(all_dead, 60, "both jobs dead")
    listed = json.loads(worker(env, "status").stdout)["jobs"]
    for job in listed:
        assert job["attempts"] == 2 and "cannot reach the receiver" in job["error"], job
    retries = workers.events("job_retry")
    assert sorted((r["thread"], r["attempt"], r["attempts"]) for r in retries) == [
        ("op-0", 2, 2),
        ("op-1", 2, 2),
    ]
    waited = worker(env, "wait", "--timeout", "10")
    assert waited.returncode == 5, waited.stderr
    assert waited.stderr.startswith("worker.py: 2 operation(s) did not finish"), waited.stderr
    assert "op-0:open" in waited.stderr and "op-1:open" in waited.stderr
    assert len(waited.stderr.splitlines()) == 1 and waited.stdout == ""
    # Submitting again replaces the dead job: the operation gets another go (once a worker runs).
    workers.close()
    assert worker(env, "submit", "--thread", "op-0", "--operation", "op-0:open").returncode == 0
    statuses = [
        (j["thread"], j["status"]) for j in json.loads(worker(env, "status").stdout)["jobs"]
    ]
    assert statuses == [("op-1", "dead"), ("op-0", "queued")]


def test_wait_with_queued_jobs_and_no_worker_says_so_within_seconds(env):
    submit_all(env, 1)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "worker.py"), "wait", "--timeout", "30"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert time.monotonic() - started < 10, "no word within a few seconds"
        assert line == (
            "worker.py: 1 job(s) queued and no worker is running; start one "
            "(docker compose up -d worker, or natively: python worker.py run)\n"
        )
        assert proc.poll() is None  # it still waits: a worker may be starting
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_status_shows_a_running_job_and_the_worker_running_it(env, receiver, workers):
    env["FAILPOINTS"] = "after-ack=sleep(2)"  # long enough to look at it running
    submit_all(env, 1)
    workers.start(1)

    def running():
        listed = json.loads(worker(env, "status").stdout)["jobs"]
        return listed[0]["status"] == "running" and listed[0]

    wait_until(running, 30, "the job running")
    job = running() or {}
    assert job.get("worker", "").endswith(f":{workers.procs[0].pid}"), job


def test_submit_and_status_wait_out_a_short_outage_then_exit_3(env, cluster):
    cluster.halt()
    try:
        # Down for longer than WORKER_DB_WAIT_S: one line, exit 3.
        done = worker(dict(env, WORKER_DB_WAIT_S="1"), "status")
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith("worker.py: cannot open CHECKPOINT_DB (")
        assert len(done.stderr.splitlines()) == 1
        # Back within it: the command is still waiting when the database returns, then succeeds.
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "worker.py"),
                "submit",
                "--thread",
                "t",
                "--operation",
                "o",
            ],
            env=dict(env, WORKER_DB_WAIT_S="30"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with pytest.raises(subprocess.TimeoutExpired):  # refused, and it did not give up
            proc.wait(timeout=2)
        cluster.start_server()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["event"] == "submitted" and err == ""
    finally:
        if not cluster.running:
            cluster.start_server()


def test_sigterm_drains_the_running_graph_at_its_next_step_and_requeues_its_job_at_once(
    env, receiver, workers
):
    """A deploy's SIGTERM: the graph stops at the step boundary after prepare (RunControl), the
    job is queued again at once (not after a heartbeat: 60 s here), the worker exits 0, and the
    next worker resumes the thread and makes the one ticket."""
    env.update(FAILPOINTS="after-prepare=sleep(2)", WORKER_HEARTBEAT_S="60")
    submit_all(env, 1)
    workers.start(1)
    wait_until(lambda: workers.events("prepare"), 30, "the run inside prepare")
    workers.procs[0].send_signal(signal.SIGTERM)
    assert workers.procs[0].wait(10) == 0  # compose's default grace period
    assert workers.events("job_drained") and not workers.events("effect_ack")
    assert "draining 1 running job(s)" in workers.stderr(0)
    listed = json.loads(worker(env, "status").stdout)["jobs"]
    assert [j["status"] for j in listed] == ["queued"], listed  # not picked, waiting for 60 s
    env["FAILPOINTS"] = ""
    workers.start(1)
    waited = worker(env, "wait", "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    assert [e["resume"] for e in workers.events("job")] == [False, True]
    assert_each_operation_has_one_ticket(env, 1)


def test_run_drain_says_when_the_only_jobs_left_run_on_another_worker(env, receiver, workers):
    """Lab 10's held job never ends on its own: `run --drain` says what it waits for."""
    env["FAILPOINTS"] = ""
    held = ["--thread", "h", "--operation", "h:op", "--lab-hold", "after-ack"]
    assert worker(env, "submit", *held).returncode == 0
    workers.start(1)
    assert worker(env, "wait", "--for", "hold", "--thread", "h").returncode == 0
    drain = subprocess.Popen(
        [sys.executable, str(ROOT / "worker.py"), "run", "--drain"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = drain.stderr.readline()
        assert line == (
            "worker.py: --drain: waiting for 1 job(s) running on other workers "
            f"({socket.gethostname()}:{workers.procs[0].pid})\n"
        )
    finally:
        drain.kill()
        drain.wait()


def test_a_live_workers_job_stays_its_own_from_its_first_job_on(env, receiver, workers):
    """Jobs queued before three workers start together: each job runs once. A worker that
    imported LangGraph in its event loop on its first job stopped that job's heartbeat for
    longer than WORKER_HEARTBEAT_S allows, and another worker ran the job again (lab 10: the held
    job changed hands before the freeze). The lab's heartbeat, 3 s."""
    env.update(WORKER_HEARTBEAT_S="3", FAILPOINTS="")
    submit_all(env, 6)
    workers.start(3)
    waited = worker(env, "wait", "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    runs = Counter(e["job"] for e in workers.events("job"))
    assert runs == Counter({job: 1 for job in range(1, 7)}), runs
    assert_each_operation_has_one_ticket(env, 6)
