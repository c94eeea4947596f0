"""The CLI: effectdrill (or python -m effectdrill) MODULE:GRAPH --input JSON --observe
MODULE:FUNC|http [options].

`effectdrill replay ...` resumes the unfinished threads of a copy of a checkpoint database
under the graph as it is now (effectdrill/replay.py).

Prints a table per durability mode and a summary line (--json: one JSON object per crash point,
then a summary object). Exit 0 when no effect repeated or went missing, 1 when one did (or the
clean run was flagged: a node re-run after an interrupt repeated an effect, or --expect's count
differs; or a resume failed), 2 for a usage mistake (one line on stderr), 3 when the graph
failed on its own, 4 for a bug in effectdrill (each one line, the traceback in a file), 130 on
Ctrl-C (effectdrill/cli.py's EXIT_CODES, shown by --help).
"""

import argparse
import json
import os
import re
import shlex
import sys

from effectdrill import html, replay
from effectdrill.api import DURABILITIES, drill
from effectdrill.cli import (
    EXIT_CLEAN,
    EXIT_CODES,
    EXIT_DRILL_BUG,
    EXIT_ENGINES_DIFFER,
    EXIT_FOUND,
    EXIT_GRAPH_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    DrillParser,
    answers,
    exit_if_stranded,
    json_option,
    keep_log,
    load,
    make_context,
    positive,
    store_spec,
)
from effectdrill.errors import DrillError, GraphFailed, one_line, require_posix, traceback_of
from effectdrill.snapshot import ENGINES
from effectdrill.world import SqliteWorld


def main(argv=None):
    """The command: its exit code (EXIT_* in effectdrill/cli.py, listed in --help)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["replay"]:  # never a MODULE:GRAPH: that has a colon
        return replay.main(argv[1:])
    try:
        args = build_drill_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage mistake (2), already printed
        return stop.code
    try:
        return drill_and_report(args, argv)
    except GraphFailed as error:  # the graph's own failure: one line, its traceback kept
        path = keep_log("effectdrill-graph-failed-", error.details)
        complain(f"{error} (its traceback: {path})")
        return EXIT_GRAPH_FAILED
    except DrillError as error:
        complain(str(error))
        return EXIT_USAGE
    except KeyboardInterrupt:
        complain("interrupted")
        exit_if_stranded(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as error:  # the drill's own: never a traceback on the terminal
        path = keep_log("effectdrill-bug-", traceback_of(error))
        complain(
            f"a bug in effectdrill: {one_line(error)} (the traceback: {path}; please report it)"
        )
        return EXIT_DRILL_BUG


def drill_and_report(args, argv):
    require_posix()  # before importing the user's modules
    if args.html is not None and (refused := html.refuse_foreign(args.html)):
        raise DrillError(refused)  # before the drill: a file not ours is never written
    report = drill(
        load(args.graph, "MODULE:GRAPH"),
        json_option(args.input, "--input"),
        "http" if args.observe == "http" else load(args.observe, "--observe"),
        durability=args.durability,
        repeat=args.repeat,
        resume_with=None if args.resume_with is None else answers(args.resume_with),
        context=None if args.context is None else make_context(args.context),
        checkpoint_db=args.checkpoint_db,
        expect=None if args.expect is None else json_option(args.expect, "--expect"),
        http_ignore=args.http_ignore,
        store=None if args.store is None else store_spec(args.store),
        allow_no_effects=args.allow_no_effects,
        engine=args.engine,
        verify=args.verify,
        world=world_spec(args.world),
    )
    if args.html is not None:
        try:
            html.write(report, args.html, args.graph, typed(argv))
        except OSError as error:
            raise DrillError(f"cannot write --html {args.html}: {error}") from None
    if args.json:
        for row in report.rows:
            print(json.dumps(row.as_json()))
        print(json.dumps(report.summary()))
    else:
        print(report.table())
    if args.verify and not report.verified:  # every row a real kill: none to run again
        kills = [f"{mode}: {why}" for mode, (used, why) in report.engines.items() if used == "kill"]
        complain(
            f"--verify {args.verify}: nothing to verify, no row was made by the snapshot engine"
            + (f" ({'; '.join(kills)})" if kills else "")
        )
    differ = [v for v in report.verified if not v["same"]]
    if differ:
        complain(
            f"--verify: the engines differ at {differ[0]['point']} ({differ[0]['durability']}"
            f"): snapshot {brief(differ[0]['snapshot'])}, kill {brief(differ[0]['kill'])}"
        )
        return EXIT_ENGINES_DIFFER
    return EXIT_CLEAN if report.ok else EXIT_FOUND


def brief(seen):
    """What one engine found at a point, in a few words: its verdict and counts."""
    counts = ", ".join(f"{effect} {c[0] if c else '-'}" for effect, c in seen["counts"].items())
    return f"{seen['verdict']} ({counts})"


def world_spec(values):
    """--world: SQLite files or folders, or $NAME (the folder of the file that environment
    variable names: each resumer gets a copy of its own), or MODULE:FUNC returning a world."""
    if not values:
        return None
    if len(values) == 1 and re.fullmatch(r"[\w.]+:[\w.]+", values[0]):
        return load(values[0], "--world")
    paths = [v for v in values if not v.startswith("$")]
    return SqliteWorld(*paths, env=[v[1:] for v in values if v.startswith("$")])


def typed(argv):
    """The command line as a person types it: `python -m effectdrill` when run so, each argument
    quoted only when the shell needs it, in single quotes, or double ones around a single
    quote (`"it's"`), not shlex's '"'"' splices."""
    by_module = sys.argv[0].endswith(os.path.join("effectdrill", "__main__.py"))
    program = "python -m effectdrill" if by_module else "effectdrill"
    words = []
    for arg in argv:
        if arg and shlex.quote(arg) == arg:
            words.append(arg)
        elif "'" not in arg:
            words.append(f"'{arg}'")
        else:
            words.append('"' + re.sub(r'(["$`\\])', r"\\\1", arg) + '"')
    return " ".join([program, *words])


def complain(line):
    print(f"effectdrill: {line}", file=sys.stderr)


def build_drill_parser():
    parser = DrillParser(
        prog="effectdrill",
        description="Kill a LangGraph graph just before each saver call of a clean run, resume "
        "it, and report the effects that repeated or went missing.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.add_argument(
        "--allow-no-effects",
        action="store_true",
        help="drill a clean run that counts no effect (refused by default: it tests nothing)",
    )
    parser.add_argument("--context", help="MODULE:FUNC returning the runtime context")
    parser.add_argument(
        "--store",
        metavar="sqlite|MODULE:FUNC",
        help="the store LangGraph's platform gives a graph: sqlite (a temporary file), or a "
        "function returning yours",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="snapshot: one clean run, each crash state restored from its snapshots; kill: a "
        "real kill per crash state; auto (default): snapshot where the world is declared and "
        "restorable, else kill (the table says which, and why)",
    )
    parser.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="N",
        help="also run N random snapshot points by real kill; exit 5 if their rows differ",
    )
    parser.add_argument(
        "--world",
        action="append",
        default=[],
        metavar="PATH|$NAME|MODULE:FUNC",
        help="what a resume can touch, for the snapshot engine: SQLite files or folders, $NAME "
        "(the folder of the file in that environment variable), or a function returning an "
        "object with snapshot() and restore(image); repeatable",
    )
    parser.add_argument("--checkpoint-db", help="SQLite path or postgresql:// URL (default: temp)")
    parser.add_argument("--json", action="store_true", help="JSON lines, then a summary object")
    parser.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as one self-contained HTML file (to attach to a pull request)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
