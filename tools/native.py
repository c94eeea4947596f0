"""A guide's Compose command as a learner types it natively: docs/native.md's table.

The guides show `docker compose -p stateful-lab ...` lines. Without Docker, a learner starts the
receiver in the background, runs labs/cli.py and labs/workers.py, and stops them by job or by pid;
`make
demo BACKEND=local` prints that line under each guide command, and docs/native.md's table
shows the same lines (a test compares them word for word). The local backend (backends.py) runs
the same mapping as processes; this module writes it out as shell, from the parsed command and
the lab's state:

    line(cmd, faults, running, postgres_up)   the line for one parsed GuideCommand
    scale_line(cmd)                           lab 10's postgres and worker commands

An override file (`-f labs/lost-ack.compose.yaml`) means an environment for the api natively
(override_environment), and `run --rm --entrypoint python workflow ARGS` means `python ARGS`.
"""

import shlex

from tools.local import ROOT
from tools.native_workers import HEARTBEAT_S

PID_FILE = "data/receiver.pid"  # where the native commands we show keep the receiver's pid
PYTHON_IN_THE_IMAGE = ["--rm", "--entrypoint", "python", "workflow"]  # run ... -c CODE
WORKERS = "python -m tools.native_workers"  # the workers it started (pid files in data/)
# Lab 10's `up -d postgres` exports the cluster's URL as CHECKPOINT_DB: its reset puts back
# docs/native.md's SQLite file, or every later lab in that shell would ask a cluster that is gone
# (exit 3).
# The reset deletes data/ only when no receiver still serves it: typed in a second shell, `kill
# %1` stops nothing, and the first shell's receiver would lose its files (make reset stops it).
RESET_DATA = (
    'if kill -0 "$(cat data/receiver.pid 2>/dev/null)" 2>/dev/null; then echo "data/ kept: the '
    'receiver (pid $(cat data/receiver.pid)) still serves it; make reset stops it"; '
    "else rm -rf data; fi"
)
VOLUME = "/data/"  # the workflow container's volume (compose.yaml): natively, data/workflow/
SQLITE_AGAIN = "export CHECKPOINT_DB=data/workflow/checkpoints.sqlite; unset WORKER_HEARTBEAT_S"


def line(cmd, faults, running, postgres_up):
    """The shell line for the parsed guide command cmd, or None where it is typed as is.

    faults: the environment the receiver was last started with (an override file's, {} for
    none); running: whether it runs now (a second `up` with another environment restarts it, as
    Compose recreates the container); postgres_up: whether lab 10's cluster was started (then
    `down -v` stops the workers and the Postgres tool first)."""
    if cmd.verb == "sleep":
        return None  # typed as is
    if (scaled := scale_line(cmd)) is not None:
        return scaled
    wanted = override_environment(cmd.overrides) if cmd.verb == "up" else faults
    serve = "".join(f"{k}={shlex.quote(v)} " for k, v in wanted.items())
    serve += f"python -m labs.receiver 2>>data/receiver.log & echo $! >{PID_FILE}"  # docs/native.md
    stop = "kill %1; wait"
    if cmd.verb == "up" and running and wanted != faults:
        return f"{stop}; {serve}"  # another environment: as `restart`, with it
    if cmd.verb == "up":
        return f"mkdir -p data; {serve}"
    if cmd.verb == "restart":
        return f"{stop}; {serve}"
    if cmd.verb == "down":
        stop = "kill %1 2>/dev/null; wait"  # a guide's first line: there may be no job yet
        if postgres_up:  # lab 10: the workers and the cluster too, and the SQLite file again
            stop = f"{WORKERS} stop; {stop}"  # the workers, then the pg tool (data/pg.pid)
            return f"{stop}; {RESET_DATA}; {SQLITE_AGAIN}"
        return f"{stop}; {RESET_DATA}"
    if cmd.verb == "logs":
        return "cat data/receiver.log"
    if cmd.args[:2] == ["--rm", "drill"]:
        return "python -m labs.drill " + shlex.join(cmd.args[2:])
    if cmd.args[:4] == PYTHON_IN_THE_IMAGE:
        return "python " + shlex.join(cmd.args[4:])
    env, args = cmd.run_env()
    program = "-m labs.relay" if args[:2] == ["--rm", "relay"] else "-m labs"  # lab 19: the relay
    return "".join(f"{k}={shlex.quote(in_data(v))} " for k, v in env.items()) + (
        f"python {program} " + shlex.join(args[2:])
    )


def in_data(value, data="data"):
    """A `-e K=V` value as natively typed: a path in the workflow's volume (/data/X, lab 05's
    TRACE file) is the same file in the native data folder's workflow/ (data/workflow/X)."""
    return f"{data}/workflow/{value[len(VOLUME) :]}" if value.startswith(VOLUME) else value


def scale_line(cmd):
    """Lab 10's postgres and worker commands as a learner types them natively; None for others.
    WORKER_HEARTBEAT_S as compose.yaml sets it, so a stalled job moves on after the same time.
    Workers are started, signalled and stopped by pid (tools.native_workers), never by
    name."""
    services = [w for w in cmd.args if not w.startswith("-") and "=" not in w]
    if cmd.verb == "up" and services == ["postgres"]:
        return (
            "python -m tools.pg >data/pg.url & echo $! >data/pg.pid; "
            "until [ -s data/pg.url ]; do sleep 0.2; done; "
            f"export CHECKPOINT_DB=$(cat data/pg.url) WORKER_HEARTBEAT_S={HEARTBEAT_S}"
        )
    if cmd.verb == "up" and services == ["worker"]:
        scale = [w.split("=")[1] for w in cmd.args if w.startswith("worker=")] or ["1"]
        return f"{WORKERS} up {scale[-1]}"
    if cmd.verb == "run" and cmd.args[:2] == ["--rm", "worker"]:
        return "python -m labs.workers " + shlex.join(cmd.args[2:])
    if cmd.verb == "kill" and cmd.args[:1] == ["-s"] and cmd.args[2:] == ["worker"]:
        return f"{WORKERS} signal {cmd.args[1]}"
    if cmd.verb in ("pause", "unpause") and cmd.args == ["worker"]:
        return f"{WORKERS} signal {'SIGSTOP' if cmd.verb == 'pause' else 'SIGCONT'}"
    return None


# helpers


def override_environment(files):
    """The environment the override files give the api service: what they mean natively, for
    the line above and for the local backend's receiver."""
    import yaml  # a dev requirement; only override files need it

    env = {}
    for name in files:
        spec = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
        env.update(spec["services"]["api"]["environment"])
    return {name: str(value) for name, value in env.items()}
