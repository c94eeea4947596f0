"""workflow.py's settings, mistakes and signals: one line and a distinct exit code, no traceback.

CLI behaviour that needs no signal runs in-process through workflow.main(argv); Ctrl-C and a
Python without langgraph run as subprocesses, as a learner meets them.
"""

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import threading

import pytest

import workflow
from labs.tools.local import ROOT, ReceiverProcess, free_port, lab_env, wait_until


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
        ("API_URL", "http://127.0.0.1:80000", ["'http://127.0.0.1:80000'", "not a receiver"]),
        ("API_URL", "http://127.0.0.1:8o00", ["'http://127.0.0.1:8o00'", "not a receiver"]),
        ("API_URL", "http://:8000", ["'http://:8000'", "not a receiver"]),
        ("API_TIMEOUT_S", "five", ["API_TIMEOUT_S='five'", "positive float"]),
        ("API_TIMEOUT_S", "0", ["API_TIMEOUT_S='0'"]),
        ("API_ATTEMPTS", "1.5", ["API_ATTEMPTS='1.5'", "positive int"]),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(env, monkeypatch, capsys, name, value, words):
    monkeypatch.setenv(name, value)
    one_line(capsys, workflow.EXIT_USAGE, workflow.main(["tickets"]), *words)


def test_a_checkpoint_db_that_is_not_sqlite_is_one_line_and_left_alone(
    env, monkeypatch, capsys, tmp_path
):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 200)
    monkeypatch.setenv("CHECKPOINT_DB", str(notes))
    returned = workflow.main(["state", "--thread", "x"])
    one_line(capsys, workflow.EXIT_USAGE, returned, "CHECKPOINT_DB", "not a database")
    assert notes.read_text() == "not a database\n" * 200


def test_a_checkpoint_db_below_a_file_is_one_line(env, monkeypatch, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CHECKPOINT_DB", str(tmp_path / "file" / "checkpoints.sqlite"))
    one_line(capsys, workflow.EXIT_USAGE, workflow.main(["state"]), "CHECKPOINT_DB")


@pytest.mark.parametrize("args", [["state", "--thread", "x"], ["start"], ["resume"]])
def test_a_python_without_langgraph_is_told_which_python_to_use(lab, args):
    done = subprocess.run(  # -S: no site-packages, so no langgraph
        [sys.executable, "-S", str(ROOT / "workflow.py"), *args],
        env=lab,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == workflow.EXIT_USAGE and done.stderr.count("\n") == 1, done.stderr
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
    assert proc.returncode == workflow.EXIT_INTERRUPTED, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "may have taken effect" in err and "resume --thread t-int" in err
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["prepare"]


def test_a_receiver_that_starts_late_is_waited_for_within_the_attempts(tmp_path):
    env = lab_env(tmp_path / "data", free_port(), API_ATTEMPTS="8")  # ~32 s of retries
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
    hint = workflow.interrupted_hint(args, settings)
    assert "has no checkpoint yet: start it again" in hint and "resume" not in hint


def test_approve_of_an_unknown_thread_says_no_such_thread_waits(env, capsys):
    import lab

    assert lab.main(["approve", "--thread", "ghost"], env) == workflow.EXIT_THREAD
    err = capsys.readouterr().err
    assert err == "lab.py: no thread 'ghost' waits for approval; check --thread\n"


def test_the_step_boundary_switch_refuses_a_postgres_checkpointer(env, capsys):
    import lab

    env = {**env, "CHECKPOINT_DB": "postgresql://127.0.0.1:1/none"}
    code = lab.main(["start", "--crash-at", "step-boundary"], env)
    err = capsys.readouterr().err
    assert code == workflow.EXIT_USAGE and err.count("\n") == 1, err
    assert "needs the SQLite checkpointer" in err and "unset CHECKPOINT_DB" in err
