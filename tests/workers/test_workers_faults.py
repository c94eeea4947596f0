"""Workers against the faults of their own dependencies: Postgres restarting, the receiver down for
a while or for good, nobody to run the jobs, and a deploy's SIGTERM.

Everything is real: a throwaway Postgres cluster (tools.pg) halted with `pg_ctl -m immediate`
and started again on the same port, a receiver process killed and started again, and
`python -m labs.workers run` processes.
"""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

import pytest
from conftest import require_postgres
from prometheus_client.parser import text_string_to_metric_families

import failpoints
from tools.local import (
    ROOT,
    ReceiverProcess,
    free_port,
    lab_env,
    run_command,
    run_worker_here,
    wait_until,
)
from tools.pg import TempPostgres

OPERATIONS = 24
# Every wait below on a process or an event is a hang guard: only a hang reaches it, however
# busy the machine. How fast workers recover is a figure (make scale-chaos prints its seconds),
# not an assertion here.
HANG_GUARD_S = 300


@pytest.fixture
def cluster():
    """A cluster of the test's own: the tests that halt Postgres ask for it."""
    require_postgres()
    with TempPostgres() as pg:
        yield pg


@pytest.fixture
def env(request, tmp_path):
    """The workers' environment: on the test's own cluster where it asks for one (to halt it),
    else on a new database in the process's cluster (conftest)."""
    if "cluster" in request.fixturenames:
        url = request.getfixturevalue("cluster").url
    else:
        url = request.getfixturevalue("database")
    return lab_env(
        tmp_path / "data",
        free_port(),
        CHECKPOINT_DB=url,
        WORKER_HEARTBEAT_S="2",
        FAILPOINTS="",
    )


def start_receiver(env, tmp_path):
    """labs/receiver.py with the workers' environment, less their FAILPOINTS (the receiver has its
    own)."""
    env = {k: v for k, v in env.items() if k != "FAILPOINTS"}
    return ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()


@pytest.fixture
def receiver(env, tmp_path):
    proc = start_receiver(env, tmp_path)
    yield proc
    proc.stop()


class Workers:
    """labs/workers.py run processes, each logging to its own files."""

    def __init__(self, env, folder):
        self.env, self.folder, self.procs = env, folder, []

    def start(self, n, python=(), **env):
        """n workers; `python`: the interpreter's own options (`-X importtime` writes to stderr,
        which then goes to the .out file, the worker's lines and its imports in one order)."""
        for _ in range(n):
            index = len(self.procs)
            out = open(self.folder / f"worker{index}.out", "wb")
            err = subprocess.STDOUT if python else open(self.folder / f"worker{index}.err", "wb")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, *python, "-m", "labs.workers", "run"],
                    env=dict(self.env, **env),
                    cwd=ROOT,
                    stdout=out,
                    stderr=err,
                )
            )
        return self

    def stderr(self, index):
        return (self.folder / f"worker{index}.err").read_text()

    def start_paused(self, n, at):
        """n workers whose runs stop at the point `at` (FAILPOINTS pause) until unpause();
        the files that say each reached it."""
        pauses = []
        for _ in range(n):
            pauses.append(self.folder / f"worker{len(self.procs)}.{at}")
            self.start(1, FAILPOINTS=f"{at}=pause({pauses[-1]})")
        return pauses

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


def worker(env, *args, timeout=2 * HANG_GUARD_S):
    return run_command([sys.executable, "-m", "labs.workers", *args], env, timeout=timeout)


def submit_all(env, n=OPERATIONS):
    """n operations queued by `labs/workers.py submit`, run in this process (worker.main: the same
    code without n interpreters starting; submit and the exit 4 of a second job are lab 10's)."""
    for i in range(n):
        done = run_worker_here(
            ["submit", "--thread", f"op-{i}", "--operation", f"op-{i}:open"], env
        )
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


STATES = ("queued", "running", "stalled", "retrying", "dead", "done")
NO_JOBS = {f'worker_jobs{{state="{s}"}}': 0 for s in STATES}
NO_JOBS.update(worker_job_failures_total=0, worker_job_drains_total=0)


