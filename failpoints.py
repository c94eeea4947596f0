"""Named failpoints: `fail("after-ack")` marks a dangerous moment in the code, and does nothing
unless a test or the environment turns that point on.

The idea comes from tikv/fail-rs and FoundationDB's BUGGIFY: the fault points live in the product
code, off by default, so the code itself says where its crash windows are, and a test can open
exactly that window without patching anything.

    FAILPOINTS="after-ack=kill"                       one point
    FAILPOINTS="after-prepare=term;after-ack=sleep(0.3)"   several, separated by ";"
    FAILPOINTS="after-ack=pause(/tmp/t1/after-ack)"   held there until a test says go

Actions:
    off          nothing (the default for every point)
    kill         SIGKILL this process: nothing after it runs, no finally, no atexit (exit 137)
    term         SIGTERM this process, as a deploy or `docker compose stop` does first
    sleep(S)     wait S seconds, then go on
    raise        raise FailpointError here
    hold         wait until release(name) is called (from another thread), then go on
    pause(PATH)  another process's hold: create the file PATH (so a test sees the point reached),
                 then wait until unpause(PATH) writes "go" into it, then go on; a caller that
                 arrives once it says go passes, until PATH is deleted (the pause of tikv/fail-rs,
                 released by a file)
    drop-answer  returned to the caller, which acts on it (a server drops its answer)
    on           returned to the caller, which does the point's own fault (a webhook
                 sender's: redeliver, reorder)

A program names its points and turns them on in main():
    failpoints.configure(os.environ.get("FAILPOINTS", ""), known=POINTS)
A test turns them on for one block of code (in this thread and what it starts with its context):
    with failpoints.scoped({"after-ack": "raise"}):
        ...
A test holds a process it started at a point, looks at it there, then lets it go on:
    env["FAILPOINTS"] = f"after-ack=pause({path})"    ... start the process with env
    wait_until(path.exists, ...)                       it is at after-ack, and stays there
    failpoints.unpause(path)                           it goes on
    path.unlink()                  once it has gone on: the next caller waits there again
Standard library only; importing this module changes nothing.
"""

import contextlib
import contextvars
import os
import re
import signal
import sys
import threading
import time

ACTIONS = ("off", "kill", "term", "sleep(S)", "raise", "hold", "pause(PATH)", "drop-answer", "on")
RETURNED = ("drop-answer", "on")  # actions fail() hands back to its caller instead of doing them
SLEEP = re.compile(r"sleep\((\d+(?:\.\d+)?)\)")
PAUSE = re.compile(r"pause\((.+)\)")
GO = "go"  # what unpause() writes into a pause's file
PAUSE_POLL_S = 0.01  # how often a paused caller looks for its go


class FailpointError(Exception):
    """Raised by a point whose action is `raise`."""


class FailpointSpecError(ValueError):
    """A FAILPOINTS value naming an unknown point or action: the message is one line."""


def fail(name, once_per=None):
    """The point `name`: None when it is off, else do its action (or return it, see RETURNED).

    once_per: when given, the point fires at most once for each value: a server passes a request's
    token, so each caller that asks for the fault meets it once, and its retry does not.
    """
    action = _scoped.get().get(name) or _points.get(name)
    if action is None or action == "off":
        return None
    if once_per is not None:
        with _lock:
            if (name, once_per) in _fired:
                return None
            _fired.add((name, once_per))
    if _announce is not None:
        _announce(name, action)
    if action == "kill":
        with contextlib.suppress(Exception):  # what was printed must reach its reader first
            sys.stdout.flush()
            sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "raise":
        raise FailpointError(f"failpoint {name}")
    elif action == "hold":
        _release_event(name).wait()
    elif match := SLEEP.fullmatch(action):
        time.sleep(float(match.group(1)))
    elif match := PAUSE.fullmatch(action):
        _pause(match.group(1))
    else:
        return action  # RETURNED: the caller acts
    return None


def configure(spec, known, announce=None):
    """Turn on the points in spec ("name=action;..."); raise FailpointSpecError for an unknown
    point or action. announce(name, action), if given, is called as each point fires."""
    global _announce
    points = parse(spec, known)
    with _lock:
        _points.clear()
        _points.update(points)
        _fired.clear()
        _announce = announce


def parse(spec, known):
    """{name: action} from "name=action;..." (empty parts ignored)."""
    points = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, action = (s.strip() for s in part.partition("="))
        if name not in known:
            raise FailpointSpecError(
                f"FAILPOINTS: unknown point {name!r}; known points: {', '.join(known)}"
            )
        if action not in ACTIONS and not (SLEEP.fullmatch(action) or PAUSE.fullmatch(action)):
            raise FailpointSpecError(
                f"FAILPOINTS: unknown action {action!r} for {name}; actions: {', '.join(ACTIONS)}"
            )
        points[name] = action
    return points


@contextlib.contextmanager
def scoped(points):
    """Turn points on ({name: action}) for the code inside the block: this thread, and the
    threads that run with a copy of its context (asyncio.to_thread, LangGraph's executors)."""
    token = _scoped.set({**_scoped.get(), **points})
    try:
        yield
    finally:
        _scoped.reset(token)


def release(name):
    """Let every caller held at `name` go on (and any that arrives later, until reset())."""
    _release_event(name).set()


def unpause(path):
    """Let every process paused at pause(path) go on (and any that arrives there later)."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(GO)


def reset():
    """Every point off, nothing held, nothing fired: a test's clean slate."""
    global _announce
    with _lock:
        _points.clear()
        _fired.clear()
        _holds.clear()
        _announce = None


# helpers

_lock = threading.Lock()
_points = {}  # name -> action, from configure()
_scoped = contextvars.ContextVar("failpoints", default={})  # noqa: B039 (never mutated)
_fired = set()  # (name, once_per value) already fired
_holds = {}  # name -> threading.Event, set by release()
_announce = None


def _release_event(name):
    with _lock:
        return _holds.setdefault(name, threading.Event())


def _pause(path):
    """The first caller creates the file (a test waits for it to exist); every caller then waits
    for its go. O_EXCL: a caller never overwrites a go that is already there."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    while _read(path) != GO:
        time.sleep(PAUSE_POLL_S)


def _read(path):
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except FileNotFoundError:  # deleted under it: as if not yet told
        return ""
