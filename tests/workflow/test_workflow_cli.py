"""workflow.py's settings, mistakes and signals: one line and a distinct exit code, no traceback.

CLI behaviour that needs no signal runs in-process through workflow.main(argv); Ctrl-C and a
Python without langgraph run as subprocesses, as a learner meets them.
"""

import hashlib
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import checkpoints
import effects
import exitcodes
import failpoints
import hints
import providers
import workflow
from tools.local import (
    ROOT,
    ReceiverProcess,
    free_port,
    lab_env,
    run_worker_here,
    run_workflow_here,
    wait_until,
)


@pytest.fixture
def env(lab, monkeypatch):
    for name, value in lab.items():
        monkeypatch.setenv(name, value)
    return lab


def one_line(capsys, code, returned, *words):
    err = capsys.readouterr().err
    assert returned == code, err
    assert err.count("\n") == 1 and err.startswith("workflow.py: "), err
    assert all(word in err for word in words), err


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("API_URL", "127.0.0.1:8000", ["API_URL", "use a scheme, a host and a port"]),
        (
            "API_URL",
            "http://127.0.0.1:80000",
            ["'http://127.0.0.1:80000'", "not an address of the receiver"],
        ),
        (
            "API_URL",
            "http://127.0.0.1:8o00",
            ["'http://127.0.0.1:8o00'", "not an address of the receiver"],
        ),
        ("API_URL", "http://:8000", ["'http://:8000'", "not an address of the receiver"]),
        ("API_TIMEOUT_S", "five", ["API_TIMEOUT_S='five'", "positive float"]),
        ("API_TIMEOUT_S", "0", ["API_TIMEOUT_S='0'"]),
        ("API_ATTEMPTS", "1.5", ["API_ATTEMPTS='1.5'", "positive int"]),
        ("LEDGER_RECEIPT_UNKEYED", "yes", ["LEDGER_RECEIPT_UNKEYED='yes'", "refuse or accept"]),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(env, monkeypatch, capsys, name, value, words):
    monkeypatch.setenv(name, value)
    one_line(capsys, exitcodes.EXIT_USAGE, workflow.main(["tickets"]), *words)


def test_a_checkpoint_db_that_is_not_sqlite_is_one_line_and_left_alone(
    env, monkeypatch, capsys, tmp_path
):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 200)
    monkeypatch.setenv("CHECKPOINT_DB", str(notes))
    returned = workflow.main(["state", "--thread", "x"])
    one_line(capsys, exitcodes.EXIT_USAGE, returned, "CHECKPOINT_DB", "not a database")
    assert notes.read_text() == "not a database\n" * 200


def test_a_checkpoint_db_below_a_file_is_one_line(env, monkeypatch, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CHECKPOINT_DB", str(tmp_path / "file" / "checkpoints.sqlite"))
    one_line(capsys, exitcodes.EXIT_USAGE, workflow.main(["state"]), "CHECKPOINT_DB")


@pytest.mark.parametrize("args", [["state", "--thread", "x"], ["start"], ["resume"]])
def test_a_python_without_langgraph_is_told_which_python_to_use(lab, args):
    done = subprocess.run(  # -S: no site-packages, so no langgraph
        [sys.executable, "-S", str(ROOT / "workflow.py"), *args],
        env=lab,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exitcodes.EXIT_USAGE and done.stderr.count("\n") == 1, done.stderr
    assert "has no langgraph" in done.stderr and ".venv/bin/python" in done.stderr


def test_ctrl_c_mid_request_exits_130_and_names_the_thread_to_resume(tmp_path):
    with socket.socket() as silent:  # accepts the request and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = lab_env(tmp_path / "data", silent.getsockname()[1])
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "workflow.py"), "start", "--thread", "t-int"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        silent.settimeout(60)
        connection, _ = silent.accept()  # the request is on its way: the run is mid-node
        with connection:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
    assert proc.returncode == exitcodes.EXIT_INTERRUPTED, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "may have taken effect" in err and "resume --thread t-int" in err
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["prepare"]


def test_a_receiver_that_starts_late_is_waited_for_within_the_attempts(tmp_path):
    env = lab_env(tmp_path / "data", free_port(), API_ATTEMPTS="20")  # ~36 s of retries
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "workflow.py"), "post", "--operation", "late-1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    receiver = ReceiverProcess(env, tmp_path / "receiver.log").start()  # after the client
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        receiver.stop()
    assert proc.returncode == 0, err
    assert json.loads(out) == {"event": "post", "created": True, "ticket_id": 1}


