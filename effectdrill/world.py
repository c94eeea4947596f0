"""The world the snapshot engine restores: what a resume can touch outside the checkpoints (the
effects' SQLite files, the observer's, a ledger's), declared by the user. See README.md, "Two
engines".

A world is any object with `snapshot()` (returns something picklable: the world as it is now)
and `restore(image)` (puts the world back as it was at that snapshot). SqliteWorld is one for
SQLite files, read through SQLite's own API (serialize), never copied raw: a file in WAL
mode keeps committed pages in its -wal file, which a raw copy can miss. An image goes back
through the backup API, or, where no file is there yet, as the new file's bytes."""

import fcntl
import os
import sqlite3
from contextlib import closing, contextmanager

from effectdrill.errors import DrillError

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


class SqliteWorld:
    """SQLite files (or every SQLite file in a folder) as the world.

    `paths`: files or folders, fixed. `env`: names of environment variables that hold a SQLite
    file's path, as the graph and the observer read it at each call (os.environ["ORDERS_DB"]):
    its whole folder is the world (a ledger beside it too), and a resumer can be given a copy of
    its own (relocate), so that two resumes run side by side. A world of fixed paths is
    restored in place, one resume at a time."""

    def __init__(self, *paths, env=()):
        self.paths = [os.fspath(p) for p in paths]
        self.env = (env,) if isinstance(env, str) else tuple(env)

    @property
    def relocatable(self):
        return bool(self.env) and not self.paths

    def folders(self):
        """{name: folder}: each env variable's file's folder, each fixed folder."""
        found = {}
        for name in self.env:
            value = os.environ.get(name)
            if not value:
                raise DrillError(f"the world names ${name}, which is not set")
            path = os.path.abspath(value)  # a file's path (its folder), or a folder's
            found[f"${name}"] = path if os.path.isdir(path) else os.path.dirname(path)
        return found

    def files(self):
        """{key: path} of every SQLite file of the world now (a file not made yet is absent)."""
        files = {}
        for key, folder in self.folders().items():
            for name in sqlite_files(folder):
                files[f"{key}/{name}"] = os.path.join(folder, name)
        for path in self.paths:
            if os.path.isdir(path):
                for name in sqlite_files(path):
                    files[os.path.join(path, name)] = os.path.join(path, name)
            else:
                files[path] = path
        return files

    def snapshot(self):
        """{key: the file's pages (serialize), or None when it does not exist}."""
        return {key: image_of(path) for key, path in self.files().items()}

    def restore(self, image):
        """Each file back as in `image` (through the backup API, in place: a connection the
        graph keeps open sees the restored pages); a file the image lacks is emptied."""
        now = self.files()
        for key, path in now.items():
            if image.get(key) is None:
                restore_file(path, None)
        for key, pages in image.items():
            path = now.get(key) or self.path_of(key)
            if key not in now and pages is not None and new_file(path, pages):
                continue
            if pages is not None or os.path.exists(path):
                restore_file(path, pages)

    def path_of(self, key):
        if key.startswith("$"):
            name, _, rest = key[1:].partition("/")
            return os.path.join(self.folders()[f"${name}"], rest)
        return key

    def relocate(self, folder):
        """Point this process (and the processes it forks) at a folder of its own: each env
        variable's file now lives in `folder` (restore() fills it)."""
        for name in self.env:
            own = os.path.join(folder, name)
            os.makedirs(own, exist_ok=True)
            if os.path.isdir(os.environ[name]):
                os.environ[name] = own
            else:
                os.environ[name] = os.path.join(own, os.path.basename(os.environ[name]))


def sqlite_files(folder):
    """The SQLite database files in folder (by their first bytes), not their -wal/-shm/-journal."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(("-wal", "-shm", "-journal")) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            head = f.read(16)
        if head == SQLITE_MAGIC or head == b"":
            found.append(name)
    return found


def image_of(path):
    """The file's database as bytes (None when absent), as a rollback-journal file's: the pages
    of its -wal file included (serialize reads through SQLite's pager)."""
    if not os.path.exists(path):
        return None
    if os.path.getsize(path) == 0:  # made, nothing written yet: serialize() cannot say so
        return b""
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        return as_rollback(conn.serialize())


def as_rollback(image):
    """An image whose header says WAL (bytes 18 and 19 are 2) marked as a rollback-journal
    database: an in-memory database cannot open a WAL one (sqlite.org/fileformat.html, 1.3.3)."""
    if len(image) > 19 and image[18:20] == b"\x02\x02":
        image = bytearray(image)
        image[18:20] = b"\x01\x01"
        image = bytes(image)
    return image


def new_file(path, image):
    """Write `image` as a new database file at path; False when something is there already (a
    file, or a -wal or -journal one SQLite would read with it). An image is a whole database as
    a rollback-journal file holds it (image_of): nothing has the new file open, so its bytes
    are the database, as the backup API would write them, without opening two connections."""
    if any(os.path.exists(path + end) for end in ("-wal", "-journal")):
        return False
    try:
        with open(path, "xb") as out:
            out.write(image)
    except FileExistsError:
        return False
    return True


def restore_file(path, image):
    """Write `image` (bytes, or None for an empty database) into the database at path, through
    the backup API: the live file keeps its journal mode and any open connection stays valid."""
    with closing(sqlite3.connect(":memory:")) as source:
        if image:
            source.deserialize(image)
        with closing(sqlite3.connect(path, timeout=30)) as target:
            source.backup(target)


def open_world(world):
    """`world` as given (an object with snapshot/restore, or a callable returning one), or a
    DrillError saying what is wanted."""
    if world is None:
        return None
    if isinstance(world, str | os.PathLike):
        world = SqliteWorld(world)
    if not hasattr(world, "snapshot") and callable(world):
        try:
            world = world()
        except Exception as error:
            raise DrillError(f"the world raised {type(error).__name__}: {error}") from None
    if not (callable(getattr(world, "snapshot", None)) and callable(getattr(world, "restore", 0))):
        raise DrillError(
            f"a world needs snapshot() and restore(image) methods, not {type(world).__name__}"
        )
    return world


def declared_world(world, observe, context):
    """The world given to drill(), else the one the observer or the context declares (an
    attribute `drill_world` beside `observe`: on the function, or on the context object)."""
    if world is not None:
        return open_world(world)
    for owner in (observe, context):
        declared = getattr(owner, "drill_world", None)
        if declared is not None:
            return open_world(declared)
    return None


@contextmanager
def world_lock(path):
    """One resume at a time on a world restored in place (its files are shared)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
