"""Run the lab's two programs natively: the receiver in the background, the workflow per command.

The local backend (tools.backends), the drill, the chaos run and the tests all start
processes through this module, so they run the lab exactly the same way. Child processes
start in a session of their own: a Ctrl-C in the terminal reaches only the tool, which then
stops what it started, in order.
"""

import contextlib
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tools import safefiles

ROOT = Path(__file__).resolve().parents[1]
COMMAND_TIMEOUT_S = 600  # seconds for one command; a first `up --build` installs packages
# A hang guard, not a speed bound: a receiver answers /health in well under a second, and a
# machine busy with other work may take many times that.
HEALTH_DEADLINE_S = 60.0  # seconds for a receiver to answer /health after it starts
STOP_DEADLINE_S = 5.0  # seconds to exit after SIGTERM before we SIGKILL it


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabError(Exception):
    """The lab itself could not run (no engine, a receiver that does not start): one line."""


class PortTaken(LabError):
    """Another program listens on the port a receiver was to use."""


def check_port_free(host, port):
    """Raise PortTaken when something listens on host:port (we never talk to it).

    SO_REUSEADDR, as the receiver's own socket has: a port whose old connections are only
    in TIME_WAIT (a receiver we just stopped) is free; one with a listener is not.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise PortTaken(
                f"port {port} is already taken by another program ({error.strerror}); "
                "stop that program, or choose another port"
            ) from None


def run_command(argv, env=None, timeout=COMMAND_TIMEOUT_S, cwd=ROOT):
    """Run a command in cwd (ROOT) to its end: no stdin, text stdout and stderr captured, its own
    session (a Ctrl-C meant for us does not reach it; on any exception it is killed)."""
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def lab_env(data_dir, port, **extra):
    """The environment both programs read, with the data layout of the two Compose volumes."""
    data_dir = Path(data_dir)
    env = dict(os.environ)
    env.update(
        RECEIVER_DB=str(data_dir / "receiver" / "receiver.sqlite"),
        CHECKPOINT_DB=str(data_dir / "workflow" / "checkpoints.sqlite"),
        HOST="127.0.0.1",
        PORT=str(port),
        API_URL=f"http://127.0.0.1:{port}",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def wait_until(predicate, deadline_s, what):
    """Poll predicate() until it is true; raise TimeoutError naming `what` after the deadline."""
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {deadline_s:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class ReceiverProcess:
    """The lab's receiver (python -m labs.receiver in cwd), or a receiver script (a path), as a
    background process on a loopback port."""

    def __init__(self, env, log_path=None, script="labs.receiver", cwd=ROOT):
        self.env, self.cwd = env, cwd
        self.argv = ["-m", script] if isinstance(script, str) else [str(script)]
        self.url = env["API_URL"]
        self.log_path = Path(log_path) if log_path else None
        self.proc = None

    def start(self):
        """Start it and wait for /health; PortTaken when another program holds the port."""
        check_port_free(self.env["HOST"], int(self.env["PORT"]))
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = safefiles.open_log(self.log_path) if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                log.close()
        wait_until(self.healthy, HEALTH_DEADLINE_S, f"receiver at {self.url} answering /health")
        return self

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"receiver exited with {self.proc.returncode} while starting")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return json.load(response) == {"ok": True}
        except OSError:
            return False

    def stop(self, sig=signal.SIGTERM):
        """Send sig and wait for the exit; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self):
        return self.stop(signal.SIGKILL)


def run_workflow(args, env, timeout=60):
    """python -m labs ARGS; returns the CompletedProcess (text). -9 is the SIGKILL exit."""
    return run_command([sys.executable, "-m", "labs", *args], env, timeout)


SIGNALS_ITSELF = ("--crash", "--crash-at", "--term-at")  # labs/cli.py flags that kill or stop it