def test_a_busy_receiver_is_asked_again_and_the_run_finishes(env, capsys, tmp_path):
    """503 (the store was locked; nothing committed) is retried with the same key."""
    receiver = ReceiverProcess(
        dict(env, RECEIVER_BUSY_TIMEOUT_S="0.2"), tmp_path / "receiver.log"
    ).start()
    holder = sqlite3.connect(env["RECEIVER_DB"], isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        log = tmp_path / "receiver.log"
        result = {}

        def release_after_first_503():
            wait_until(lambda: "unavailable" in log.read_text(), 30, "a 503")
            holder.execute("ROLLBACK")

        releaser = threading.Thread(target=release_after_first_503)
        releaser.start()
        result["code"] = workflow.main(["post", "--operation", "busy-1"])
        releaser.join(30)
    finally:
        holder.close()
        receiver.stop()
    out = capsys.readouterr().out
    assert result["code"] == 0
    assert json.loads(out) == {"event": "post", "created": True, "ticket_id": 1}


def test_ctrl_c_before_the_first_checkpoint_says_start_it_again(env, tmp_path):
    """Nothing saved yet: `resume` would find no thread, so the line says to start again."""
    args = workflow.build_parser().parse_args(["start", "--thread", "early"])
    settings = workflow.Settings.from_environ(env)
    hint = hints.interrupted_hint(args, settings)
    assert "has no checkpoint yet: start it again" in hint and "resume" not in hint


def test_approve_of_an_unknown_thread_says_no_such_thread_waits(env, capsys):
    from labs import cli as lab

    assert lab.main(["approve", "--thread", "ghost"], env) == exitcodes.EXIT_THREAD
    err = capsys.readouterr().err
    assert err == "labs: no thread 'ghost' waits for approval; check --thread\n"


def test_the_step_boundary_switch_refuses_a_postgres_checkpointer(env, capsys):
    from labs import cli as lab

    env = {**env, "CHECKPOINT_DB": "postgresql://127.0.0.1:1/none"}
    code = lab.main(["start", "--crash-at", "step-boundary"], env)
    err = capsys.readouterr().err
    assert code == exitcodes.EXIT_USAGE and err.count("\n") == 1, err
    assert "needs the SQLite checkpointer" in err and "unset CHECKPOINT_DB" in err


def test_ctrl_c_in_a_saga_names_saga_resume(env):
    from labs import cli as lab
    from labs import saga as saga_lesson

    args = lab.build_lab_parser().parse_args(["saga", "start", "--thread", "s"])
    settings = workflow.Settings.from_environ(env)
    with checkpoints.open_checkpointer(env["CHECKPOINT_DB"]) as saver:  # a saved saga thread
        saga_lesson.build_saga(saver).update_state(
            checkpoints.thread_config("s"), {"seats": 2}, "charge"
        )
    hint = hints.interrupted_hint(args, settings)
    assert hint.endswith(
        "; resume it with: python -m labs saga resume --thread s (Docker: docker compose -p "
        "stateful-lab run --rm workflow saga resume --thread s)"
    ), hint


@pytest.mark.parametrize("command", [["resume"], ["state"]])  # migrate: labs/cli.py (test_contract)
def test_a_thread_not_given_is_named_as_the_default(env, capsys, command):
    """`resume` alone looked up a thread 'demo' the learner never typed: the line says why."""
    returned = workflow.main(command)
    one_line(capsys, exitcodes.EXIT_THREAD, returned, "(no --thread given: 'demo' is its default)")
    assert workflow.main([*command, "--thread", "demo"]) == exitcodes.EXIT_THREAD
    assert "default" not in capsys.readouterr().err  # typed: no note


def foreign_files(tmp_path, receiver):
    """A receiver's SQLite file with a ticket in it, and another program's small database."""
    workflow.TicketClient(receiver.url).create("A ticket", "k-1")
    other = tmp_path / "notes.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.close()
    return [Path(receiver.env["RECEIVER_DB"]), other]


def snapshot(path):
    """The database file and its write-ahead log, byte for byte."""
    names = [path, Path(f"{path}-wal")]  # not -shm: an index every reader writes to
    return {str(p): p.read_bytes() for p in names if p.exists()}


@pytest.mark.parametrize("command", [["state", "--thread", "x"], ["start", "--thread", "x"]])
def test_a_checkpoint_db_holding_another_programs_tables_is_refused_untouched(
    env, receiver, capsys, tmp_path, command
):
    """The review's D: CHECKPOINT_DB naming the receiver's file, start exited 0 and wrote
    LangGraph's tables into it (and switched it to WAL)."""
    for path in foreign_files(tmp_path, receiver):
        before = snapshot(path)
        returned = workflow.main(command, {**env, "CHECKPOINT_DB": str(path)})
        one_line(capsys, exitcodes.EXIT_USAGE, returned, "not LangGraph's", "nothing was written")
        assert snapshot(path) == before
    assert workflow.TicketClient(receiver.url).tickets() == [
        {"ticket_id": 1, "key": "k-1", "payload": {"title": "A ticket"}}
    ]  # start sent nothing


@pytest.mark.parametrize(
    "pragma, words",
    [("query_only = 1", "readonly database"), ("max_page_count = {pages}", "full")],
)
def test_a_read_only_or_full_checkpoint_db_has_its_own_exit_and_names_the_resume(
    env, receiver, capsys, monkeypatch, pragma, words
):
    """Real SQLite refusals on the saver's own connection (a root test process can make no file
    read-only, nor a disk full): read-only, or no page left to grow by (512-byte pages, so the
    resume's checkpoint needs new ones). The resume's checkpoint is refused after its ticket."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    Path(env["CHECKPOINT_DB"]).parent.mkdir(parents=True)
    with sqlite3.connect(env["CHECKPOINT_DB"]) as conn:
        conn.execute("PRAGMA page_size = 512")
        conn.execute("VACUUM")  # an empty database, written with that page size
    conn.close()
    drained = workflow.main(["start", "--thread", "t"], {**env, "FAILPOINTS": "after-prepare=term"})
    assert drained == exitcodes.EXIT_DRAINED
    capsys.readouterr()
    setup = SqliteSaver.setup

    def unwritable_after_setup(self):
        setup(self)
        pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA {pragma.format(pages=pages)}")

    with monkeypatch.context() as patch:
        patch.setattr(SqliteSaver, "setup", unwritable_after_setup)
        returned = workflow.main(["resume", "--thread", "t"])
    assert returned == exitcodes.EXIT_CHECKPOINT_WRITE != exitcodes.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert "may have taken effect" in err and err.endswith(
        "; once CHECKPOINT_DB can be written, resume it with: python workflow.py resume "
        "--thread t\n"
    )
    assert workflow.main(["resume", "--thread", "t"]) == 0
    assert [t["ticket_id"] for t in workflow.TicketClient(receiver.url).tickets()] == [1]


def test_the_busy_budget_outlasts_the_review_s_10_s_lock_by_more_than_the_lock():
    import receiverdb  # the receiver's wait for a locked database, before its 503

    tries = providers.ATTEMPTS * providers.BUSY_TRIES_PER_ATTEMPT
    delays = providers.retry_delays()
    waited = sum(next(delays) for _ in range(tries - 1)) + tries * receiverdb.BUSY_TIMEOUT_S
    assert waited > 2 * 10.0, waited


def test_a_receiver_busy_past_every_try_names_the_resume_that_goes_on(env, capsys, tmp_path):
    """A write lock held by another program for the whole run: the 503s run out (API_ATTEMPTS=1:
    two tries), the line says nothing was committed and names the resume; released, it works."""
    receiver = ReceiverProcess(
        dict(env, RECEIVER_BUSY_TIMEOUT_S="0.2"), tmp_path / "receiver.log"
    ).start()
    holder = sqlite3.connect(env["RECEIVER_DB"], isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        returned = workflow.main(["start", "--thread", "b"], {**env, "API_ATTEMPTS": "1"})
        out, err = capsys.readouterr()
        holder.execute("ROLLBACK")
        resumed = workflow.main(["resume", "--thread", "b"])
    finally:
        holder.close()
        receiver.stop()
    assert returned == exitcodes.EXIT_HTTP_ERROR
    assert json.loads(out.splitlines()[-1])["status"] == 503
    assert err == (
        "workflow.py: the receiver stayed busy (503) for 2 tries; nothing was committed; "
        "the run is saved: once the receiver can write, python workflow.py resume --thread b\n"
    )
    assert resumed == 0 and json.loads(capsys.readouterr().out.splitlines()[-1])["ticket_id"] == 1


def test_a_ctrl_c_that_strands_a_thread_still_exits_130_at_once(tmp_path):
    """A KeyboardInterrupt inside ThreadPoolExecutor._adjust_thread_count (LangGraph's saves run
    on one) can leave a worker thread that the interpreter's exit joins forever: python
    workflow.py's exit (commandline.run_script) ends the process itself then. The stranded thread
    is made here as CPython leaves it: non-daemon, waiting for work that never comes."""
    script = (
        "import threading, commandline\n"
        "def main():\n"
        "    threading.Thread(target=threading.Event().wait, name='stranded').start()\n"
        "    raise KeyboardInterrupt\n"
        "commandline.run_script(main, 'workflow.py')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr, done.stdout) == (130, "workflow.py: interrupted\n", "")


@pytest.mark.parametrize("script", [["workflow.py"], ["-m", "labs"]], ids=["workflow", "labs"])
def test_ctrl_c_while_python_imports_the_script_is_one_line(lab, script):
    """SIGINT as soon as -X importtime reports one of the script's own imports done (effects,
    which both import before workflow's): it lands in the script's own imports or, on a slow
    machine, later in main(); one line either way."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", *script, "state", "--thread", "x"],
        env=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for line in proc.stderr:  # the import times, one line as each module is done
        seen.append(line)
        if line.split("|")[-1].strip() == "effects":  # nested under labs when run as -m labs
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=60)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == exitcodes.EXIT_INTERRUPTED, "".join(seen) + err
    name = script[0] if script[0] != "-m" else script[1]  # the program's name in its lines
    assert said == [f"{name}: interrupted"] and out == "", said