def figures(text):
    """`labs/workers.py metrics`'s queue samples, read by Prometheus's own text parser: name{label}
    -> value (the ledger's gauges beside them have tests of their own: test_ledger_metrics.py)."""
    return {
        sample.name + "".join(f'{{{k}="{v}"}}' for k, v in sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("worker_")
    }


@pytest.fixture
def metrics_server(env, tmp_path):
    """`labs/workers.py metrics --port 0`: the queue's GET /metrics, as Prometheus scrapes it."""
    err = open(tmp_path / "metrics.err", "wb")
    command = [sys.executable, "-m", "labs.workers", "metrics", "--port", "0"]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
    try:
        line = proc.stdout.readline()  # {"event": "metrics", ...} once it listens
        assert line, (tmp_path / "metrics.err").read_text()
        proc.url = f"http://127.0.0.1:{json.loads(line)['port']}/metrics"
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_GUARD_S) == 0, (tmp_path / "metrics.err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scrape(url):
    with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return figures(response.read().decode())


def lost_and_back(workers, index):
    said = workers.stderr(index).splitlines()
    return (
        [line for line in said if "lost the database" in line],
        [line for line in said if "the database is back" in line],
    )


@pytest.mark.long
def test_postgres_stopped_mid_run_no_worker_exits_and_every_operation_has_one_ticket(
    env, cluster, receiver, workers
):
    """Both workers held in the crash window (the receiver answered, the checkpoint not yet
    written) while Postgres stops as a crash would (every session cut) and starts again; their
    runs go on once it is back. Each worker then says it lost the database and that it is back.
    The test does not wait for "lost" before the runs go on: a worker may say it only once its
    held jobs end. When pgqueuer's scheduler meets the cut first, PgQueuer.run cancels the queue
    manager once (pgqueuer/core/applications.py); if that cancel lands in QueueManager.run's
    idle wait, its exit then waits for the running jobs, uncancelled (TaskManager.__aexit__,
    pgqueuer/core/tm.py). A rehearsal waited 300 s so, the runs held by the test."""
    submit_all(env)
    pauses = workers.start_paused(2, at="after-ack")
    wait_until(lambda: all(p.exists() for p in pauses), HANG_GUARD_S, "both runs in the window")
    cluster.halt()
    cluster.start_server()
    for pause in pauses:
        failpoints.unpause(pause)
    waited = worker(env, "wait", "--timeout", str(HANG_GUARD_S))
    assert waited.returncode == 0, waited.stderr
    assert [p.poll() for p in workers.procs] == [None, None]  # no worker exited
    assert_each_operation_has_one_ticket(env)
    assert_all_done(env)
    for index in range(2):
        said = workers.stderr(index)
        assert "Traceback" not in said, said
        lost, back = lost_and_back(workers, index)
        assert len(lost) == len(back) >= 1, said  # one line lost, one line back


@pytest.mark.long
def test_the_receiver_down_mid_run_every_operation_finishes_with_one_ticket(
    env, receiver, workers, tmp_path
):
    """The outage lasts until it has made a job fail (longer than the client's own retries):
    the job goes back to the queue, and its next run finds the receiver back."""
    submit_all(env)
    workers.start(2)
    wait_until(lambda: len(workers.events("done")) >= 4, HANG_GUARD_S, "4 operations done")
    receiver.kill()
    wait_until(lambda: workers.events("job_retry"), HANG_GUARD_S, "a job failed by the outage")
    again = start_receiver(env, tmp_path)
    try:
        waited = worker(env, "wait", "--timeout", str(HANG_GUARD_S))
        assert waited.returncode == 0, waited.stderr
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

    wait_until(all_dead, HANG_GUARD_S, "both jobs dead")
    listed = json.loads(worker(env, "status").stdout)["jobs"]
    for job in listed:
        assert job["attempts"] == 2 and "cannot reach the receiver" in job["error"], job
    retries = workers.events("job_retry")
    assert sorted((r["thread"], r["attempt"], r["attempts"]) for r in retries) == [
        ("op-0", 2, 2),
        ("op-1", 2, 2),
    ]
    waited = worker(env, "wait", "--timeout", str(HANG_GUARD_S))
    assert waited.returncode == 5, waited.stderr
    # /metrics: four failed runs (two per job), no drain
    expected = dict(NO_JOBS, worker_job_failures_total=4, **{'worker_jobs{state="dead"}': 2})
    assert figures(worker(env, "metrics").stdout) == expected
    assert waited.stderr.startswith("labs.workers: 2 operation(s) did not finish"), waited.stderr
    assert "op-0:open" in waited.stderr and "op-1:open" in waited.stderr
    assert len(waited.stderr.splitlines()) == 1 and waited.stdout == ""
    # Submitting again replaces the dead job: the operation gets another go (once a worker runs).
    workers.close()
    assert worker(env, "submit", "--thread", "op-0", "--operation", "op-0:open").returncode == 0
    statuses = [
        (j["thread"], j["status"]) for j in json.loads(worker(env, "status").stdout)["jobs"]
    ]
    assert statuses == [("op-1", "dead"), ("op-0", "queued")]


class Clock:
    """labs/workers.py's time module, with a monotonic() that moves only when the test moves it."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


class Polls:
    """Counts wait's looks at the queue (worker.jobs), so the test waits on a look, not a time."""

    def __init__(self, jobs):
        self.jobs, self.count, self.changed = jobs, 0, threading.Condition()

    async def __call__(self, *args):
        listed = await self.jobs(*args)
        with self.changed:
            self.count += 1
            self.changed.notify_all()
        return listed

    def two_more(self):
        """Until wait has looked twice more: the first look that began after this call has
        returned and wait has acted on it (on the clock as it is now)."""
        with self.changed:
            target = self.count + 2
            assert self.changed.wait_for(lambda: self.count >= target, HANG_GUARD_S)


def test_wait_says_no_worker_runs_the_queued_jobs_once_they_waited_past_the_notice_time(
    env, monkeypatch, capsys
):
    """`wait` with a job queued and no worker: one line once the job has gone unattended for
    longer than NO_WORKER_NOTICE_S, not before, and not twice; at --timeout, exit 3. In-process,
    on a clock the test moves (worker_queue.time), against a real Postgres queue."""
    from labs import worker_queue
    from labs import workers as worker_module

    submit_all(env, 1)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    clock, polls = Clock(), Polls(worker_queue.jobs)
    monkeypatch.setattr(worker_queue, "time", clock)
    monkeypatch.setattr(worker_queue, "jobs", polls)
    notice_s, began = worker_queue.NO_WORKER_NOTICE_S, clock.now
    exit_codes = []
    waiting = threading.Thread(
        target=lambda: exit_codes.append(worker_module.main(["wait", "--timeout", "30"])),
        daemon=True,
    )
    try:
        waiting.start()
        polls.two_more()  # the job seen unattended from `began` on
        clock.now = began + notice_s - 0.1
        polls.two_more()
        assert capsys.readouterr().err == ""  # not yet
        clock.now = began + notice_s + 0.1
        polls.two_more()
        line = (
            "labs.workers: 1 job(s) queued and no worker is running; start one: python -m "
            "labs.workers run (Docker: docker compose -p stateful-lab up -d worker)"
        )
        assert capsys.readouterr().err == line + "\n"
        clock.now = began + 29
        polls.two_more()
        assert capsys.readouterr().err == ""  # said once
        assert waiting.is_alive()  # and still waiting: a worker may be starting
        clock.now = began + 31
        waiting.join(HANG_GUARD_S)  # a hang guard: past --timeout on its clock, it gives up
        assert exit_codes == [3]
        assert capsys.readouterr().err == f"{line} after 30 s\n"
    finally:
        clock.now = began + 10_000  # a failed assertion above must not leave it waiting
        waiting.join(HANG_GUARD_S)
        failpoints.reset()  # worker.main configured the process's points


def test_status_shows_a_running_job_and_the_worker_running_it(env, receiver, workers):
    submit_all(env, 1)
    (pause,) = workers.start_paused(1, at="after-ack")  # its run waits there until unpaused
    wait_until(pause.exists, HANG_GUARD_S, "the run at after-ack")
    (job,) = json.loads(worker(env, "status").stdout)["jobs"]
    assert job["status"] == "running", job
    assert job["worker"].endswith(f":{workers.procs[0].pid}"), job
    failpoints.unpause(pause)
    assert worker(env, "wait", "--timeout", str(HANG_GUARD_S)).returncode == 0
    assert [j["status"] for j in json.loads(worker(env, "status").stdout)["jobs"]] == ["done"]


def test_submit_and_status_wait_out_a_short_outage_then_exit_3(env, cluster):
    cluster.halt()
    try:
        # Down for longer than WORKER_DB_WAIT_S: one line, exit 3.
        done = worker(dict(env, WORKER_DB_WAIT_S="1"), "status")
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith("labs.workers: cannot open CHECKPOINT_DB (")
        assert len(done.stderr.splitlines()) == 1
        # Back within it: the command is still waiting when the database returns, then succeeds.
        # Until then the port is a listener of the test's, which hangs up on whoever connects:
        # the command's first try is the event that says it is waiting.
        refuser = socket.create_server(("127.0.0.1", cluster.port))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "labs.workers",
                "submit",
                "--thread",
                "t",
                "--operation",
                "o",
            ],
            env=dict(env, WORKER_DB_WAIT_S=str(HANG_GUARD_S)),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with refuser:
            refuser.settimeout(HANG_GUARD_S)  # a hang guard: the first try comes at once
            tried, _ = refuser.accept()
            tried.close()  # refused
        assert proc.poll() is None  # and it did not give up: it waits for the next try
        cluster.start_server()
        out, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0, err
        assert json.loads(out)["event"] == "submitted" and err == ""
    finally:
        if not cluster.running:
            cluster.start_server()


