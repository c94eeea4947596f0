"""Lab 19's outbox against the real receiver, on SQLite and Postgres: kill the node before and
after its outbox write, kill the relay before its POST and between the receiver's answer and
the mark, and count what the receiver made.

The kills are real: lab.main or relay.main in a forked child of this test (LangGraph is imported
already, so a child starts in milliseconds), SIGKILLed by its failpoint, so no finally and no
atexit of the dying process writes anything. The rest runs in this process.
"""

import contextlib
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_metrics

import effects
import failpoints
from labs import relay, worker_metrics
from tools.local import ROOT, events, run_workflow_here, shell_exit_code, wait_until

DOCKER = "Docker: docker compose -p stateful-lab run --rm workflow"  # a hint's Docker form

OPERATION = "case-outbox:open-ticket:v1"
TITLE = "Check supplier configuration"
STOPS = [  # (program, failpoint): where a real SIGKILL lands
    ("node", None),
    ("node", "before-outbox"),
    ("node", "after-outbox"),
    ("relay", "before-publish"),
    ("relay", "after-publish"),
]


@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.fast), "postgres"])
def env(request, lab, receiver):
    """The lab's environment with CHECKPOINT_DB on this backend (a new Postgres database)."""
    if request.param == "sqlite":
        return lab
    import psycopg

    pg = request.getfixturevalue("postgres")
    name = f"outbox_{os.getpid()}_{abs(hash(request.node.name))}"
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return {**lab, "CHECKPOINT_DB": pg.url.rsplit("/", 1)[0] + "/" + name}


@pytest.mark.parametrize(("program", "point"), STOPS, ids=[f"{p}-{s}" for p, s in STOPS])
def test_a_kill_at_any_point_of_the_node_or_the_relay_makes_one_ticket(
    env, receiver, tmp_path, program, point
):
    start = ["outbox", "start", "--thread", "t", "--operation", OPERATION]
    if program == "node" and point:
        code, out = forked(lab_main, [*start, "--crash-at", point], env)
        assert (code, events(out)[-1]) == (137, {"event": "crash", "at": point})
        resumed = typed(["outbox", "resume", "--thread", "t"], env)
        written = [e["written"] for e in resumed if e["event"] == "outbox"]
        assert written == [point == "before-outbox"]  # the re-run node: its row, or it writes it
    else:
        typed(start, env)
    assert tickets(receiver) == []  # the run is done and nothing was sent

    if program == "relay":
        code, out = forked(relay.main, ["--once", "--crash-at", point], env)
        assert (code, events(out)[-1]) == (137, {"event": "crash", "at": point})
        (row,) = shown(env)
        assert (row["state"], row["deliveries"]) == ("pending", 1)  # the window, in the outbox
        assert len(tickets(receiver)) == (point == "after-publish")
    code, out = forked(relay.main, ["--once"], env)
    answered = [e for e in events(out) if e["event"] == "answered"]
    assert code == 0 and len(answered) == 1, out

    (ticket,) = tickets(receiver)  # one ticket, whatever was killed where
    assert (ticket["key"], ticket["payload"]) == (OPERATION, {"title": TITLE})
    (row,) = shown(env)
    assert row["state"] == "published" and row["answer"]["ticket_id"] == ticket["ticket_id"]
    # The relay's window is seen at the receiver: the redelivery, answered with the first outcome
    redelivered = point == "after-publish"
    assert answered[0]["created"] is not redelivered
    assert replays(tmp_path) == ([OPERATION] if redelivered else [])
    # Once marked, a message is not sent again
    assert forked(relay.main, ["--once"], env) == (0, relayed(0) + "\n")
    assert len(posts(tmp_path)) == 1 + redelivered


@pytest.mark.fast
def test_a_message_id_is_written_once_and_not_reused_for_another_message(tmp_path):
    with relay.open_outbox(tmp_path / "c.sqlite") as outbox:
        assert outbox.put("m-1", "/tickets", {"title": "a"}) is True
        assert outbox.put("m-1", "/tickets", {"title": "a"}) is False  # a re-run: nothing new
        with pytest.raises(effects.Conflict, match="another message"):
            outbox.put("m-1", "/tickets", {"title": "b"})
        assert [(m.message_id, m.payload) for m in outbox.messages()] == [("m-1", {"title": "a"})]