@pytest.mark.fast
def test_an_api_url_naming_another_server_is_one_line_naming_api_url(env, monkeypatch, capsys):
    """A wrong port where another HTTP server listens: its HTML error page came as http_error
    and nothing on stderr. The receiver answers every error in JSON, so a body that is not JSON
    is another server's: one line names API_URL, and a run saved by then is named to resume."""
    import http.server

    class Other(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_):  # its own log is not the line under test
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("API_URL", f"http://127.0.0.1:{server.server_port}")
        returned = workflow.main(["tickets"])
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == 501
        capsys.readouterr()
        code = workflow.main(["start", "--thread", "w"])
    finally:
        server.shutdown()
        server.server_close()
    assert returned == exitcodes.EXIT_HTTP_ERROR
    out, err = capsys.readouterr()
    assert code == exitcodes.EXIT_HTTP_ERROR and err.count("\n") == 1, err
    assert "without the receiver's JSON: API_URL (its port) names another program" in err, err
    assert err.endswith(
        "the run is saved: once API_URL names the receiver, python workflow.py resume --thread w\n"
    )


# --- the ledger's own failures: one line and a documented exit code (REVIEW A8, A10) --------


def test_a_title_that_is_not_utf8_is_refused_before_anything_runs(lab, tmp_path):
    """`labs/cli.py start --title $'bad\\xff'`: a UnicodeEncodeError traceback in request_hash. The
    argument's bytes, as a shell passes them: one line, exit 2, no checkpoint file made."""
    title = b"bad\xff"
    done = subprocess.run(
        [sys.executable, "-m", "labs", "start", "--thread", "u", "--title", title],
        env=lab,
        capture_output=True,
        timeout=60,
    )
    err = done.stderr.decode()
    assert done.returncode == exitcodes.EXIT_USAGE and err.count("\n") == 1, err
    assert err.startswith("labs: --title b'bad\\xff' is not UTF-8 text"), err
    assert done.stdout == b"" and not Path(lab["CHECKPOINT_DB"]).exists()
    # labs/workers.py's submit alike (in-process: the str a shell's bytes become), before any
    # database
    submit = [
        "submit",
        "--thread",
        "u",
        "--operation",
        "u:op",
        "--title",
        title.decode(errors="surrogateescape"),
    ]
    done = run_worker_here(submit, dict(lab, CHECKPOINT_DB="postgresql://127.0.0.1:1/none"))
    assert done.returncode == exitcodes.EXIT_USAGE, done.stderr
    assert done.stderr == "labs.workers: --title b'bad\\xff' is not UTF-8 text; nothing was run\n"


