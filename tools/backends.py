"""Two ways to run the lab, one interface: Compose on a Docker engine, or native processes.

The guide runner (and `make demo`), the drill and the chaos run all drive the lab through a
Backend. A guide command names the learner's Compose project, then optional Compose files:

    docker compose -p stateful-lab [-f compose.yaml -f labs/lost-ack.compose.yaml] VERB ...

    VERB ...                 docker backend                  local backend
    up -d --build api        as written                      start python -m labs.receiver, wait
    for /health
                                                             (-f X.compose.yaml: with the api
                                                             environment X sets)
    run --rm workflow ARGS   as written                      python -m labs ARGS
    run --rm -e K=V workflow as written                      K=V python -m labs ARGS (labs 05, 12;
                                                             a V in /data/: data/workflow/)
    run --rm relay ARGS      as written                      python -m labs.relay ARGS (lab 19)
    run --rm --entrypoint python workflow ARGS               python ARGS (labs 07, 08, 12: read
                             as written                      LangGraph's installed source)
    restart api              as written                      SIGTERM, wait for the exit, start again
    down -v --remove-orphans as written                      stop the receiver, delete both data
                                                             folders
    sleep N (no prefix)      a real sleep of N seconds       the same (lab 14 waits out a setting)

A second `up` with other -f files gives the api another environment: Compose recreates it, the
local backend restarts the receiver with it; the data stays either way.

Neither ever touches a learner's lab (the Compose project stateful-lab, data/, port 8000): the
docker backend runs in a Compose project of its own (the guide's `-p stateful-lab` is rewritten),
the local backend in a temporary folder, on a free loopback port.
`make reset`, which resets the learner's own lab, is tools/reset.py; the shell lines a
learner types natively for each guide command are tools/native.py's.
"""

import functools
import json
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools import safefiles
from tools.local import (
    COMMAND_TIMEOUT_S,
    LabError,
    ReceiverProcess,
    free_port,
    lab_env,
    run_command,
    run_worker_here,
    run_workflow,
    run_workflow_here,
    shell_exit_code,
    wait_until,
)
from tools.native import PYTHON_IN_THE_IMAGE, in_data, override_environment
from tools.native import line as native_line
from tools.native_workers import LocalWorkers

LEARNER_PROJECT = "stateful-lab"  # the project the guides name: the learner's, never ours
GUIDE_PREFIX = ["docker", "compose", "-p", LEARNER_PROJECT]
BASE_FILE = "compose.yaml"
LOST_ACK = "labs/lost-ack.compose.yaml"  # the override that turns the lost-ack fault on
WORKFLOW_TIMEOUT_S = 120  # seconds for one workflow command (docker: container start included)
COMPOSE_NOISE = re.compile(
    r"^(Creating|Starting|Restarting|Stopping|Removing|Recreating|Pulling|Building|Network"
    r"|Volume|Container)\s"
)
SLEEP = re.compile(r"sleep (\d+)")  # `sleep N`: whole seconds, as bash, zsh and PowerShell read it
MAX_SLEEP_S = 60  # seconds: a guide waits out a short setting, not the room's patience
PROJECT_LABEL = "label=com.docker.compose.project"  # Compose 1 and 2 both set it
RESOURCES = ("container", "volume", "network")  # what `down -v` removes
DOWN_DEADLINE_S = 30  # seconds for the engine to remove an interrupted `run --rm` container
TICKETS_SCRIPT = (  # run inside the api container: ask the receiver itself, on its loopback
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:8000/tickets', timeout=5)"
    ".read().decode())"
)


@dataclass
class Result:
    stdout: str
    stderr: str = ""
    exit_code: int = 0  # as a shell reports it: a death by signal N is 128 + N


@dataclass
class GuideCommand:
    files: list  # -f FILE, in order ([] when the guide names none)
    verb: str
    args: list

    @property
    def overrides(self):
        return self.files[1:]

    def run_env(self):
        """`run --rm -e K=V ... SERVICE ARGS`: ({K: V}, ["--rm", SERVICE, *ARGS])."""
        env, args = {}, list(self.args)
        while args[1:2] == ["-e"] and "=" in (args[2:3] or [""])[0]:
            name, _, value = args[2].partition("=")
            env[name], args = value, [args[0], *args[3:]]
        return env, args


