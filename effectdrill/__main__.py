"""The CLI: effectdrill (or python -m effectdrill) MODULE:GRAPH --input JSON --observe
MODULE:FUNC|http [options].

`effectdrill replay ...` resumes the unfinished threads of a copy of a checkpoint database
under the graph as it is now (effectdrill/replay.py).

Prints a table per durability mode and a summary line (--json: one JSON object per crash point,
then a summary object). Exit 0 when no effect repeated or went missing, 1 when one did (or the
clean run was flagged: a node re-run after an interrupt repeated an effect, or --expect's count
differs; or a resume failed), 2 for a usage mistake (one line on stderr), 130 on Ctrl-C.
"""

import argparse
import importlib
import json
import os
import re
import shlex
import sys
import threading

from effectdrill import html
from effectdrill.core import DURABILITIES, DrillError, drill, require_posix

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["replay"]:  # never a MODULE:GRAPH: that has a colon
        from effectdrill import replay

        return replay.main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage mistake (2), already printed
        return stop.code
    try:
        require_posix()  # before importing the user's modules
        if args.html is not None and (refused := html.refuse_foreign(args.html)):
            raise DrillError(refused)  # before the drill: a file not ours is never written
        report = drill(
            load(args.graph, "MODULE:GRAPH"),
            parse_json(args.input, "--input"),
            "http" if args.observe == "http" else load(args.observe, "--observe"),
            durability=args.durability,
            repeat=args.repeat,
            resume_with=None if args.resume_with is None else answers(args.resume_with),
            context=None if args.context is None else make_context(args.context),
            checkpoint_db=args.checkpoint_db,
            expect=None if args.expect is None else parse_json(args.expect, "--expect"),
            http_ignore=args.http_ignore,
            store=None if args.store is None else store_spec(args.store),
        )
    except DrillError as error:
        print(f"effectdrill: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("effectdrill: interrupted", file=sys.stderr)
        end_if_stranded(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    if args.html is not None:
        try:
            html.write(report, args.html, args.graph, shlex.join(["effectdrill", *argv]))
        except OSError as error:
            print(f"effectdrill: cannot write --html {args.html}: {error}", file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        for row in report.rows:
            print(json.dumps(row.as_json()))
        print(json.dumps(report.summary()))
    else:
        print(report.table())
    return EXIT_CLEAN if report.ok else EXIT_FOUND


# helpers


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        if message.startswith("unrecognized arguments: ") and "}" in message:  # split JSON
            message += '; quote a JSON value for the shell: --input \'{"thread": "{thread}"}\''
        self.exit(EXIT_USAGE, f"effectdrill: {message} (see --help)\n")


def build_parser():
    parser = Parser(
        prog="effectdrill",
        description="Kill a LangGraph graph just before each saver call of a clean run, resume "
        "it, and report the effects that repeated or went missing.",
    )
    parser.add_argument("graph", help="MODULE:NAME of a compiled graph or a function returning one")
    parser.add_argument("--input", required=True, help="the run's input as JSON ({thread} = id)")
    parser.add_argument(
        "--observe",
        required=True,
        help="MODULE:FUNC, FUNC(thread_id) -> {effect: count}; or http (the requests)",
    )
    parser.add_argument(
        "--http-ignore",
        action="append",
        default=[],
        metavar="HOST[/PATH]",
        help="requests the HTTP observer leaves out, by prefix of host:port/path or glob "
        "(a model API, say); repeatable",
    )
    parser.add_argument("--durability", choices=[*DURABILITIES, "all"], default="sync")
    parser.add_argument("--repeat", type=positive, default=1, help="runs per crash point")
    parser.add_argument(
        "--resume-with",
        help="JSON value for Command(resume=...) at interrupt(), or MODULE:FUNC called with the "
        "pending interrupts, returning the answer or {interrupt id: answer}",
    )
    parser.add_argument(
        "--expect",
        help='JSON {"effect": count} the clean run must count (default: its own counts)',
    )
    parser.add_argument("--context", help="MODULE:FUNC returning the runtime context")
    parser.add_argument(
        "--store",
        metavar="sqlite|MODULE:FUNC",
        help="the store LangGraph's platform gives a graph: sqlite (a temporary file), or a "
        "function returning yours",
    )
    parser.add_argument("--checkpoint-db", help="SQLite path or postgresql:// URL (default: temp)")
    parser.add_argument("--json", action="store_true", help="JSON lines, then a summary object")
    parser.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as one self-contained HTML file (to attach to a pull request)",
    )
    return parser


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


def end_if_stranded(code):
    """After a Ctrl-C: end the process at once, with code, if a thread is left that nothing
    will stop. A KeyboardInterrupt that lands in ThreadPoolExecutor._adjust_thread_count
    (concurrent/futures/thread.py) between a worker's start() and its entry in _threads_queues
    leaves that worker waiting for work forever, and the interpreter's exit joins it forever
    (seen with LangGraph's BackgroundExecutor, langgraph/pregel/_executor.py, which submits to
    langchain_core's ContextThreadPoolExecutor: about one Ctrl-C in 30 on a busy machine). The
    same function is plumbing.end_if_stranded: the drill stands alone, importing no file of
    yours. Without such a thread (nothing else non-daemon runs here once the drill returned) it
    returns."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def parse_json(text, option):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DrillError(f"{option} is not valid JSON: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
