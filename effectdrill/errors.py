"""The drill's one error (a usage mistake, said in one line) and how it words an exception."""

import os
import re


class DrillError(Exception):
    """The graph, its input, observer or database cannot be drilled: the message is one line."""


def task_error(error):
    """'node NAME: Type: message' from LangGraph's note on a task's exception."""
    notes = " ".join(getattr(error, "__notes__", []))
    node = re.search(r"During task with name '([^']*)'", notes)
    return (f"node {node.group(1)}: " if node else "") + one_line(error)


def one_line(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def require_posix():
    if os.name != "posix" or not hasattr(os, "fork"):
        raise DrillError(
            "effectdrill needs POSIX fork() and SIGKILL: on Windows run it under WSL or in a "
            "Linux container"
        )