@pytest.mark.fast
def test_a_refused_message_is_kept_refused_and_not_sent_again(lab, receiver, tmp_path, capsys):
    put(lab, "m-empty", {"title": ""})  # the receiver refuses it (400)
    assert relay.main(["--once"], lab) == 1
    (refused, summary) = events(capsys.readouterr().out)
    assert refused["event"] == "refused" and refused["refusal"]["status"] == 400
    assert summary == {"event": "relayed", "pending": 0, "published": 0}
    capsys.readouterr()
    assert relay.main(["--once"], lab) == 0
    assert capsys.readouterr().err.startswith("labs.relay: nothing pending (python -m labs.relay")
    assert len(re.findall(r"rejected 400", (tmp_path / "receiver.log").read_text())) == 1
    assert tickets(receiver) == []


@pytest.mark.fast
def test_a_wrong_api_url_keeps_the_message_pending_not_refused(lab, receiver, tmp_path, capsys):
    put(lab, "m-1", {"title": "a"})
    wrong = {**lab, "API_URL": lab["API_URL"] + "/nothing"}  # the receiver: 404, no such path
    assert relay.main(["--once"], wrong) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered 404; check API_URL" in err, err
    assert [m["state"] for m in shown(lab)] == ["pending"]  # not refused: the next relay sends it
    assert relay.main(["--once"], lab) == 0
    assert [t["key"] for t in tickets(receiver)] == ["m-1"]


@pytest.mark.fast
def test_a_ticket_run_and_an_outbox_run_name_each_others_command(lab, receiver, capsys):
    assert lab_main(["start", "--thread", "t"], lab) == 0
    assert lab_main(["outbox", "start", "--thread", "t"], lab) == 4
    assert lab_main(["outbox", "resume", "--thread", "t"], lab) == 4
    assert lab_main(["outbox", "state", "--thread", "t"], lab) == 4
    state = f"python -m labs state --thread t ({DOCKER} state --thread t)"
    hint = f"thread 't' is not an outbox run; it is a ticket run: {state} shows it"
    assert capsys.readouterr().err.splitlines() == [
        f"labs: {hint}; outbox start takes a new --thread",
        f"labs: {hint}",
        f"labs: thread 't' is not an outbox run; {state} shows it",
    ]
    assert (
        lab_main(["state", "--thread", "t"], lab) == 0
    )  # the hint, typed: it reads, sends nothing
    assert lab_main(["outbox", "start", "--thread", "o"], lab) == 0
    assert lab_main(["resume", "--thread", "o"], lab) == 4
    assert capsys.readouterr().err.splitlines()[-1] == (
        "labs: thread 'o' is an outbox run (lab 19): python -m labs outbox resume --thread o "
        f"({DOCKER} outbox resume --thread o)"
    )
    assert len(tickets(receiver)) == 1


@pytest.mark.fast
def test_the_relay_says_in_one_line_what_is_wrong(lab, tmp_path, capsys):
    put(lab, "m-1", {"title": "a"})
    nobody = {**lab, "API_URL": "http://127.0.0.1:9", "API_ATTEMPTS": "1"}  # nothing listens
    assert relay.main(["--once"], nobody) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the receiver" in err, err
    (row,) = shown(lab)
    assert row["state"] == "pending"  # sent nowhere: the next relay sends it
    assert relay.main(["--once"], {**lab, "FAILPOINTS": "after-ack=kill"}) == 2
    assert capsys.readouterr().err.startswith("labs.relay: FAILPOINTS: unknown point 'after-ack'")


FOREIGN = {  # another program's tables with our names (REVIEW F9)
    "effects": "CREATE TABLE effects (id INTEGER PRIMARY KEY, name TEXT)",
    "outbox": "CREATE TABLE outbox (id INTEGER PRIMARY KEY, body TEXT, sent INTEGER)",
    "inbox": "CREATE TABLE inbox (id INTEGER PRIMARY KEY, sender TEXT, text TEXT)",
}