def test_sigterm_drains_the_running_graph_at_its_next_step_and_requeues_its_job_at_once(
    env, receiver, workers, metrics_server
):
    """A deploy's SIGTERM: the graph stops at the step boundary after prepare (RunControl), the
    job is queued again at once (not after a heartbeat: 60 s here), the worker exits 0, and the
    next worker resumes the thread and makes the one ticket. GET /metrics counts the drain
    apart from failures, after the drained worker has exited too."""
    env.update(WORKER_HEARTBEAT_S="60")
    submit_all(env, 1)
    (pause,) = workers.start_paused(1, at="after-prepare")
    wait_until(pause.exists, HANG_GUARD_S, "the run inside prepare")
    workers.procs[0].send_signal(signal.SIGTERM)
    draining = "draining 1 running job(s)"
    wait_until(lambda: draining in workers.stderr(0), HANG_GUARD_S, "the drain asked for")
    failpoints.unpause(pause)  # prepare returns: the step boundary where the drain stops it
    assert workers.procs[0].wait(HANG_GUARD_S) == 0  # a hang guard, not the grace period
    assert workers.events("job_drained") and not workers.events("effect_ack")
    status = json.loads(worker(env, "status").stdout)
    # not picked, waiting for 60 s; and no failure: no attempt counted, no error, nothing stuck;
    # the drain counted apart
    assert status["jobs"] == [
        {"drains": 1, "job": 1, "operation": "op-0:open", "status": "queued", "thread": "op-0"}
    ], status
    assert (status["effects_unknown"], status["oldest_unknown_s"]) == (0, 0)
    drained = dict(NO_JOBS, worker_job_drains_total=1)
    assert scrape(metrics_server.url) == dict(drained, **{'worker_jobs{state="queued"}': 1})
    env["FAILPOINTS"] = ""
    workers.start(1)
    waited = worker(env, "wait", "--timeout", str(HANG_GUARD_S))
    assert waited.returncode == 0, waited.stderr
    assert [e["resume"] for e in workers.events("job")] == [False, True]
    assert_each_operation_has_one_ticket(env, 1)
    (done,) = json.loads(worker(env, "status").stdout)["jobs"]
    assert done == {"drains": 1, "job": 1, "operation": "op-0:open", "status": "done",
                    "thread": "op-0", "ticket_id": 1}  # fmt: skip
    assert scrape(metrics_server.url) == dict(drained, **{'worker_jobs{state="done"}': 1})


