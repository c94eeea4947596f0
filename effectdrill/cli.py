"""What the two commands (the drill, `replay`) share: their parser, loading MODULE:NAME, JSON
options, the exit codes, and the end of a process that Ctrl-C left with a stranded thread."""

import argparse
import importlib
import json
import os
import re
import shlex
import sys
import tempfile
import threading

from effectdrill.errors import DrillError

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_GRAPH_FAILED = 3  # the graph raised on its own (its clean run): not the drill's finding
EXIT_DRILL_BUG = 4  # the drill itself failed: a bug in effectdrill
EXIT_ENGINES_DIFFER = 5  # --verify: a point's row by real kill differs from its snapshot row
EXIT_CODES = """exit codes:
  0    nothing repeated or went missing
  1    an effect repeated or went missing (or the clean run repeated one, a resume failed,
       a request went out again that the observer did not count)
  2    a usage mistake (one line on stderr)
  3    the graph failed on its own, in its clean run or a crash run before its point
       (one line; its traceback in a file, in the folder EFFECTDRILL_LOG_DIR names,
       else the temporary folder)
  4    a bug in effectdrill (one line; the traceback in a file)
  5    --verify: a point's row by real kill differs from the snapshot engine's (one line)
  130  interrupted (Ctrl-C)"""


class DrillParser(argparse.ArgumentParser):
    argv = None  # what parse_args was given: a split JSON value is rebuilt from it

    def parse_args(self, args=None, namespace=None):
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message):  # one line, not a usage dump
        if message.startswith("unrecognized arguments: ") and "}" in message:  # split JSON
            message += "; quote a JSON value for the shell, as one word: --input " + (
                rejoined_input(self.argv or []) or "'{...}'"
            )
        self.exit(EXIT_USAGE, f"effectdrill: {message} (see --help)\n")


def rejoined_input(argv):
    """The --input value a shell split at its spaces, joined again and quoted for a POSIX shell
    (the user's own JSON, not an example that may not fit their graph), or None."""
    if "--input" not in argv:
        return None
    words = argv[argv.index("--input") + 1 :]
    for end in range(1, len(words) + 1):
        try:
            json.loads(" ".join(words[:end]))
        except ValueError:
            continue
        return shlex.quote(" ".join(words[:end]))
    return None


def positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more: {text!r}")
    return value


def load(name, what):
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise DrillError(f"{what} must be MODULE:NAME, not {name!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current folder, as `python -m` does
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise DrillError(f"cannot import {module_name}: {type(error).__name__}: {error}") from None
    try:
        value = module
        for part in attribute.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise DrillError(f"{module_name} has no {attribute}") from None
    return value


def make_context(name):
    factory = load(name, "--context")
    if not callable(factory):
        raise DrillError(f"--context {name} is not callable (a function returning the context)")
    try:
        return factory()
    except Exception as error:
        raise DrillError(f"--context {name} raised {type(error).__name__}: {error}") from None


def store_spec(text):
    if text == "sqlite":
        return text
    factory = load(text, "--store")
    if not callable(factory):
        raise DrillError(f"--store {text} is not callable (a function returning a store)")
    return factory


def answers(text):
    """--resume-with: a JSON value, else MODULE:FUNC (a function of the interrupts)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if not re.fullmatch(r"[\w.]+:[\w.]+", text):
            raise DrillError(
                f"--resume-with is neither JSON nor MODULE:FUNC: {text!r} (a JSON string needs "
                "its quotes: '\"ok\"')"
            ) from None
    function = load(text, "--resume-with")
    if not callable(function):
        raise DrillError(f"--resume-with {text} is not callable (a function of the interrupts)")
    return function


LOG_DIR = "EFFECTDRILL_LOG_DIR"  # the folder a traceback is kept in; else the temporary folder
READERS = []  # read_logs_with(): where a kept log's path alone is not enough to read it


def keep_log(prefix, text):
    """Write text to a new file (made by us: never an existing file, never through a link) in
    the folder EFFECTDRILL_LOG_DIR names, else (unset, or no file can be made there) in the
    temporary folder, and return how to read it: its path, and the command that reads it
    where read_logs_with() gave one (a container's folder, gone from the host's view)."""
    for folder in (os.environ.get(LOG_DIR) or None, None):
        try:
            fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=folder)
            break
        except OSError:
            continue  # the temporary folder next: a traceback is never lost to a setting
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as log:
        log.write(text)
    read = next((words for reader in READERS if (words := reader(path))), None)
    return f"{path}; {read}" if read else path


def read_logs_with(reader):
    """reader(path): the words that read a kept log at path where the path alone is not enough
    (a folder inside a container: e.g. "read it: docker compose ... cat PATH"), else None."""
    if reader not in READERS:  # given at each call of a command's main(): kept once
        READERS.append(reader)


def exit_if_stranded(code):
    """After a Ctrl-C: end the process at once, with code, if a thread is left that nothing
    will stop. A KeyboardInterrupt that lands in ThreadPoolExecutor._adjust_thread_count
    (concurrent/futures/thread.py) between a worker's start() and its entry in _threads_queues
    leaves that worker waiting for work forever, and the interpreter's exit joins it forever
    (seen with LangGraph's BackgroundExecutor, langgraph/pregel/_executor.py, which submits to
    langchain_core's ContextThreadPoolExecutor: about one Ctrl-C in 30 on a busy machine). The
    workflow's CLI has a function of its own for this: the drill stands alone, importing no
    file of yours. Without such a thread (nothing else non-daemon runs here once the drill
    returned) it returns."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def json_option(text, option):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DrillError(f"{option} is not valid JSON: {error}") from None
