"""The workers' effect ledger, in Postgres beside their checkpoints and queue: two processes on
one key send one request, reconcile and status on the workers' ledger, a graph of one's own.

Real parts: a throwaway Postgres cluster (tools.pg, one for the module, a database per
test), the receiver as a process (its POSTs counted from its /metrics), forked processes with a
ledger connection each, and `python -m labs.workers` processes.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

import effects
import exitcodes
import workflow
from tools.local import ROOT, ReceiverProcess, free_port, lab_env, run_command

HANG_GUARD_S = 300  # only a hang reaches it, however busy the machine


@pytest.fixture
def cluster(postgres):
    """The process's cluster (conftest): the restart test halts and restarts it."""
    return postgres


@pytest.fixture
def env(cluster, tmp_path, request):
    """The workers' environment, on a new database of this test's own."""
    import psycopg

    name = "w_" + re.sub(r"\W", "_", request.node.name).lower()[:50]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = cluster.url.rsplit("/", 1)[0] + "/" + name
    return lab_env(
        tmp_path / "data", free_port(), CHECKPOINT_DB=url, WORKER_HEARTBEAT_S="2", FAILPOINTS=""
    )


@pytest.fixture
def receiver(env, tmp_path):
    proc = ReceiverProcess(env, log_path=tmp_path / "receiver.log").start()
    yield proc
    proc.stop()


def posts(receiver):
    """POSTs the receiver answered with a ticket (created or replayed), from GET /metrics."""
    with urllib.request.urlopen(receiver.url + "/metrics") as response:
        text = response.read().decode()
    names = ("tickets_created", "idempotent_replays")
    return sum(int(re.search(rf"^receiver_{n}_total (\d+)$", text, re.M)[1]) for n in names)


def ledger_on(url):
    """A ledger on a connection of its own: what each worker's job opens (worker.job_ledger)."""
    import psycopg
    from psycopg.rows import dict_row

    conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
    ledger = effects.PostgresLedger(conn)
    ledger.close = conn.close
    return ledger


def test_a_ledger_opened_beside_one_that_writes_takes_no_lock_it_holds(env):
    """A worker starting (its ledger's schema check) while another one's transaction writes
    the ledger (the locks an INSERT into effects and effect_receipts takes): the new ledger
    opens at once, under a 2 s lock_timeout, and the writer goes on. When setup ran ALTER
    TABLE and CREATE TRIGGER every time, it waited for the writer's commit, and once, two
    workers starting beside a third deadlocked with its receipt's INSERT (its job ran again)."""
    import psycopg
    from psycopg.rows import dict_row

    ledger_on(env["CHECKPOINT_DB"]).close()  # the schema, made once
    writer = psycopg.connect(env["CHECKPOINT_DB"], row_factory=dict_row)  # a transaction
    try:
        writer.execute("LOCK TABLE effects, effect_receipts IN ROW EXCLUSIVE MODE")
        with psycopg.connect(env["CHECKPOINT_DB"], autocommit=True, row_factory=dict_row) as conn:
            conn.execute("SET lock_timeout = '2s'")  # a wait for the writer raises here
            effects.PostgresLedger(conn)
        writer.execute("SELECT 1 FROM effects").fetchall()  # the writer's transaction is alive
    finally:
        writer.rollback()
        writer.close()


def worker(env, *args):
    return run_command([sys.executable, "-m", "labs.workers", *args], env, timeout=HANG_GUARD_S)