@pytest.mark.fast
@pytest.mark.parametrize("table", FOREIGN)
def test_a_foreign_table_with_our_name_is_refused_and_nothing_is_written(
    lab, tmp_path, capsys, table
):
    """labs/cli.py start, hooks and labs/relay.py on another program's file that has a table named
    like one of ours: one line and exit 2, the file's bytes as they were, and no -wal beside it."""
    path = tmp_path / "theirs.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(FOREIGN[table])
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    env = {**lab, "CHECKPOINT_DB": str(path), "API_URL": "http://127.0.0.1:9"}
    for main, argv in [
        (lab_main, ["start", "--thread", "t"]),
        (lab_main, ["hooks", "--ticket", "1"]),
        (relay.main, ["--once"]),
    ]:
        assert main(argv, env) == 2, argv
        (line,) = capsys.readouterr().err.splitlines()
        assert f"({table}): another program's database; nothing was written to it" in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("theirs")) == [
        "theirs.sqlite"
    ]


def test_two_relays_at_once_never_both_send_a_message(env, receiver, tmp_path, capsys):
    """REVIEW B: two relays at once sent 19-20 of 20 messages twice. The first is held between
    the receiver's answer and its mark (a pause failpoint), inside its round; the second finds
    the outbox's relay lock held and sends nothing."""
    typed(["outbox", "start", "--thread", "t", "--operation", OPERATION], env)
    held = tmp_path / "held"
    holding = {**env, "FAILPOINTS": f"after-publish=pause({held})"}
    first = subprocess.Popen(
        [sys.executable, "-m", "labs.relay", "--once"], env=holding, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(held.exists, 60, "the first relay between the answer and its mark")
        assert relay.main(["--once"], env) == 0  # the second: the row is still pending
        out, err = capsys.readouterr()
        assert out == relayed(0, pending=1) + "\n"
        assert err.startswith("labs.relay: another relay is delivering this outbox now")
        failpoints.unpause(held)
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert [e.get("created") for e in events(out)] == [True, None]  # answered, then relayed
    (ticket,) = tickets(receiver)
    assert posts(tmp_path) == [OPERATION] and replays(tmp_path) == []
    (row,) = shown(env)
    assert (row["state"], row["deliveries"]) == ("published", 1)


@pytest.mark.fast
def test_a_row_the_relay_cannot_read_is_quarantined_and_the_rest_go_on(lab, receiver, capsys):
    """REVIEW F8: a payload that is not JSON killed --once with a traceback and the relay loop
    for good. It is kept, marked, listed, said once, and never sent; the row after it is."""
    put(lab, "m-0", {"title": "first"})
    with contextlib.closing(sqlite3.connect(lab["CHECKPOINT_DB"])) as db, db:
        db.execute(
            "INSERT INTO outbox (message_id, destination, payload, created_at) "
            "VALUES ('garbled', '/tickets', '{x', 1)"  # oldest: first in line
        )
    put(lab, "m-2", {"title": "after"})
    assert relay.main(["--once"], lab) == 1  # not all delivered
    out, err = capsys.readouterr()
    assert [e["event"] for e in events(out)] == ["answered", "answered", "relayed"]
    (line,) = err.splitlines()
    assert line.startswith("labs.relay: message 'garbled' quarantined: it cannot be read (")
    assert [t["key"] for t in tickets(receiver)] == ["m-0", "m-2"]
    assert relay.main(["--once"], lab) == 0  # not tried again
    capsys.readouterr()
    garbled = next(m for m in shown(lab) if m["message_id"] == "garbled")
    assert (garbled["state"], garbled["payload"]) == ("quarantined", "{x")
    assert garbled["answer"]["error"].startswith("cannot be read: ")
    # and counted where a dashboard looks: labs/workers.py metrics's outbox gauges
    gauges = "\n".join(worker_metrics.outbox_lines(lab["CHECKPOINT_DB"])) + "\n"
    counted = {s.labels["state"]: s.value for f in parse_metrics(gauges) for s in f.samples}
    assert counted == {"pending": 0, "published": 2, "refused": 0, "quarantined": 1}


def test_the_relay_service_delivers_until_sigterm_and_waits_out_a_receiver_gone(
    env, receiver, tmp_path, request
):
    """`python -m labs.relay` (compose's relay service): a round every RELAY_POLL_S; a receiver
    that is down is a line on stderr and a later round; on Postgres, a restart of the database
    (REVIEW F8: the loop died, exit 3) is waited out; SIGTERM ends it with exit 0."""
    env = {**env, "RELAY_POLL_S": "0.05", "API_ATTEMPTS": "1"}
    postgres = env["CHECKPOINT_DB"].startswith("postgresql://")
    err = tmp_path / "relay.err"
    receiver.stop()
    with open(err, "w") as stderr:
        service = subprocess.Popen(
            [sys.executable, "-m", "labs.relay"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=stderr, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        typed(["outbox", "start", "--thread", "gone", "--operation", "m-gone"], env)
        wait_until(lambda: "cannot reach the receiver" in err.read_text(), 60, "a failed round")
        receiver.start()
        wait_until(lambda: len(tickets(receiver)) == 1, 60, "the pending message delivered")
        if postgres:  # killed as a crash would, then back on the same port
            import psycopg  # the Postgres tier's

            cluster = request.getfixturevalue("postgres")
            with psycopg.connect(cluster.url, autocommit=True) as conn:  # the test cluster runs
                conn.execute("CHECKPOINT")  # with fsync off: what it committed reaches disk
            cluster.halt()
            wait_until(lambda: "reconnecting" in err.read_text(), 60, "the relay losing it")
            cluster.start_server()
        typed(["outbox", "start", "--thread", "up", "--operation", "m-up"], env)
        wait_until(lambda: len(tickets(receiver)) == 2, 60, "the next message delivered")
        service.send_signal(signal.SIGTERM)
        out, _ = service.communicate(timeout=30)
    finally:
        if service.poll() is None:
            service.kill()
    assert service.returncode == 0
    # (a restart may lose the relay's last mark, synchronous_commit=off in the test cluster:
    # then m-gone goes again, and the receiver's key answers it with the same ticket)
    answered = [e["message_id"] for e in events(out)]
    assert answered == ["m-gone", "m-up"] or (postgres and answered == ["m-gone", "m-gone", "m-up"])
    assert [t["key"] for t in tickets(receiver)] == ["m-gone", "m-up"]
    assert [m["state"] for m in shown(env)] == ["published", "published"]
    assert ("CHECKPOINT_DB is back after" in err.read_text()) is postgres
    # issue 49: without --once it said nothing until a message came; its first line says what
    assert err.read_text().splitlines()[0] == (
        "labs.relay: delivering the outbox every 0.05 s until Ctrl-C or SIGTERM "
        "(--once delivers what is pending, then exits)"
    )


# helpers


def typed(argv, env):
    done = run_workflow_here(argv, env)
    assert done.returncode == 0, done.stdout + done.stderr
    return events(done.stdout)


def lab_main(argv, env):
    from labs import cli as lab_py

    return lab_py.main(argv, env)


def forked(main, argv, env):
    """main(argv, env) in a forked child: (its exit code as a shell shows it, its stdout)."""
    read, write = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.dup2(write, 1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            code = main(list(argv), env)
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(write)
    with open(read) as out:
        printed = out.read()
    _, status = os.waitpid(pid, 0)
    return shell_exit_code(os.waitstatus_to_exitcode(status)), printed


def put(env, message_id, payload):
    """A message written into the outbox as the node writes it."""
    Path(env["CHECKPOINT_DB"]).parent.mkdir(parents=True, exist_ok=True)
    with relay.open_outbox(env["CHECKPOINT_DB"]) as outbox:
        outbox.put(message_id, "/tickets", payload)


def shown(env):
    """The outbox's rows, as `labs/relay.py --show` prints them."""
    code, out = forked(relay.main, ["--show"], env)
    assert code == 0, out
    return events(out)[0]["messages"]


def relayed(published, pending=0):
    return json.dumps({"event": "relayed", "pending": pending, "published": published})


def tickets(receiver):
    import workflow

    return workflow.TicketClient(receiver.url).tickets()


def posts(tmp_path):
    """The keys of the POSTs the receiver answered, from its log."""
    log = (tmp_path / "receiver.log").read_text()
    return re.findall(r"^receiver: (?:created|replayed) key=(\S+) ", log, re.M)


def replays(tmp_path):
    log = (tmp_path / "receiver.log").read_text()
    return re.findall(r"^receiver: replayed key=(\S+) ", log, re.M)
