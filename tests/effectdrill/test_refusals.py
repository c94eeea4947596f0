"""What the drill refuses before it writes, and names it makes safe (issue 43): a link or a
FIFO at --html, another program's SQLite file at --checkpoint-db, names a terminal or a page
could choke on. Each refusal is one line and exit 2; the file refused is left as it was."""

import hashlib
import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

from tools.local import ROOT

GRAPHS = "effectdrill_graphs"
DRILL = [sys.executable, "-m", "effectdrill", f"{GRAPHS}.orders:build"]
DRILL += ["--input", '{"item": "x", "order": "{thread}"}']
DRILL += ["--observe", f"{GRAPHS}.orders:observe"]


@pytest.fixture
def env(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return os.environ | {
        "ORDERS_DB": str(tmp_path / "orders.sqlite"),
        "EFFECTS_DB": str(tmp_path / "effects.sqlite"),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        "TMPDIR": str(tmp),
    }


def drill(argv, env):
    """The CLI in its own process: a FIFO opened for reading would hang it (a timeout, not a
    stuck test session)."""
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, timeout=120)


def assert_one_line_2(done, words):
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("effectdrill: ") and words in err, err


def test_a_fifo_at_html_is_refused_at_once(tmp_path, env):
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    done = drill([*DRILL, "--html", str(fifo)], env)
    assert_one_line_2(done, "is not a regular file (a FIFO, a device)")


@pytest.mark.parametrize("target", ["a report", "dangling"])
def test_a_link_at_html_is_never_written_through(tmp_path, env, target):
    elsewhere = tmp_path / "elsewhere.html"
    if target == "a report":  # a link to an earlier report: still not ours to follow
        elsewhere.write_text("<!-- effectdrill report -->\nold\n")
    link = tmp_path / "report.html"
    link.symlink_to(elsewhere)
    done = drill([*DRILL, "--html", str(link)], env)
    assert_one_line_2(done, "is a symbolic link")
    assert link.is_symlink()
    assert elsewhere.exists() == (target == "a report")
    if target == "a report":
        assert elsewhere.read_text() == "<!-- effectdrill report -->\nold\n"


def test_another_programs_sqlite_file_is_refused_before_a_byte_is_written(tmp_path, env):
    shop = tmp_path / "shop.sqlite"
    with closing(sqlite3.connect(shop)) as db, db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO customers (name) VALUES ('Ada')")
    before = hashlib.sha256(shop.read_bytes()).hexdigest()
    done = drill([*DRILL, "--checkpoint-db", str(shop)], env)
    assert_one_line_2(done, "holds tables that are not LangGraph's checkpoints (customers)")
    assert hashlib.sha256(shop.read_bytes()).hexdigest() == before
    assert sorted(os.listdir(tmp_path)) == sorted(["shop.sqlite", "tmp"])  # no -wal, no -shm


def test_a_link_or_a_fifo_at_checkpoint_db_is_refused(tmp_path, env):
    fifo = tmp_path / "c.sqlite"
    os.mkfifo(fifo)
    assert_one_line_2(drill([*DRILL, "--checkpoint-db", str(fifo)], env), "not a regular file")
    link = tmp_path / "l.sqlite"
    link.symlink_to(tmp_path / "real.sqlite")
    assert_one_line_2(drill([*DRILL, "--checkpoint-db", str(link)], env), "symbolic link")
    assert not (tmp_path / "real.sqlite").exists()


def test_names_the_terminal_and_the_page_cannot_take_are_made_safe(tmp_path, env):
    """A non-UTF-8 --http-ignore (bytes, as a shell passes them) and an effect named with an
    undecodable byte and an escape sequence: the drill ends with its report, names shown with
    U+FFFD and escapes, nothing raw reaches the terminal or the page."""
    report = tmp_path / "report.html"
    argv = [sys.executable, "-m", "effectdrill", f"{GRAPHS}.oddnames:build"]
    argv += ["--input", '{"thread": "{thread}"}', "--observe", f"{GRAPHS}.oddnames:observe"]
    argv += [b"--http-ignore", b"caf\xe9:*", "--html", str(report)]
    done = drill(argv, env)
    out, err = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")  # strict: valid UTF-8
    assert done.returncode == 1, err  # send's effect repeats: a finding, not a crash
    assert "UnicodeEncodeError" not in err and "Traceback" not in err
    assert "caf\ufffd\\x1b[2J" in out and "\x1b" not in out and "\x07" not in out
    assert "send\\x07" in out
    page = report.read_text(encoding="utf-8")
    assert "caf\ufffd\\x1b[2J" in page and "\x1b" not in page and "caf\ufffd:*" in page
