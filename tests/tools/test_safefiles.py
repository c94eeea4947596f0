"""The files the lab's tools write (tools/safefiles.py): a receiver's log, the workers' log
and pid files. A link, dangling or not, or a FIFO where one goes is refused at once, and what a
link points to is left as it was (REVIEW part B: the tools wrote through links, and a FIFO hung
them)."""

import os
import subprocess
import sys

import pytest

from tools import safefiles
from tools.local import ROOT, ReceiverProcess, free_port, lab_env


def special(tmp_path, name, kind):
    """A link to a file (its text kept), a dangling link, or a FIFO at tmp_path / name."""
    path, target = tmp_path / name, tmp_path / "someone-else.txt"
    if kind == "link":
        target.write_text("not ours", encoding="utf-8")
        path.symlink_to(target)
    elif kind == "dangling link":
        path.symlink_to(target)
    else:
        os.mkfifo(path)
    return path, target


def untouched(kind, target):
    if kind == "link":
        return target.read_text(encoding="utf-8") == "not ours"
    return not target.exists()


KINDS = {"link": "a symbolic link", "dangling link": "a symbolic link", "FIFO": "a FIFO"}


@pytest.mark.fast
@pytest.mark.parametrize("kind", KINDS)
def test_a_receivers_log_that_is_a_link_or_a_fifo_is_refused_before_it_starts(tmp_path, kind):
    log, target = special(tmp_path, "receiver.log", kind)
    receiver = ReceiverProcess(lab_env(tmp_path / "data", free_port()), log)
    try:
        with pytest.raises(safefiles.NotAFile, match=f"is {KINDS[kind]}, not a file"):
            receiver.start()
    finally:
        receiver.stop()  # a receiver a regression started is not left running
    assert receiver.proc is None and untouched(kind, target)


@pytest.mark.fast
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["workers.log", "workers/worker-1.pid"])
def test_the_workers_log_or_pid_file_as_a_link_or_a_fifo_is_one_line_and_exit_2(
    tmp_path, kind, name
):
    (tmp_path / "workers").mkdir()
    path, target = special(tmp_path, name, kind)
    done = subprocess.run(
        [sys.executable, "-m", "tools.native_workers", "--data", str(tmp_path), "up", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == f"workers: {path} is {KINDS[kind]}, not a file: not writing to it; " \
        "remove it or name another\n"  # fmt: skip
    assert untouched(kind, target)
    if name == "workers.log":  # no worker started, so none named
        assert not (tmp_path / "workers" / "worker-1.pid").exists()


@pytest.mark.fast
def test_a_whole_file_is_written_beside_and_renamed_and_a_log_appends(tmp_path):
    path = tmp_path / "picture.svg"
    safefiles.write_beside(path, "<svg/>\n")
    safefiles.write_beside(path, "<svg>2</svg>\n")
    assert path.read_text(encoding="utf-8") == "<svg>2</svg>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["picture.svg"]  # no temporary left
    with safefiles.open_log(tmp_path / "a.log") as log:
        log.write(b"one\n")
    with safefiles.open_log(tmp_path / "a.log") as log:
        log.write(b"two\n")
    assert (tmp_path / "a.log").read_bytes() == b"one\ntwo\n"