def test_request_hash_refuses_text_that_is_not_utf8_in_one_line():
    with pytest.raises(effects.NotText, match=r"not UTF-8 text \(b'\\xff'\)"):
        effects.request_hash({"title": "bad\udcff"})
    assert effects.request_hash({"title": "été"})[0] == '{"title":"été"}'  # as before


def drained_before_its_ticket(env, thread, operation):
    """A thread stopped after prepare (SIGTERM, drained): resume runs create_ticket."""
    args = ["start", "--thread", thread, "--operation", operation]
    assert workflow.main(args, {**env, "FAILPOINTS": "after-prepare=term"}) == 75


def confirmed_by_hand(env, key, receipt=None):
    """A confirmed ledger row for key written outside the program, with receipt's fields (a
    ticket id and a plain sha256 recomputed as a forger would) or no receipt at all."""
    title = {"title": "Check supplier configuration"}
    canonical, digest = effects.request_hash(title)
    with effects.Ledger(env["CHECKPOINT_DB"]) as ledger:  # the tables, as the program makes them
        ledger.get(key)
    conn = sqlite3.connect(env["CHECKPOINT_DB"], isolation_level=None)
    conn.execute(
        "INSERT INTO effects (key, effect, request, request_hash, state, updated_at) "
        "VALUES (?, 'ticket', ?, ?, 'confirmed', 0)",
        (key, canonical, digest),
    )
    if receipt is not None:
        answer = json.dumps({"created": True, "ticket_id": receipt}, separators=(",", ":"))
        fields = [key, "ticket", digest, str(receipt), answer]
        plain = hashlib.sha256(json.dumps(fields, separators=(",", ":")).encode()).hexdigest()
        conn.execute(
            "INSERT INTO effect_receipts VALUES (?, ?, ?, ?, ?, 0)",
            (key, str(receipt), answer, digest, plain),
        )
    conn.close()


