"""Files the lab's tools write: never through a symbolic link, never to a FIFO or a device, never
into the lab's own source unless that is the point.

A path that exists and is not a regular file is refused (NotAFile, one line for the user): a
symbolic link would send the write elsewhere (a dangling one creates its target), a FIFO would
hang the writer until a reader comes, a device is not ours. A whole file is written beside its
place and renamed onto it (write_beside), so a reader never sees half of it and a link put
there meanwhile is replaced, not followed; a log is opened for appending with O_NOFOLLOW and
O_NONBLOCK, then checked as a regular file (open_log).
"""

import errno
import os
import stat
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this repository
DATA = ROOT / "data"  # the lab's own data folder (ignored by git): the tools' default place
KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


class NotAFile(Exception):
    """A path the tools will not write to: the message says why, in one line."""


def refuse_special(path):
    """NotAFile unless path is absent or a regular file (a link is not followed to find out)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise NotAFile(f"{path}: a part of it before the name is a file, not a folder") from None
    if not stat.S_ISREG(mode):
        kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise NotAFile(
            f"{path} is {kind}, not a file: not writing to it; remove it or name another"
        )


def refuse_source(path, what):
    """NotAFile if path is inside this repository but not under its data/ folder."""
    real = Path(os.path.realpath(path))
    if real.is_relative_to(ROOT) and not real.is_relative_to(DATA):
        raise NotAFile(
            f"{what} {path} is inside the lab's own source ({ROOT}); name a folder outside it, "
            "or under its data/"
        )


def read_regular(path):
    """The text of path if it is a regular file, else None (absent); NotAFile for a link, a
    FIFO (opened without blocking, so a FIFO never hangs the reader) or a device."""
    refuse_special(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise NotAFile(f"{path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):  # swapped in since the lstat
            raise NotAFile(f"{path} is not a regular file: not reading it")
        return file.read().decode("utf-8", errors="replace")


def write_beside(path, text):
    """Write text (UTF-8) to path: into a new file beside it, then renamed onto it."""
    path = Path(path)
    refuse_special(path)
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    except OSError as error:
        raise NotAFile(f"{path.parent}: {error.strerror}; cannot write {path.name} there") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def open_log(path):
    """path opened for appending (binary), created if absent; NotAFile for anything but a
    regular file: a link (O_NOFOLLOW), a FIFO (O_NONBLOCK: no wait for a reader), a device."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO without a reader
            refuse_special(path)
        raise NotAFile(f"{path}: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        refuse_special(path)
        raise NotAFile(f"{path} is not a regular file: not writing to it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")
