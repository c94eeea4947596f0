"""Run a lab guide's commands and compare what they print with what the guide promises.

A guide is Markdown. Its ```console blocks hold what a learner types and sees:

    $ docker compose -p stateful-lab run --rm workflow tickets
    {"event": "tickets", "tickets": []}
    [exit 1]                      <- the exit code, when it is not 0

Output lines that are JSON are compared as values, so key order and spacing do not
matter; a string "<anything>" in angle brackets matches any value (for what really
varies, like a freshly minted UUID). A line `...` matches any number of lines.

Backends turn the learner's command into programs: the docker backend runs every command
as written (`docker-compose` stands in where the v2 plugin is missing), the local backend
maps it to native processes as the README's "Without Docker" section shows. For up,
restart, down and logs only the exit code is compared: Compose's own messages and log
prefixes differ between versions.
The scale profile (lab 10) maps through labs.tools.workers: `up -d postgres` starts a
throwaway cluster (labs.tools.pg), `up -d --scale worker=N worker` N `python worker.py run`
processes, `run --rm worker ARGS` is `python worker.py ARGS`, `kill -s SIGKILL worker` kills
every worker, `pause` / `unpause` send SIGSTOP / SIGCONT (Compose uses the cgroup freezer).

    python -m labs.tools.runner [--backend auto|local|docker] [--step] GUIDE.md ...
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from labs.tools.local import (
    ROOT,
    ReceiverProcess,
    free_port,
    lab_env,
    run_workflow,
    shell_exit_code,
)
from labs.tools.workers import LocalWorkers

PROJECT = "stateful-lab"
COMMAND_TIMEOUT_S = 600  # seconds; a first `up --build` downloads and installs packages
BLOCK = re.compile(r"^```console\n(.*?)^```", re.M | re.S)
EXIT_LINE = re.compile(r"^\[exit (\d+)\]$")
LIFECYCLE = ("up", "restart", "down", "logs")  # output shown, not compared


@dataclass
class Step:
    command: str
    expected: list = field(default_factory=list)
    exit_code: int = 0


@dataclass
class Outcome:
    step: Step
    stdout: str
    exit_code: int
    problems: list

    @property
    def ok(self):
        return not self.problems


def parse_guide(text):
    """The guide's console blocks, in order, as Steps."""
    steps = []
    for block in BLOCK.findall(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append(Step(line[2:].strip()))
            elif not steps:
                raise ValueError(f"output before the first command: {line!r}")
            elif match := EXIT_LINE.match(line):
                steps[-1].exit_code = int(match.group(1))
            elif line.strip():
                steps[-1].expected.append(line)
    return steps


def value_matches(expected, actual):
    if isinstance(expected, str) and expected.startswith("<") and expected.endswith(">"):
        return True
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(value_matches(expected[k], actual[k]) for k in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(value_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and expected == actual


def line_matches(expected, actual):
    try:
        return value_matches(json.loads(expected), json.loads(actual))
    except ValueError:
        return expected.rstrip() == actual.rstrip()


def lines_match(expected, actual):
    """Match output lines; `...` in expected matches any run of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(lines_match(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return (
        bool(actual)
        and line_matches(expected[0], actual[0])
        and lines_match(expected[1:], actual[1:])
    )


def split_compose(command):
    """'docker compose -p stateful-lab VERB ...' -> (VERB, rest), or raise ValueError."""
    words = shlex.split(command)
    prefix = ["docker", "compose", "-p", PROJECT]
    if words[:4] != prefix or len(words) < 5:
        raise ValueError(f"guide commands start with `{' '.join(prefix)}`: {command!r}")
    return words[4], words[5:]


class LocalBackend:
    """The guide's Compose commands as native processes; data in data_dir, like the volumes."""

    name = "local"

    def __init__(self, data_dir, port=None, log_path=None):
        self.data_dir = Path(data_dir)
        self.env = lab_env(self.data_dir, port or free_port(), RECEIVER_LAB_FAULTS="lost-ack")
        self.receiver = ReceiverProcess(self.env, log_path)
        self.workers = LocalWorkers(self.env, self.data_dir)

    def run(self, command):
        verb, rest = split_compose(command)
        if scaled := self.run_scale_profile(verb, rest):
            return scaled
        if verb == "up" and rest[-1:] == ["api"]:
            if self.receiver.proc is None or self.receiver.proc.poll() is not None:
                self.receiver.start()
            return "", 0
        if verb == "restart" and rest == ["api"]:
            self.receiver.stop()
            self.receiver.start()
            return "", 0
        if verb == "down":
            self.workers.close()
            self.receiver.stop()
            for volume in ("receiver", "workflow"):
                shutil.rmtree(self.data_dir / volume, ignore_errors=True)
            if self.receiver.log_path:  # like the removed container's log
                self.receiver.log_path.unlink(missing_ok=True)
            return "", 0
        if verb == "logs" and rest == ["api"]:  # the receiver's stderr, as `cat` would show it
            log = self.receiver.log_path
            return (log.read_text() if log and log.exists() else ""), 0
        if verb == "run" and rest[:2] == ["--rm", "workflow"]:
            done = run_workflow(rest[2:], self.env)
            return done.stdout, shell_exit_code(done.returncode)
        raise ValueError(f"the local backend has no mapping for {command!r}")

    def run_scale_profile(self, verb, rest):
        """The postgres and worker services (lab 10): (stdout, exit code), or None if not theirs."""
        services = [w for w in rest if not w.startswith("-") and "=" not in w]
        if verb == "up" and {"postgres", "worker"} & set(services):
            proc = self.receiver.proc
            if "api" in services and (proc is None or proc.poll() is not None):
                self.receiver.start()
            self.workers.start_postgres()
            if "worker" in services:
                scale = [w for w in rest if w.startswith("worker=")]
                self.workers.scale(int(scale[-1].split("=")[1]) if scale else 1)
            return "", 0
        if verb == "run" and rest[:2] == ["--rm", "worker"]:
            done = self.workers.run(rest[2:])
            return done.stdout, shell_exit_code(done.returncode)
        signals = {"pause": signal.SIGSTOP, "unpause": signal.SIGCONT}
        if verb == "kill" and rest[:1] == ["-s"] and rest[2:] == ["worker"]:
            signals["kill"] = signal.Signals[rest[1]]
        if verb in signals and rest[-1:] == ["worker"]:
            self.workers.signal(signals[verb])
            return "", 0
        return None

    def close(self):
        self.workers.close()
        self.receiver.stop()


def compose_command():
    """`docker compose` (v2), or `docker-compose` (v1) where the plugin is missing."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def docker_engine_answers():
    if not shutil.which("docker") or compose_command() is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    return probe.returncode == 0


class DockerBackend:
    """The guide's commands as written, through Compose on a real engine."""

    name = "docker"

    def __init__(self):
        self.compose = compose_command()
        if self.compose is None or not docker_engine_answers():
            raise RuntimeError("no Docker engine with Compose answers")

    def run(self, command):
        split_compose(command)  # the same commands the local backend accepts
        argv = self.compose + shlex.split(command)[2:]
        done = subprocess.run(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        return done.stdout, shell_exit_code(done.returncode)

    def close(self):
        pass


def check(step, stdout, exit_code):
    problems = []
    if exit_code != step.exit_code:
        problems.append(f"exit code {exit_code}, the guide says {step.exit_code}")
    verb = split_compose(step.command)[0]
    if verb not in LIFECYCLE and not lines_match(step.expected, stdout.splitlines()):
        problems.append("output differs from the guide")
    return problems


def run_guide(path, backend, before_step=None, after_step=None):
    """Run every command of the guide in order; return the Outcomes (stops at none)."""
    outcomes = []
    for step in parse_guide(Path(path).read_text(encoding="utf-8")):
        if before_step:
            before_step(step)
        stdout, exit_code = backend.run(step.command)
        outcome = Outcome(step, stdout, exit_code, check(step, stdout, exit_code))
        outcomes.append(outcome)
        if after_step:
            after_step(outcome)
    return outcomes


def choose_backend(name, data_dir):
    """auto: Docker when an engine answers, else local. Says which, on stderr."""
    if name == "auto":
        name = "docker" if docker_engine_answers() else "local"
        reason = "a Docker engine answers" if name == "docker" else "no Docker engine answers"
        reason += "; BACKEND=local|docker forces one"
    else:
        reason = "chosen"
    print(f"backend: {name} ({reason})", file=sys.stderr)
    if name == "docker":
        return DockerBackend()
    port = int(os.environ.get("PORT", "8000"))
    return LocalBackend(data_dir, port, log_path=Path(data_dir) / "receiver.log")


def present(paths, backend, step_mode):
    """Presentation mode for a live session: headings, commands, output, a tick per command."""
    failures = 0

    def before(step):
        print(f"\n$ {step.command}", flush=True)
        if step_mode:
            input("  (Enter to run) ")

    def after(outcome):
        nonlocal failures
        print(outcome.stdout, end="")
        if outcome.exit_code:
            print(f"[exit {outcome.exit_code}]")
        for problem in outcome.problems:
            failures += 1
            print(f"  !! {problem}; expected:\n    " + "\n    ".join(outcome.step.expected))

    for path in paths:
        title = Path(path).read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        print(f"\n=== {title} ({backend.name}) ===")
        run_guide(path, backend, before, after)
    verdict = "as the guides say" if not failures else f"{failures} differences from the guides"
    print(f"\n{len(paths)} guides run through the {backend.name} backend: {verdict}")
    return 1 if failures else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run lab guides and check their output.")
    parser.add_argument("guides", nargs="+", type=Path)
    parser.add_argument("--backend", choices=("auto", "local", "docker"), default="auto")
    parser.add_argument("--step", action="store_true", help="wait for Enter before each command")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    args = parser.parse_args(argv)
    try:
        backend = choose_backend(args.backend, args.data_dir)
    except RuntimeError as error:
        parser.exit(2, f"runner: {error}\n")
    try:
        return present(args.guides, backend, args.step)
    except (KeyboardInterrupt, EOFError):
        return 130
    except (RuntimeError, TimeoutError, ValueError) as error:  # e.g. port 8000 already taken
        print(f"runner: {error}", file=sys.stderr)
        return 1
    finally:
        backend.close()


if __name__ == "__main__":
    sys.exit(main())