def test_a_confirmed_row_without_its_receipt_is_one_line_and_exit_7(env, receiver, capsys):
    """A hand-edited ledger: confirmed, and its receipt row gone (a TypeError traceback)."""
    drained_before_its_ticket(env, "gone", "k-gone")
    confirmed_by_hand(env, "k-gone")
    capsys.readouterr()
    returned = workflow.main(["resume", "--thread", "gone"])
    one_line(capsys, exitcodes.EXIT_LEDGER_DAMAGED, returned, "'k-gone' is confirmed and its")
    assert workflow.TicketClient(receiver.url).tickets() == []  # nothing was sent


def test_a_forged_receipt_is_refused_under_a_receipt_key_and_a_real_one_is_read(
    env, receiver, capsys
):
    """The review's A8: a forged receipt (ticket 999) with its plain sha256 recomputed was
    accepted. Under LEDGER_RECEIPT_KEY it is refused (exit 7, one line); a receipt written
    under the key is read; one written before it, only with LEDGER_RECEIPT_UNKEYED=accept."""
    keyed = {**env, "LEDGER_RECEIPT_KEY": "a secret of the deployment"}
    drained_before_its_ticket(env, "forged", "k-forged")
    confirmed_by_hand(env, "k-forged", receipt=999)
    capsys.readouterr()
    returned = workflow.main(["resume", "--thread", "forged"], keyed)
    one_line(capsys, exitcodes.EXIT_LEDGER_DAMAGED, returned, "'k-forged'", "LEDGER_RECEIPT_KEY")
    # Without a key the plain sha256 is all there is: the forgery is read (what the docs say).
    assert workflow.main(["resume", "--thread", "forged"], env) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["ticket_id"] == 999

    assert workflow.main(["start", "--thread", "a", "--operation", "k-real"], keyed) == 0
    capsys.readouterr()
    again = ["start", "--thread", "b", "--operation", "k-real"]  # the same key: its receipt
    assert workflow.main(again, keyed) == 0
    assert '"event": "effect_receipt"' in capsys.readouterr().out
    unset = ["start", "--thread", "c", "--operation", "k-real"]  # a keyed receipt, no key here
    returned = workflow.main(unset, env)
    one_line(capsys, exitcodes.EXIT_LEDGER_DAMAGED, returned, "LEDGER_RECEIPT_KEY, which is not")

    assert workflow.main(["start", "--thread", "d", "--operation", "k-old"], env) == 0
    old = ["start", "--thread", "e", "--operation", "k-old"]
    assert workflow.main(old, keyed) == exitcodes.EXIT_LEDGER_DAMAGED
    capsys.readouterr()
    accepted = {**keyed, "LEDGER_RECEIPT_UNKEYED": "accept"}
    assert workflow.main(["resume", "--thread", "e"], accepted) == 0
    assert '"event": "effect_receipt"' in capsys.readouterr().out
    assert [t["key"] for t in workflow.TicketClient(receiver.url).tickets()] == ["k-real", "k-old"]


