"""api.py, the core receiver the starter takes, and labs/receiver.py, the lab's receiver built on
it by subclassing: the arrows go one way, and each serves only its own routes and its own files."""

import ast
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest
from receiver_helpers import TITLE, assert_error, post, request, tickets

from tools.local import ROOT, ReceiverProcess

CORE = ROOT / "api.py"
RECEIVER_CORE = {  # the core files the receiver stands on, each standard library only
    "failpoints",
    "httpguard",
    "keyretention",
    "receiverdb",
    "receivermetrics",
    "receiversettings",
    "tracing",
}


def imported(path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.fast
def test_the_core_receiver_imports_the_standard_library_and_its_core_helpers_only():
    assert imported(CORE) - set(sys.stdlib_module_names) == RECEIVER_CORE
    for helper in RECEIVER_CORE - {"tracing"}:  # tracing: below
        assert imported(ROOT / f"{helper}.py") - set(sys.stdlib_module_names) <= RECEIVER_CORE
    assert "api" in imported(
        ROOT / "labs/receiver.py"
    )  # the lab's extends the core, not the reverse
    # tracing.py imports OpenTelemetry in its functions, once TRACE is set: not at import
    module = ast.parse((ROOT / "tracing.py").read_text(encoding="utf-8")).body
    on_import = {a.name for n in module if isinstance(n, ast.Import) for a in n.names}
    on_import |= {n.module.split(".")[0] for n in module if isinstance(n, ast.ImportFrom)}
    assert on_import - set(sys.stdlib_module_names) == set() and on_import


def run_core(env):
    done = subprocess.run(
        [sys.executable, str(CORE)], env=env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stderr


def test_the_core_serves_tickets_only_and_the_labs_receiver_takes_its_file_over(lab, tmp_path):
    core = ReceiverProcess(lab, tmp_path / "core.log", script=CORE).start()
    try:
        assert post(core, key="k-1").status == 201
        assert post(core, key="k-1").status == 200  # the same key and body: a replay
        assert [t["key"] for t in tickets(core, "k-1")] == ["k-1"]
        refused = request(core, "POST", "/refunds", {"ticket_id": 1})
        assert_error(refused, 404, "no such path '/refunds'", "/health, /tickets, /metrics")
        counters = request(core, "GET", "/metrics").body.decode()
        assert "receiver_tickets_created_total 1" in counters
        assert "refunds" not in counters and "messages" not in counters
    finally:
        core.stop()
    lab_receiver = ReceiverProcess(
        lab, tmp_path / "api.log"
    ).start()  # labs/receiver.py, the same file
    try:
        assert post(lab_receiver, key="k-1").json() == {"ticket_id": 1, "created": False}
        assert request(lab_receiver, "GET", "/refunds").json() == {"refunds": []}
    finally:
        lab_receiver.stop()
    # labs/receiver.py has added its tables: the core cannot serve them, and says so before writing.
    code, stderr = run_core(lab)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "not the receiver's (messages, payments, progress_requests, refunds, " in stderr, stderr


def test_an_older_labs_tickets_file_is_upgraded_by_api_py_and_refused_by_the_core(lab, tmp_path):
    """A tickets table from before created_at was kept: labs/receiver.py adds the column and
    honours its keys; the core receiver knows no older file, and leaves it as it is."""
    path = tmp_path / "older.sqlite"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TABLE tickets (id INTEGER PRIMARY KEY, operation_key TEXT UNIQUE, "
            "payload TEXT NOT NULL)"
        )
        db.execute("INSERT INTO tickets VALUES (1, 'old-1', ?)", (f'{{"title":"{TITLE}"}}',))
    env = dict(lab, RECEIVER_DB=str(path))
    before = path.read_bytes()
    code, stderr = run_core(env)
    assert code == 2 and "its tickets table is not the receiver's" in stderr, stderr
    assert path.read_bytes() == before

    server = ReceiverProcess(env, tmp_path / "api.log").start()
    try:
        assert post(server, key="old-1").json() == {"ticket_id": 1, "created": False}
        assert post(server, key="new-1").json() == {"ticket_id": 2, "created": True}
    finally:
        server.stop()
    with closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(tickets)")]
    assert columns == ["id", "operation_key", "payload", "created_at"]