def run_workflow_here(args, env):
    """lab.main(ARGS) in this process, for a command that sends itself no signal.

    The same code as `python -m labs ARGS` without a new interpreter and LangGraph's import
    (~0.8 s a command here): the tests' guide runs use it. Not thread-safe (stdout and stderr
    are redirected for the call); a command with a signal switch runs as a process instead.
    """
    if any(arg.split("=")[0] in SIGNALS_ITSELF for arg in args):
        return run_workflow_forked(args, env)
    from labs import cli as lab

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = lab.main(list(args), env)
        except SystemExit as exit:  # argparse: --help, or a usage mistake
            code = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_workflow_forked(args, env, timeout=60):
    """lab.main(ARGS) in a forked copy of this process, for a command that kills or stops itself
    (--crash, --crash-at, --term-at): a real process, which really gets its SIGKILL or SIGTERM,
    started with the lessons and LangGraph already imported (no interpreter start, no imports:
    docs/performance.md). Its stdout and stderr come back through pipes; its own session, cwd
    and environment, as run_command() gives a process. Returns the CompletedProcess, -9 for the
    SIGKILL, like run_workflow()."""
    from labs import cli as lab  # imported before the fork: the child starts with it

    pipes = [os.pipe(), os.pipe()]  # (read, write) for stdout, stderr
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 70  # EX_SOFTWARE, if anything below fails before lab.main has answered
        try:
            os.setsid()
            os.chdir(ROOT)
            os.environ.clear()
            os.environ.update(env)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, (read, write) in ((1, pipes[0]), (2, pipes[1])):
                os.dup2(write, fd)
                os.close(read)
                os.close(write)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # run_graph sets its own drain
            try:
                code = lab.main(list(args), env)
            except SystemExit as exit:  # argparse: --help, or a usage mistake
                code = exit.code if isinstance(exit.code, int) else 1
        finally:
            os._exit(code or 0)
    for _, write in pipes:
        os.close(write)
    try:
        out, err = read_both(pipes[0][0], pipes[1][0], time.monotonic() + timeout)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise subprocess.TimeoutExpired(["labs/cli.py", *args], timeout) from None
    finally:
        os.close(pipes[0][0])
        os.close(pipes[1][0])
    _, status = os.waitpid(pid, 0)
    return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status), out, err)


def read_both(out_fd, err_fd, deadline):
    """Everything written to two pipes until both close, as text; TimeoutError past deadline."""
    import selectors

    chunks = {out_fd: [], err_fd: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    return tuple(b"".join(chunks[fd]).decode("utf-8", "replace") for fd in (out_fd, err_fd))


def run_worker_here(args, env):
    """worker.main(ARGS) in this process, with env as its whole environment, for a command that
    is a client of the queue (submit, status, wait, state, reconcile, metrics once), never `run`:
    a worker is a process of its own, which the labs kill and freeze (nor `metrics --port`, a
    server that runs until it is stopped).

    The same code as `python -m labs.workers ARGS` without a new interpreter (~0.4 s a command here,
    more for `state`, which imports LangGraph): the tests' guide and fault runs use it. Not
    thread-safe (os.environ, stdout and stderr are swapped for the call). Every failpoint is off
    afterwards (worker.main configures the process's points from FAILPOINTS)."""
    if args[:1] == ["run"] or (args[:1] == ["metrics"] and "--port" in args):
        raise ValueError(
            f"`labs/workers.py {shlex.join(args)}` runs until stopped: start a process"
        )
    import failpoints
    from labs import workers as worker

    out, err = io.StringIO(), io.StringIO()
    with (
        environment(env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = worker.main(list(args))
        except SystemExit as exit:  # argparse: --help, or a usage mistake
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            failpoints.reset()
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def environment(env):
    """os.environ is env inside the block, and what it was afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def events(stdout):
    """The JSON events workflow.py, labs/cli.py and labs/workers.py print, one object per line;
    other lines
    (a table, a warning) are skipped."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def event_names(stdout):
    return [event["event"] for event in events(stdout)]


def shell_exit_code(returncode):
    """What a shell (and docker compose run) reports: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