def parse_command(command):
    """'docker compose -p stateful-lab [-f F ...] VERB ARGS' -> GuideCommand, or ValueError;
    'sleep N' -> GuideCommand([], "sleep", [N])."""
    if (seconds := parse_sleep(command)) is not None:
        return GuideCommand([], "sleep", [seconds])
    words = shlex.split(command)
    if words[: len(GUIDE_PREFIX)] != GUIDE_PREFIX:
        raise ValueError(f"guide commands start with `{' '.join(GUIDE_PREFIX)}`: {command!r}")
    rest, files = words[len(GUIDE_PREFIX) :], []
    while rest[:1] == ["-f"] and len(rest) > 1:
        files.append(rest[1])
        rest = rest[2:]
    if files and files[0] != BASE_FILE:
        raise ValueError(
            f"the first -f must be {BASE_FILE} (Compose then reads no other): {command!r}"
        )
    if not rest:
        raise ValueError(f"no Compose command in {command!r}")
    return GuideCommand(files, rest[0], rest[1:])


def parse_sleep(command):
    """'sleep N' (N whole seconds) -> N; None for any other command.

    The one guide command that is not Compose: a wait the lab itself is about (lab 14 waits out
    the receiver's key retention), run as a real sleep by every backend, typed as is in bash,
    zsh and PowerShell (where `sleep` is Start-Sleep)."""
    match = SLEEP.fullmatch(command.strip())
    return int(match.group(1)) if match else None


DRILL_DBS = {
    "SHOP_DB": "shop/shop.sqlite",  # lab 11
    "APPROVAL_DB": "approval/approval.sqlite",  # lab 11
    "CLASSIFY_DB": "classify/classify.sqlite",  # lab 16
    "OUTBOX_DB": "outbox/outbox.sqlite",  # lab 19
    "WEBHOOK_DB": "webhook/webhook.sqlite",  # lab 18's handler graph
}
DRILL_TIMEOUT_S = 120  # seconds for one drill: about 10 crash runs of 0.1-0.5 s each, loaded