def test_two_processes_performing_one_key_at_once_send_one_request(env, receiver):
    """Two workers resuming one thread at once (a frozen one woke up, another took its job over):
    the first has claimed the key and its request is about to leave; the second, in another
    process, finds the claim. It must not send: a row in state requested cannot tell a live
    sender from a dead one, and a lookup then finds nothing yet. It gets InFlight, the first
    one's request is the only one the receiver sees, and the second's next try finds the
    receipt. (Without the key's lock the second one looked up, found nothing and sent: two
    POSTs.) The first one's send waits at a pipe, between its claim and its request."""
    url, key, request = env["CHECKPOINT_DB"], "case-9:open-ticket:v1", {"title": "t"}
    client = workflow.TicketClient(receiver.url, attempts=1)
    ledger_on(url).close()  # the tables, before the race
    claimed_r, claimed_w = os.pipe()
    go_r, go_w = os.pipe()

    def send_when_told(client, request, key):
        os.write(claimed_w, b".")  # claimed: the ledger says requested
        os.read(go_r, 1)
        return workflow.ticket.send(client, request, key)

    first = os.fork()
    if first == 0:  # the first worker: its own process, its own connection
        code = 1
        try:
            ledger = ledger_on(url)
            done = dataclasses.replace(workflow.ticket, send=send_when_told).perform(
                ledger, key, request, client
            )
            code = 0 if done.how == "sent" else 3
        finally:
            os._exit(code)
    try:
        os.read(claimed_r, 1)
        second = ledger_on(url)
        try:
            outcome = workflow.ticket.perform(second, key, request, client)
        except effects.InFlight as error:
            outcome = error
    finally:
        os.write(go_w, b".")
        _, status = os.waitpid(first, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the first one sent, and kept its receipt
    assert posts(receiver) == 1, outcome  # one request reached the receiver
    assert isinstance(outcome, effects.InFlight), outcome
    assert workflow.ticket.perform(second, key, request, client).how == "receipt"
    assert posts(receiver) == 1
    assert [to for _, to, _ in second.history(key)] == ["requested", "confirmed"]
    second.close()


def in_process(monkeypatch, capsys, env, *argv):
    """worker.main(argv) in this process, with env: (exit code, its JSON lines, its stderr)."""
    from labs import workers as worker_py

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = worker_py.main(list(argv))
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_status_shows_what_is_stuck_and_reconcile_settles_it_on_the_workers_ledger(
    env, receiver, monkeypatch, capsys
):
    """Two effects sent with no answer (state unknown): one the receiver made, one it never got.
    status counts them; reconcile asks the receiver by key and settles both; a job of the first
    operation then finds the receipt and sends nothing. The job runs the core's own graph
    (WORKER_GRAPH=workflow:build_graph), which has no --mode: the lab's is only the default."""
    client = workflow.TicketClient(receiver.url, attempts=1)
    ledger = ledger_on(env["CHECKPOINT_DB"])
    for key in ("made:op", "lost:op"):
        ledger.claim(key, "ticket", {"title": "Check supplier configuration"})
    client.create("Check supplier configuration", "made:op")  # it arrived; its answer did not
    for key in ("made:op", "lost:op"):
        ledger.move(key, "unknown", "no answer: the test")
    code, lines, _ = in_process(monkeypatch, capsys, env, "status")
    assert code == 0 and lines[0]["effects_unknown"] == 2 and lines[0]["oldest_unknown_s"] >= 0

    code, lines, err = in_process(monkeypatch, capsys, env, "reconcile")
    assert code == 0, err
    assert lines == [
        {"effect": "ticket", "event": "reconciled", "key": "made:op", "now": "confirmed",
         "was": "unknown"},
        {"effect": "ticket", "event": "reconciled", "key": "lost:op", "now": "not sent",
         "was": "unknown"},
        {"count": 0, "event": "effects_unknown", "oldest_s": 0},
    ]  # fmt: skip
    code, lines, _ = in_process(monkeypatch, capsys, env, "status")
    assert (lines[0]["effects_unknown"], lines[0]["oldest_unknown_s"]) == (0, 0)
    code, _, err = in_process(monkeypatch, capsys, env, "reconcile", "--not-sent", "made:op")
    refused = "labs.workers: nothing was settled: effect 'made:op' is not open (confirmed)"
    assert code == exitcodes.EXIT_THREAD and err.startswith(refused), err

    sent_before = posts(receiver)
    env["WORKER_GRAPH"] = "workflow:build_graph"
    code, _, err = in_process(
        monkeypatch, capsys, env, "submit", "--thread", "made", "--operation", "made:op"
    )
    assert code == 0, err
    ran = worker(env, "run", "--drain")
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    assert {"event": "effect_receipt", "key": "made:op", "ticket_id": 1} in events
    assert posts(receiver) == sent_before  # the job's ledger is the one reconcile settled
    (done,) = [e for e in events if e["event"] == "done"]
    assert "mode" not in done  # the core's graph ran, not the lab's
    ledger.close()


def test_reconcile_settles_as_a_person_says_once_the_receiver_agrees(
    env, receiver, monkeypatch, capsys
):
    """--confirmed and --not-sent on the workers' ledger, each checked against what the
    receiver holds under the key (looked up) and recorded with how."""
    ledger = ledger_on(env["CHECKPOINT_DB"])
    made = workflow.TicketClient(env["API_URL"]).create("a", "a")  # "a" went out, "b" did not
    for key in ("a", "b"):
        ledger.claim(key, "ticket", {"title": key})
        ledger.move(key, "unknown", "no answer: the test")
    code, lines, err = in_process(
        monkeypatch, capsys, env, "reconcile", "--confirmed", "a", "--not-sent", "b", "--wait"
    )  # --wait: a person's word on "b" waits out the receiver's settle time
    assert code == 0, err
    assert [(e["event"], e.get("key"), e.get("state")) for e in lines] == [
        ("settled", "a", "confirmed"),
        ("settled", "b", "released"),
        ("effects_unknown", None, None),
    ]
    assert ledger.history("a")[-1] == (
        "unknown", "confirmed", "settled: confirmed (a person: reconcile --confirmed, looked up)"
    )  # fmt: skip
    assert ledger.get("a").answer["ticket_id"] == made["ticket_id"]  # the receiver's ticket
    assert ledger.get("b").state == "released"
    ledger.close()


@pytest.mark.fast
def test_worker_py_imports_no_lab_and_offers_mode_only_with_a_graph_that_has_variants(
    monkeypatch,
):
    """labs/lab_graph.py is WORKER_GRAPH's default, imported by name: importing labs.workers loads
    none of it, and --mode (the lab's variants) is refused for the core's graph, which has none."""
    looked = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, labs.workers; sys.exit('labs.lab_graph' in sys.modules)",
        ],
        cwd=ROOT,
    )
    assert looked.returncode == 0
    monkeypatch.setenv("WORKER_GRAPH", "workflow:build_graph")
    from labs import workers as worker_py

    with pytest.raises(SystemExit) as refused:
        worker_py.main(["submit", "--thread", "t", "--operation", "k", "--mode", "safe"])
    assert refused.value.code == exitcodes.EXIT_USAGE