def chattr(flag, *paths):
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)


def test_a_ledger_made_unwritable_while_the_request_is_out_exits_74_and_names_the_resume(
    lab, receiver, tmp_path
):
    """The review's F11: the checkpoint file and its WAL made immutable (chattr +i) while the
    request is out. The receipt's commit fails with SQLITE_IOERR_WRITE (exit 2 "disk I/O error"
    before): exit 74 and the resume line; writable again, the resume adopts the ticket."""
    pause = tmp_path / "after-send"
    env = {**lab, "FAILPOINTS": f"after-send=pause({pause})"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "labs", "start", "--thread", "ro", "--mode", "ledger"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    db = Path(lab["CHECKPOINT_DB"])
    files = [db, Path(f"{db}-wal")]  # not -shm: SQLite maps it, and SIGBUS is not the case
    try:
        wait_until(pause.exists, 60, "the run at after-send")
        made = chattr("+i", *files)
        if made.returncode != 0:
            proc.kill()
            pytest.skip(f"chattr +i is not possible here (root on ext4 needed): {made.stderr}")
        failpoints.unpause(pause)
        out, err = proc.communicate(timeout=60)
    finally:
        chattr("-i", *files)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.EXIT_CHECKPOINT_WRITE, err
    assert err.count("\n") == 1 and "disk I/O error" in err, err
    assert err.endswith(
        "may have taken effect before the save failed; once CHECKPOINT_DB can be written "
        f"(read-only now: {db}, {db}-wal), "  # the files chattr made immutable
        "resume it with: python -m labs resume --thread ro (Docker: docker compose -p "
        "stateful-lab run --rm workflow resume --thread ro)\n"
    ), err
    resumed = run_workflow_here(["resume", "--thread", "ro"], lab)  # lab.main, in-process
    assert resumed.returncode == 0, resumed.stderr
    assert '"event": "effect_adopted"' in resumed.stdout
    assert len(workflow.TicketClient(receiver.url).tickets()) == 1


def test_a_crash_command_forked_prints_and_dies_as_the_process_a_learner_starts(receiver, lab):
    """The tests' crash commands run in a fork of the test process (LangGraph already imported):
    the same lines on stdout, the same SIGKILL, the same ticket as `python -m labs ...`."""
    from tools.local import run_workflow, run_workflow_forked

    start = ["start", "--mode", "naive", "--crash", "--title"]
    forked = run_workflow_forked([*start, "forked", "--thread", "f", "--operation", "f"], lab)
    fresh = run_workflow([*start, "fresh", "--thread", "n", "--operation", "n"], lab)
    assert forked.returncode == fresh.returncode == -9, (forked.stderr, fresh.stderr)
    assert [json.loads(line)["event"] for line in forked.stdout.splitlines()] == [
        json.loads(line)["event"] for line in fresh.stdout.splitlines()
    ]
    assert forked.stderr == fresh.stderr == ""
    titles = [t["payload"]["title"] for t in workflow.TicketClient(receiver.url).tickets()]
    assert sorted(titles) == ["forked", "fresh"]  # each crash run made its ticket, then died


@pytest.mark.fast
def test_a_forked_command_that_hangs_is_killed_at_its_timeout(lab, tmp_path):
    from tools.local import run_workflow_forked

    held = tmp_path / "held"  # a pause that nothing releases
    env = {**lab, "FAILPOINTS": f"after-prepare=pause({held})"}
    with pytest.raises(subprocess.TimeoutExpired):
        run_workflow_forked(["start", "--crash", "--thread", "h"], env, timeout=1)


@pytest.mark.fast
@pytest.mark.parametrize(
    "script",
    [["-m", "labs"], ["workflow.py"], ["-m", "labs.workers"], ["-m", "labs.relay"]],
    ids=["labs", "workflow", "workers", "relay"],
)
def test_help_says_what_the_program_is_in_whole_sentences(script):
    """Issue 49: labs/cli.py --help cut its description mid-sentence ("... as long as the")."""
    shown = subprocess.run(
        [sys.executable, *script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    description = " ".join(shown.stdout.split("\n\n")[1].split())
    assert description.endswith((".", ".)")), description
