"""The savers the drill runs on: LangGraph's SqliteSaver or PostgresSaver (sync and async) with
a mixin that tells a recorder about each put and put_writes, the checkpoint database, the store."""

import os
import pathlib
import shutil
import sqlite3
import stat
import tempfile
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import urlsplit, urlunsplit

from effectdrill.errors import DrillError, one_line, safe
from effectdrill.plan import parent, put_call, writes_call

MEMORY_DATABASES = ("", ":memory:", "memory")  # names of an in-memory SQLite database


class Recording:
    """Saver mixin: tells its recorder about each put and put_writes, before and after it."""

    recorder = None

    def put(self, config, checkpoint, metadata, new_versions):
        if self.recorder is None:
            return super().put(config, checkpoint, metadata, new_versions)
        key = self.recorder.before(put_call(config, metadata))
        try:
            saved = super().put(config, checkpoint, metadata, new_versions)
        except BaseException:
            failed(self.recorder, key)
            raise
        self.recorder.after(key, (parent(config)[0], checkpoint["id"]))
        return saved

    def put_writes(self, config, writes, task_id, task_path=""):
        if self.recorder is None:
            return super().put_writes(config, writes, task_id, task_path)
        key = self.recorder.before(writes_call(config, writes, task_id, task_path))
        try:
            super().put_writes(config, writes, task_id, task_path)
        except BaseException:
            failed(self.recorder, key)
            raise
        self.recorder.after(key)

    async def aput(self, config, checkpoint, metadata, new_versions):
        if self.recorder is None:
            return await super().aput(config, checkpoint, metadata, new_versions)
        key = await self.recorder.abefore(put_call(config, metadata))
        try:
            saved = await super().aput(config, checkpoint, metadata, new_versions)
        except BaseException:
            failed(self.recorder, key)
            raise
        self.recorder.after(key, (parent(config)[0], checkpoint["id"]))
        return saved

    async def aput_writes(self, config, writes, task_id, task_path=""):
        if self.recorder is None:
            return await super().aput_writes(config, writes, task_id, task_path)
        key = await self.recorder.abefore(writes_call(config, writes, task_id, task_path))
        try:
            await super().aput_writes(config, writes, task_id, task_path)
        except BaseException:
            failed(self.recorder, key)
            raise
        self.recorder.after(key)


def failed(recorder, key):
    """A saver call raised: a recorder that serializes the calls lets the next one go."""
    if hasattr(recorder, "failed"):
        recorder.failed(key)


class StoreMaker:
    """Each run's store: "sqlite" (a SqliteStore, or AsyncSqliteStore for async graphs, on one
    file every run shares) or a function of the user's returning a store."""

    def __init__(self, spec, folder):
        self.spec, self.path = spec, os.path.join(folder, "store.sqlite") if folder else None

    @contextmanager
    def sync(self):
        if callable(self.spec):
            yield self.made()
            return
        from langgraph.store.sqlite import SqliteStore

        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            store = SqliteStore(conn)
            store.setup()
            yield store
        finally:
            conn.close()

    @asynccontextmanager
    async def asynchronous(self):
        if callable(self.spec):
            yield self.made()
            return
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        async with AsyncSqliteStore.from_conn_string(self.path) as store:
            await store.setup()
            yield store

    def made(self):
        try:
            return self.spec()
        except Exception as error:
            raise DrillError(f"--store raised {one_line(error)}") from None


