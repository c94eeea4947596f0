"""The commands a hint names, cut out of a line as printed (issue 49: every hint is a command a
learner can paste). A hint of the lessons' programs names the native command, then its Docker
form in parentheses; each pair is checked to be the same command with tools/native.py, the
mapping the runner and docs/native.md use. Used natively by tests/workflow/
test_hints_as_printed.py, through Docker by tests/guides/test_guides.py (HINTS_FOLLOWED)."""

import re
import shlex

from tools.backends import parse_command
from tools.native import line as native_line

# A hint of the lessons' programs (python -m labs, labs.relay, labs.workers): the command, then
# its Docker form in parentheses (compose.yaml's workflow, relay and worker services run them).
# A setting the command needs goes in front of it, and is -e's through Docker (lab 15's timeout).
LABS_HINT = re.compile(
    r"(?P<native>(?:[A-Z_]+=\S+ )*python -m labs(?:\.relay|\.workers)? [^()]+?) \(Docker: "
    r"(?P<docker>docker compose -p stateful-lab run --rm (?:-e \S+ )*(?:workflow|relay|worker) "
    r"[^()]+?)\)"
)
# labs/conditions.receiver_with: the receiver started again with a lesson's override file, as
# docs/native.md's shell has it (its job %1), then the file's Docker form.
RESTART_HINT = re.compile(
    r"(?P<native>kill %1; wait; (?:[A-Z_]+=\S+ )*python -m labs\.receiver 2>>data/receiver\.log "
    r"& echo \$! >data/receiver\.pid) \(Docker: (?P<docker>docker compose -p stateful-lab -f "
    r"compose\.yaml -f \S+ up -d --build api)\)"
)


def hints(stderr):
    """The (native, Docker) commands the lessons' CLI printed in stderr, in order; each Docker
    form checked to be the native command (tools/native.py maps one to the other)."""
    found = []
    for match in LABS_HINT.finditer(stderr):
        native = match["native"]
        as_native = native_line(parse_command(match["docker"]), {}, True, False)
        assert shlex.split(as_native) == shlex.split(native), (match["docker"], native)
        found.append((native, match["docker"]))
    assert found, stderr
    return found


def printed(stderr):
    """The commands the lessons' CLI printed in stderr, each as typed natively."""
    return [native for native, _ in hints(stderr)]


def printed_for_docker(stderr):
    """The same commands, each as typed through Docker (`docker compose -p stateful-lab ...`)."""
    return [docker for _, docker in hints(stderr)]


def restart_hints(stderr):
    """The (native, Docker) receiver restarts a condition's line names; each Docker form (with
    its -f file) checked to be the native command (tools/native.py, docs/native.md)."""
    found = []
    for match in RESTART_HINT.finditer(stderr):
        as_native = native_line(parse_command(match["docker"]), {}, True, False)
        assert as_native == match["native"], (match["docker"], match["native"])
        found.append((match["native"], match["docker"]))
    return found


def restarts(stderr):
    """The receiver restarts a condition's line names, as typed natively."""
    return [native for native, _ in restart_hints(stderr)]


def restarts_for_docker(stderr):
    """The same restarts, as typed through Docker (an `up` with the lesson's -f file)."""
    return [docker for _, docker in restart_hints(stderr)]