def test_run_drain_says_when_the_only_jobs_left_run_on_another_worker(env, receiver, workers):
    """Lab 10's held job never ends on its own: `run --drain` says what it waits for."""
    env["FAILPOINTS"] = ""
    held = ["--thread", "h", "--operation", "h:op", "--lab-hold", "after-ack"]
    assert worker(env, "submit", *held).returncode == 0
    workers.start(1)
    assert worker(env, "wait", "--for", "hold", "--thread", "h").returncode == 0
    drain = subprocess.Popen(
        [sys.executable, "-m", "labs.workers", "run", "--drain"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = drain.stderr.readline()
        assert line == (
            "labs.workers: --drain: waiting for 1 job(s) running on other workers "
            f"({socket.gethostname()}:{workers.procs[0].pid})\n"
        )
    finally:
        drain.kill()
        drain.wait()


def test_a_live_workers_job_stays_its_own_from_its_first_job_on(env, receiver, workers):
    """Jobs queued before the workers start; one takes its first job, two more join: each job
    runs once, and the first imports no LangGraph once it said it takes jobs. A worker that
    imported it in its event loop on its first job (about 1 s idle, more with three starting at
    once) stopped that job's heartbeat past WORKER_HEARTBEAT_S, and another worker ran the job
    again (lab 10: the held job changed hands before the freeze). The import is what is checked,
    in the order the interpreter wrote it (`-X importtime`), not a heartbeat's timing: a loaded
    machine can lapse any lease. So the lease here is 60 s, not the default 10: under the load
    of a whole suite (load 12 on 2 cores) a 10 s lease lapsed once and a job ran twice, with
    the import order right. A stall of 60 s is a broken machine, and the once-each count below
    stays a check of what the workers did, not of the machine's load."""
    env.update(WORKER_HEARTBEAT_S="60", FAILPOINTS="")
    submit_all(env, 6)
    workers.start(1, python=("-X", "importtime"))  # alone first: it takes a first job
    out = workers.folder / "worker0.out"
    wait_until(lambda: '"event": "job"' in out.read_text(), HANG_GUARD_S, "worker 0's first job")
    workers.start(2)
    waited = worker(env, "wait", "--timeout", str(HANG_GUARD_S))
    assert waited.returncode == 0, waited.stderr
    runs = Counter(e["job"] for e in workers.events("job"))
    assert runs == Counter({job: 1 for job in range(1, 7)}), runs
    assert_each_operation_has_one_ticket(env, 6)
    lines = out.read_text().splitlines()
    ready = next(i for i, line in enumerate(lines) if '"event": "worker"' in line)
    assert any(" langgraph." in line for line in lines[:ready]), "no import was seen"
    late = [line for line in lines[ready:] if "import time:" in line and "langgraph" in line]
    assert not late, late