class Backend:
    """What every backend does, and all the guides, the demo, the drill and chaos use of one.

    run(command)    a guide's command as the learner types it -> Result (stdout, stderr, exit)
    up(overrides)   start the receiver (with lab 06's override files); down() removes the lab
    workflow(args)  `run --rm workflow ARGS`; tickets(): every ticket the receiver holds
    close()         stop what this backend started
    leftovers()     what of it is still there after close() (the demo says so): [] for nothing

    Only LocalBackend has native(command): the command as a learner pastes it natively (the
    demo prints it under each step), written by tools/native.py.
    """

    name = "?"

    def run(self, command):
        raise NotImplementedError

    def up(self, overrides=()):
        raise NotImplementedError

    def down(self):
        raise NotImplementedError

    def workflow(self, args, timeout=None):
        raise NotImplementedError

    def tickets(self):
        raise NotImplementedError

    def messages(self):
        """Every message the receiver holds (its POST /messages, lab 15's email service)."""
        raise NotImplementedError

    def close(self):
        pass

    def leftovers(self):
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalBackend(Backend):
    """The lab as native processes: data in data_dir (a temporary folder unless given)."""

    name = "local"

    def run(self, command):
        """The guide's command mapped onto a native process (see the module docstring)."""
        cmd = parse_command(command)
        if cmd.verb == "sleep":
            return guide_sleep(cmd.args[0])
        if cmd.verb == "up" and cmd.args[-1:] == ["api"]:
            return self.up(cmd.overrides)
        if cmd.verb == "restart" and cmd.args == ["api"]:
            return self.restart()
        if cmd.verb == "down":
            return self.down()
        env, args = cmd.run_env()
        env = {name: in_data(value, str(self.data_dir)) for name, value in env.items()}
        if cmd.verb == "run" and args[:2] == ["--rm", "workflow"]:
            return self.workflow(args[2:], env=env)
        if cmd.verb == "run" and cmd.args[:2] == ["--rm", "drill"]:  # lab 11
            return self.drill(cmd.args[2:])
        if cmd.verb == "run" and cmd.args[:4] == PYTHON_IN_THE_IMAGE:
            return self.python(cmd.args[4:])
        if cmd.verb == "run" and args[:2] == ["--rm", "relay"]:  # lab 19
            return self.relay(args[2:], env)
        if cmd.verb == "logs" and cmd.args == ["api"]:
            return self.logs()
        if (scaled := self.scale_profile(cmd)) is not None:
            return scaled
        raise ValueError(f"the {self.name} backend has no mapping for {command!r}")

    def __init__(self, data_dir=None, port=None, log_path=None, in_process=False):
        self.in_process = in_process  # workflow commands without a signal switch, and worker
        #                               commands other than `run`, in this process: see local.py
        self.owned = data_dir is None  # a folder we made is deleted by close()
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="stateful-lab-"))
        self.env = lab_env(self.data_dir, port or free_port())
        self.env.pop("FAILPOINTS", None)  # a fault is on only where a lab asks for it
        self.log_path = Path(log_path) if log_path else self.data_dir / "receiver.log"
        self.faults = {}
        self.receiver = ReceiverProcess(self.env, self.log_path)
        self.workers = LocalWorkers(self.env, self.data_dir)  # the scale profile (lab 10)

    @property
    def port(self):
        return int(self.env["PORT"])

    def up(self, overrides=()):
        """Start the receiver; a running one is left alone unless the override files give it
        another environment: then it is stopped and started with that one, as Compose recreates
        a container whose configuration changed (lab 14). Its data stays."""
        faults = override_environment(overrides)
        if self.receiver.running and faults == self.faults:
            return Result("")
        self.receiver.stop()
        self.faults = faults
        self.receiver = ReceiverProcess({**self.env, **self.faults}, self.log_path)
        self.start_receiver()
        return Result("")

    def start_receiver(self):
        try:
            self.receiver.start()
        except (RuntimeError, TimeoutError, safefiles.NotAFile) as error:  # NotAFile: its log
            self.receiver.stop()
            raise LabError(f"the receiver did not start: {error} (log: {self.log_path})") from None

    def restart(self):
        self.receiver.stop()
        self.start_receiver()
        return Result("")

    def down(self):
        self.workers.close()
        self.receiver.stop()
        for volume in ("receiver", "workflow"):
            shutil.rmtree(self.data_dir / volume, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)  # as Compose removes the container and its log
        return Result("")

    def logs(self):
        """The receiver's stderr so far, as `cat` shows it (Compose adds a prefix per line)."""
        try:
            return Result(self.log_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Result("")

    def workflow(self, args, timeout=WORKFLOW_TIMEOUT_S, env=None):
        if self.in_process:
            done = run_workflow_here(args, {**self.env, **(env or {})})
        else:
            done = run_workflow(args, {**self.env, **(env or {})}, timeout)
        return Result(done.stdout, done.stderr, shell_exit_code(done.returncode))

    def drill(self, args):
        """python -m labs.drill ARGS (lab 11: effectdrill), its example graphs' databases in the
        lab's data, and its temporary files (its checkpoints, a --context's ledger) too: a drill
        stopped by a Ctrl-C is killed (run_command()), and what it would have removed goes with the
        lab's folder."""
        env = {**self.env, **{name: str(self.data_dir / path) for name, path in DRILL_DBS.items()}}
        (self.data_dir / "tmp").mkdir(exist_ok=True)
        env["TMPDIR"] = str(self.data_dir / "tmp")  # tempfile's first choice (gettempdir)
        done = run_command([sys.executable, "-m", "labs.drill", *args], env, DRILL_TIMEOUT_S)
        return Result(done.stdout, done.stderr, shell_exit_code(done.returncode))

    def relay(self, args, env=None):
        """python -m labs.relay ARGS (lab 19): a process, since a crash switch kills it."""
        done = run_command([sys.executable, "-m", "labs.relay", *args], {**self.env, **(env or {})})
        return Result(done.stdout, done.stderr, shell_exit_code(done.returncode))

    def python(self, args):
        """The lab's Python, as the image's `python` runs it: with the lab's environment."""
        done = run_command([sys.executable, *args], self.env, WORKFLOW_TIMEOUT_S)
        return Result(done.stdout, done.stderr, shell_exit_code(done.returncode))

    def tickets(self):
        """Every ticket the receiver holds, asked over HTTP."""
        from exitcodes import UserError
        from workflow import TicketClient

        try:
            return TicketClient(self.env["API_URL"]).tickets()
        except UserError as error:
            raise LabError(str(error)) from None

    def messages(self):
        from exitcodes import UserError
        from workflow import TicketClient

        try:
            return TicketClient(self.env["API_URL"]).call("/messages")["messages"]
        except UserError as error:
            raise LabError(str(error)) from None

    def native(self, command):
        """The command as a learner pastes it natively, or None where it is typed as is: the
        line tools/native.py writes for what this backend runs now."""
        postgres_up = self.workers.postgres is not None
        return native_line(parse_command(command), self.faults, self.receiver.running, postgres_up)

    def scale_profile(self, cmd):
        """up -d postgres: a throwaway cluster (tools.pg); up -d --scale worker=N worker: N
        `python -m labs.workers run` processes; run --rm worker ARGS: python -m labs.workers ARGS;
        kill -s SIG,
        pause and unpause worker: SIG, SIGSTOP and SIGCONT to every worker (Compose's pause uses
        the cgroup freezer)."""
        services = [w for w in cmd.args if not w.startswith("-") and "=" not in w]
        if cmd.verb == "up" and {"postgres", "worker"} & set(services):
            if "api" in services and not self.receiver.running:
                self.start_receiver()
            self.workers.start_postgres()
            if "worker" in services:
                scale = [w for w in cmd.args if w.startswith("worker=")]
                self.workers.scale(int(scale[-1].split("=")[1]) if scale else 1)
            return Result("")
        if cmd.verb == "run" and cmd.args[:2] == ["--rm", "worker"]:
            args = cmd.args[2:]
            serves = args[:1] == ["run"] or (args[:1] == ["metrics"] and "--port" in args)
            if self.in_process and not serves:  # a client of the queue: see local.py
                done = run_worker_here(args, self.workers.env)
            else:
                done = self.workers.run(args)
            return Result(done.stdout, done.stderr, shell_exit_code(done.returncode))
        signals = {"pause": signal.SIGSTOP, "unpause": signal.SIGCONT}
        if cmd.verb == "kill" and cmd.args[:1] == ["-s"] and cmd.args[2:] == ["worker"]:
            signals["kill"] = signal.Signals[cmd.args[1]]
        if cmd.verb in signals and cmd.args[-1:] == ["worker"]:
            self.workers.signal(signals[cmd.verb])
            return Result("")
        return None

    def close(self):
        self.workers.close()
        self.receiver.stop()
        if self.owned:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def leftovers(self):
        left = [f"the receiver (pid {self.receiver.proc.pid})"] if self.receiver.running else []
        left += [f"a worker (pid {proc.pid})" for proc in self.workers.live()]
        if self.owned and self.data_dir.exists():
            left.append(f"the folder {self.data_dir}")
        return left


def guide_sleep(seconds):
    """A guide's `sleep N`: the wait really happens, in either backend (nothing to poll: the
    lab is about the time passing)."""
    if seconds > MAX_SLEEP_S:
        raise ValueError(f"a guide sleeps at most {MAX_SLEEP_S} s, not {seconds}")
    time.sleep(seconds)
    return Result("")


@functools.cache
def compose_command():
    """`docker compose` (v2), or `docker-compose` (v1) where the plugin is missing."""
    if (
        shutil.which("docker")
        and run_command(["docker", "compose", "version"], timeout=30).returncode == 0
    ):
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


def docker_engine_answers():
    if not shutil.which("docker") or compose_command() is None:
        return False
    return run_command(["docker", "info"], timeout=30).returncode == 0


def compose_stderr(stderr, returncode):
    """stderr without Compose's own progress lines, and without the exit code that
    docker-compose 1.29 `run` repeats as its last line: what the program itself said."""
    lines = [line for line in stderr.splitlines() if not COMPOSE_NOISE.match(line.strip())]
    if returncode and lines and lines[-1].strip() == str(returncode):
        lines.pop()
    return "".join(line + "\n" for line in lines)


class DockerBackend(Backend):
    """The guide's commands as written, through Compose, in the project `project`."""

    name = "docker"

    def __init__(self, project, compose=None):
        if project == LEARNER_PROJECT:
            raise ValueError(f"{LEARNER_PROJECT} is the learner's project; tools use their own")
        self.project = project
        self.files = []  # the -f files up() named; every later command names them too (lab 06)
        self.compose = compose or compose_command()  # compose: ("docker-compose",) tests v1
        if self.compose is None or not docker_engine_answers():
            raise LabError("no Docker engine with Compose answers; BACKEND=local runs it natively")

    def compose_run(self, args, timeout=WORKFLOW_TIMEOUT_S):
        """Compose in our project, with the -f files the last command named (or up())."""
        files = [word for name in self.files for word in ("-f", name)]
        done = run_command([*self.compose, "-p", self.project, *files, *args], timeout=timeout)
        return Result(
            done.stdout,
            compose_stderr(done.stderr, done.returncode),
            shell_exit_code(done.returncode),
        )

    def run(self, command):
        cmd = parse_command(command)  # what the local backend accepts, and nothing else
        if cmd.verb == "sleep":
            return guide_sleep(cmd.args[0])
        if cmd.verb not in ("up", "restart", "down", "run", "logs", "kill", "pause", "unpause"):
            raise ValueError(f"the docker backend has no mapping for {command!r}")
        self.files = cmd.files  # as written: the guide names them on each command, or not
        timeout = COMMAND_TIMEOUT_S if cmd.verb == "up" else WORKFLOW_TIMEOUT_S
        return self.compose_run([cmd.verb, *cmd.args], timeout)

    def up(self, overrides=()):
        self.files = [BASE_FILE, *overrides] if overrides else []
        return self.compose_run(["up", "-d", "--build", "api"], COMMAND_TIMEOUT_S)

    def restart(self):
        return self.compose_run(["restart", "api"])

    def down(self):
        """The guides' reset, `down -v --remove-orphans`, until nothing of the project is left.

        An interrupted `run --rm` (the demo's Ctrl-C kills its Compose client) leaves its
        container running; Compose 2 made it with AutoRemove, so the engine removes it when it
        stops, and `down` stops it but does not wait for that: the volume it mounts is then
        "still in use" (exit 0). Once no container of the project is left, a second `down`
        removes the volume."""
        self.files = []  # with -f files, Compose 2.26 removes only the default services' volumes
        done = self.compose_run(["down", "-v", "--remove-orphans"])
        if done.exit_code == 0 and self.leftovers():
            try:
                wait_until(
                    lambda: not self.listed("container"), DOWN_DEADLINE_S, "containers removed"
                )
            except TimeoutError:
                return done  # leftovers() says what stayed
            done = self.compose_run(["down", "-v", "--remove-orphans"])
        return done

    def listed(self, kind):
        """The names of the project's containers (running or not), volumes or networks, found by
        the label Compose 1 and 2 both put on them."""
        field = "{{.Names}}" if kind == "container" else "{{.Name}}"
        listing = ["docker", kind, "ls", "--filter", f"{PROJECT_LABEL}={self.project}"]
        listing += ["--format", field, *(["-a"] if kind == "container" else [])]
        return run_command(listing, timeout=30).stdout.split()

    def leftovers(self):
        return [f"{kind} {name}" for kind in RESOURCES for name in self.listed(kind)]

    def workflow(self, args, timeout=WORKFLOW_TIMEOUT_S, env=None):
        options = [word for k, v in (env or {}).items() for word in ("-e", f"{k}={v}")]
        return self.compose_run(["run", "--rm", *options, "workflow", *args], timeout)

    def tickets(self):
        return self.listing("tickets")

    def messages(self):
        return self.listing("messages")

    def listing(self, what):
        script = TICKETS_SCRIPT.replace("/tickets", f"/{what}")
        done = self.compose_run(["exec", "-T", "api", "python", "-c", script])
        if done.exit_code:
            raise LabError(f"cannot list the receiver's {what}: {done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)[what]

    def close(self):
        self.down()


def choose_backend(name, project, port=None):
    """auto: Docker when an engine answers, else local. Returns (backend, why)."""
    if name == "auto":
        name = "docker" if docker_engine_answers() else "local"
        why = "a Docker engine answers" if name == "docker" else "no Docker engine answers"
        why += "; BACKEND=local|docker forces one"
    else:
        why = "chosen"
    return (DockerBackend(project) if name == "docker" else LocalBackend(port=port)), why
