"""The drill's errors (a usage mistake; the graph failing on its own), each said in one line,
and how the drill words an exception."""

import os
import re
import traceback


class DrillError(Exception):
    """The graph, its input, observer or database cannot be drilled: the message is one line."""


class GraphFailed(DrillError):
    """The graph raised on its own, in a run the drill did not crash (its clean run, or a
    crash run before its point): the message is one line, `details` the traceback."""

    def __init__(self, message, details=""):
        super().__init__(message)
        self.details = details


def safe(text):
    """text as a report may show it: UTF-8 (a name the command line could not decode, kept as
    surrogates, becomes U+FFFD) with its control characters escaped (\\x1b, \\n)."""
    text = str(text)
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate not from the command line
        text = text.encode("utf-8", "replace").decode("utf-8")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def traceback_of(error):
    return "".join(traceback.format_exception(error))


def task_error(error):
    """'node NAME: Type: message' from LangGraph's note on a task's exception."""
    notes = " ".join(getattr(error, "__notes__", []))
    node = re.search(r"During task with name '([^']*)'", notes)
    return (f"node {node.group(1)}: " if node else "") + one_line(error)


def one_line(error):
    text = safe(" ".join(str(error).split()))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def require_posix():
    if os.name != "posix" or not hasattr(os, "fork"):
        raise DrillError(
            "effectdrill needs POSIX fork() and SIGKILL: on Windows run it under WSL or in a "
            "Linux container"
        )