@contextmanager
def store_maker(spec):
    """drill(store=...): None, "sqlite" (a temporary file, removed after) or a function."""
    if spec is None:
        yield None
        return
    if spec != "sqlite" and not callable(spec):
        raise DrillError(f"store must be 'sqlite' or a function returning a store, not {spec!r}")
    folder = tempfile.mkdtemp(prefix="effectdrill-store-") if spec == "sqlite" else None
    try:
        yield StoreMaker(spec, folder)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def temporary_folder(prefix):
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def database(target):
    """The drill's checkpoint database: a temporary SQLite file (removed after) or the target."""
    if target is not None and type(target).__name__ == "InMemorySaver":
        target = ":memory:"
    if target is not None and not isinstance(target, str | os.PathLike):
        raise DrillError(f"checkpoint_db must be a SQLite path or a postgresql:// URL: {target!r}")
    target = None if target is None else os.fspath(target)
    if target is not None and target.strip() in MEMORY_DATABASES:
        raise DrillError(
            "an in-memory checkpoint database dies with the killed process, so nothing could be "
            "resumed: give a SQLite file path or a postgresql:// URL, or none for a temporary file"
        )
    folder = None
    try:
        if target is None:
            folder = tempfile.mkdtemp(prefix="effectdrill-")
            target = os.path.join(folder, "checkpoints.sqlite")
        db = (
            Postgres(target)
            if target.startswith(("postgresql://", "postgres://"))
            else Sqlite(target)
        )
        db.check()
        yield db
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class Sqlite:
    """LangGraph's SqliteSaver (AsyncSqliteSaver) on a file: each saver() is a new connection."""

    def __init__(self, path):
        self.path = path

    def check(self):
        refuse_foreign_database(self.path)  # before SqliteSaver.setup writes a byte
        try:
            with self.saver(setup_done=False) as saver:
                saver.setup()
        except sqlite3.Error as error:
            raise DrillError(f"cannot open the SQLite database {self.path}: {error}") from None

    @contextmanager
    def saver(self, recorder=None, setup_done=True):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self.path, check_same_thread=False)
        # No fsync: the drill's crash is a killed process, and SQLite keeps a committed
        # transaction through that with synchronous=OFF (only an OS crash or power loss can
        # lose it: sqlite.org/pragma.html#pragma_synchronous).
        conn.execute("PRAGMA synchronous=OFF")
        try:
            saver = recording_saver(SqliteSaver)(conn)
            saver.is_setup = setup_done  # check() made the tables: once is enough
            saver.recorder = recorder
            yield saver
        finally:
            conn.close()

    @asynccontextmanager
    async def asaver(self, recorder=None):
        try:  # on aiosqlite, a dependency of langgraph-checkpoint-sqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError:
            raise DrillError(
                "a graph of async nodes needs aiosqlite for its SQLite checkpoints: "
                "pip install aiosqlite"
            ) from None
        async with recording_saver(AsyncSqliteSaver).from_conn_string(self.path) as saver:
            await saver.conn.execute("PRAGMA synchronous=OFF")  # as saver() above
            saver.is_setup = True
            saver.recorder = recorder
            yield saver


OURS = {  # SqliteSaver.setup's tables and the columns each was made with (a subset: ours may
    # gain columns; another program's table of that name lacks some): langgraph/checkpoint/
    # sqlite/__init__.py
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint", "metadata"},
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"},
}


def refuse_foreign_database(path):
    """A DrillError, before anything is written, for a path that is a link or not a regular file
    (a FIFO would hang the open; a link writes through), or a SQLite file holding tables that
    are not LangGraph's checkpoints: another program's database. Read on a read-only connection
    (mode=ro): the check itself writes nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return  # a new file: the saver makes it
    except OSError as error:
        raise DrillError(f"--checkpoint-db {path}: {error.strerror}") from None
    if stat.S_ISLNK(mode):
        raise DrillError(f"--checkpoint-db {path} is a symbolic link: name the file itself")
    if not stat.S_ISREG(mode):
        raise DrillError(f"--checkpoint-db {path} is not a regular file: name a SQLite file")
    if os.path.getsize(path) == 0:
        return
    try:
        conn = sqlite3.connect(f"{pathlib.Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            unlike = [
                table
                for table, columns in OURS.items()
                if table in tables
                and not columns <= {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
            ]
        finally:
            conn.close()
    except sqlite3.Error as error:
        raise DrillError(f"cannot open the SQLite database {path}: {error}") from None
    foreign = sorted(t for t in tables - set(OURS) if not t.startswith("sqlite_")) + unlike
    if foreign:
        raise DrillError(
            f"--checkpoint-db {path} holds tables that are not LangGraph's checkpoints "
            f"({', '.join(safe(t) for t in foreign)}): another program's database; nothing was "
            "written to it. Give the drill a file of its own (or none: a temporary one)"
        )


class Postgres:
    """LangGraph's PostgresSaver (AsyncPostgresSaver): each saver() is a new connection."""

    def __init__(self, url):
        self.url = url

    def check(self):
        saver_class()  # first: it says what to install
        import psycopg  # a dependency of langgraph-checkpoint-postgres

        try:
            with self.saver() as saver:
                saver.setup()  # PostgresSaver's docstring: setup() is the caller's to call
        except psycopg.Error as error:
            shown = hide_password(self.url)
            raise DrillError(f"cannot open the database {shown}: {one_line(error)}") from None

    @contextmanager
    def saver(self, recorder=None):
        with recording_saver(saver_class()).from_conn_string(self.url) as saver:
            saver.recorder = recorder
            yield saver

    @asynccontextmanager
    async def asaver(self, recorder=None):
        saver_class()
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with recording_saver(AsyncPostgresSaver).from_conn_string(self.url) as saver:
            saver.recorder = recorder
            yield saver


def saver_class():
    """LangGraph's PostgresSaver, or a DrillError that says what to install."""
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise DrillError(
            "a postgresql:// checkpoint database needs langgraph-checkpoint-postgres: "
            "pip install 'effectdrill[postgres]'"
        ) from None
    return PostgresSaver


_RECORDING = {}


def recording_saver(saver_class):
    """saver_class with the Recording mixin (made once per class)."""
    if saver_class not in _RECORDING:
        _RECORDING[saver_class] = type(f"Drill{saver_class.__name__}", (Recording, saver_class), {})
    return _RECORDING[saver_class]


def hide_password(url):
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