@pytest.mark.fast
def test_a_worker_graph_that_names_nothing_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("WORKER_GRAPH", "workflow:no_such_builder")
    from labs import workers as worker_py

    assert worker_py.main(["status"]) == exitcodes.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("labs.workers: WORKER_GRAPH='workflow:no_such_builder' names no graph")


@pytest.mark.fast
def test_a_job_that_meets_a_key_another_worker_performs_is_tried_again_later():
    """InFlight is no failure of the operation: the job goes back to the queue (job_retry), and
    its next run finds the other worker's receipt; a Conflict (a reused key) is dead at once."""
    from labs import worker_run

    assert worker_run.retryable(effects.InFlight("k")) == "another worker is performing its effect"
    assert worker_run.retryable(effects.Conflict("k was claimed for another request")) is None


def test_the_workers_metrics_serve_the_ledger_beside_the_queue(env, receiver, tmp_path):
    """labs/workers.py metrics --port 0 on the workers' Postgres: the ledger's effects by state and
    the oldest open one's age, beside the queue's figures, scraped over HTTP and parsed by
    prometheus_client. The rows are real ledger rows, made through its own API."""
    from prometheus_client.parser import text_string_to_metric_families

    client = workflow.TicketClient(receiver.url, attempts=1)
    ledger = ledger_on(env["CHECKPOINT_DB"])
    before = time.time()
    try:
        workflow.ticket.perform(ledger, "done:op", {"title": "done"}, client)  # confirmed
        for key, state in [("window:op", "requested"), ("out:op", "unknown")]:
            ledger.claim(key, "ticket", {"title": key})
            if state != "requested":  # requested: as a kill at after-send leaves it
                ledger.move(key, state, "the test")
    finally:
        ledger.close()
    err = open(tmp_path / "metrics.err", "wb")
    command = [sys.executable, "-m", "labs.workers", "metrics", "--port", "0"]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
    try:
        url = f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}/metrics"
        with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as response:
            text = response.read().decode()
        after = time.time()
    finally:
        proc.terminate()
        assert proc.wait(HANG_GUARD_S) == 0, (tmp_path / "metrics.err").read_text()
    seen = {
        s.name + "".join(f'{{{k}="{v}"}}' for k, v in s.labels.items()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert 0 <= seen.pop("ledger_oldest_open_effect_age_seconds") <= after - before
    ledger_seen = {k: v for k, v in seen.items() if k.startswith("ledger_")}
    assert ledger_seen == {
        **{f'ledger_effects{{state="{s}"}}': 0 for s in effects.STATES},
        'ledger_effects{state="confirmed"}': 1,
        'ledger_effects{state="requested"}': 1,
        'ledger_effects{state="unknown"}': 1,
    }
    assert seen['worker_jobs{state="queued"}'] == 0  # the queue's figures are still there


def test_reconcile_on_a_receipt_that_fails_its_check_is_one_line_and_exit_7(
    env, monkeypatch, capsys
):
    """A receipt changed in the database (its ticket id): labs/workers.py reconcile of its key said
    a traceback; now one line and workflow.py's exit 7, as a run meeting it."""
    ledger = ledger_on(env["CHECKPOINT_DB"])
    try:
        ledger.claim("k:op", "ticket", {"title": "Check supplier configuration"})
        ledger.confirm("k:op", {"ticket_id": 1, "created": True}, 1, "the test")
        ledger.sql("ALTER TABLE effect_receipts DISABLE TRIGGER receipts_are_kept")
        ledger.sql("UPDATE effect_receipts SET external_id = '999' WHERE key = 'k:op'")
    finally:
        ledger.close()
    code, _, err = in_process(monkeypatch, capsys, env, "reconcile", "--confirmed", "k:op")
    assert code == exitcodes.EXIT_LEDGER_DAMAGED, err
    assert err.count("\n") == 1 and "the receipt of 'k:op' does not match" in err, err


def test_a_run_held_across_a_postgres_restart_is_one_line_exit_3_and_its_resume_goes_on(
    env, cluster, receiver, tmp_path, capsys
):
    """The review's F10: `workflow.py start` held at after-send while Postgres restarts; the
    receipt's commit met a closed connection (psycopg.OperationalError, a traceback). One line,
    exit 3 as for a CHECKPOINT_DB that does not answer; the row stays requested, and the resume
    adopts the ticket. The module's cluster, restarted: CHECKPOINT first, since it runs with
    synchronous_commit off (tools.pg), whose last commits an immediate stop would lose."""
    import psycopg

    import failpoints
    from tools.local import wait_until

    pause = tmp_path / "after-send"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "workflow.py"), "start", "--thread", "pg", "--operation", "k"],
        env={**env, "FAILPOINTS": f"after-send=pause({pause})"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(pause.exists, HANG_GUARD_S, "the run at after-send")
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the claim and the checkpoints reach the WAL on disk
        cluster.halt()
        cluster.start_server()
        failpoints.unpause(pause)
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.EXIT_NO_ANSWER, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("workflow.py: CHECKPOINT_DB stopped answering ("), err
    assert err.endswith("resume it with: python workflow.py resume --thread pg\n"), err
    assert workflow.main(["resume", "--thread", "pg"], env) == 0  # in-process
    assert '"event": "effect_adopted"' in capsys.readouterr().out
    assert len(workflow.TicketClient(receiver.url).tickets()) == 1
