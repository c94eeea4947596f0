"""A throwaway PostgreSQL cluster in a temporary folder, from the machine's own binaries.

The tests, the guide runner's local backend and the scale tools use it so they never touch a
learner's database: initdb makes a new cluster in the folder, pg_ctl starts it on a free loopback
port with its Unix socket in the same folder, and stop() deletes it all. initdb and pg_ctl refuse
to run as root, so as root they run as the `postgres` user (runuser), which Debian's postgresql
package creates.

    with TempPostgres() as pg:
        pg.url    # postgresql://postgres@127.0.0.1:PORT/postgres

The folder is always a new one under the system's temp folder: the postgres user must be able to
reach it, and a test's tmp_path (mode 0700, owned by root) would not let it.

    python -m tools.pg       # starts one, prints its URL; Ctrl-C or SIGTERM (kill) stops
                                  # and deletes it
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tools.local import free_port, wait_until

START_DEADLINE_S = 30.0  # seconds for a new cluster to accept connections
BINARY_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/local/opt/postgresql*/bin", "/opt/homebrew/bin")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here: the reason says what to install."""


def find_bin_dir():
    """The folder holding initdb and pg_ctl: PATH first, then the usual install places."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    for pattern in BINARY_GLOBS:
        for folder in sorted(glob.glob(pattern), reverse=True):  # the newest version first
            if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
                return Path(folder)
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) found; "
        "install them (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql)"
    )


class TempPostgres:
    """A PostgreSQL cluster in a new temporary folder (deleted by stop()), on a free port."""

    def __init__(self, durable=False):
        self.durable = durable  # fsync, synchronous_commit and full_page_writes on, as by default
        self.bin_dir = find_bin_dir()
        self.folder = Path(tempfile.mkdtemp(prefix="stateful-lab-pg-"))
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.running = False

    def _as_owner(self, *argv):
        argv = [str(self.bin_dir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:  # initdb and pg_ctl refuse root
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_DEADLINE_S)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self):
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        data = self.folder / "data"
        self._as_owner("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "-N")
        return self.start_server()

    def start_server(self):
        """pg_ctl start on the cluster's folder; again after halt(), on the same port."""
        # TCP on loopback only, and the socket in our folder rather than /var/run/postgresql
        # (which may not exist). Not durable unless asked: a test cluster is deleted afterwards,
        # so it runs without fsync, synchronous commits and full-page writes, which makes its
        # figures faster than a real server's (tools.bench_workers measures both).
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.folder} -c max_connections=200"
        )
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        log = self.folder / "postgres.log"
        data = self.folder / "data"
        self._as_owner("pg_ctl", "-D", data, "-o", options, "-l", log, "-w", "start")
        self.running = True
        wait_until(self.ready, START_DEADLINE_S, f"PostgreSQL on port {self.port}")
        return self

    def halt(self):
        """Stop the server as a crash or a failover would (-m immediate: no shutdown
        checkpoint, every session cut); the cluster stays, for start_server()."""
        self._as_owner("pg_ctl", "-D", self.folder / "data", "-m", "immediate", "-w", "stop")
        self.running = False

    def ready(self):
        import psycopg  # the lab's runtime requirements carry it

        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self):
        if self.running:
            self.halt()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main():
    # In the background (`&`), a shell's Ctrl-C does not reach us: `kill` (SIGTERM) must clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SystemExit leaves the with: stop()
    try:
        with TempPostgres() as pg:
            print(pg.url, flush=True)
            print("pg: a throwaway cluster; Ctrl-C or kill stops and deletes it", file=sys.stderr)
            try:
                threading.Event().wait()  # until Ctrl-C
            except KeyboardInterrupt:
                return 130
    except PostgresUnavailable as error:
        print(f"pg: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
