"""Write a starter: the core files of this repository, copied unchanged, and a few files of its own.

    python -m tools.starter DEST        (make starter DEST=dir)

DEST gets CORE byte for byte (what the tests of this repository run is what a copier gets) and
every file under tools/starter/: a README, a Dockerfile and compose.yaml with their own image
and project names, requirements.in and its hashed lock with only what the core imports, and a
unittest suite that crashes a run in the window of every effect workflow.py declares, drills its
graph and counts the tickets.
Exit codes: 0 written; 2 DEST exists and is not an empty folder, is a symbolic link, lies under
a file or inside this repository, or a core file is missing (nothing is written).
"""

import argparse
import shutil
import sys
from pathlib import Path

from tools import safefiles
from tools.local import ROOT

CORE = (  # copied unchanged; effectdrill without its pytest plugin (the starter has no pytest)
    # and without taught.py (where the labs teach each fix: the starter has no labs)
    "failpoints.py",
    "tracing.py",  # off unless TRACE is set (needs OpenTelemetry, which the starter leaves out)
    "httpguard.py",
    "receiverdb.py",  # the receiver's SQLite connection and transactions
    "keyretention.py",  # how long the receiver honours a key
    "receivermetrics.py",  # the receiver's GET /metrics
    "receiversettings.py",  # the receiver's settings and the server they open
    "api.py",  # the core receiver: labs/receiver.py is the lab's, which extends it
    "effects.py",  # an effect declared, performed once per key; reconcile
    "ledger.py",  # the ledger's storage (SQLite), its rows and leases
    "settling.py",  # reconcile: open effects settled by a lookup or a person's word
    "ledger_tables.py",  # the ledger's tables and a receipt's integrity hash
    "postgres_ledger.py",  # the ledger in Postgres
    "providers.py",  # a provider's declaration, HTTP client and what its answers mean
    "checkpoints.py",  # the checkpointer (SQLite, or Postgres) and the thread a command names
    "commandline.py",  # the parser, the settings, each error as one line and an exit code
    "exitcodes.py",  # the exit codes, UserError, the JSON lines
    "hints.py",  # what a stopped command says, and the command that goes on
    "smtpclient.py",  # an SMTP provider's client and what its answers mean (README: Add a provider)
    "workflow.py",
    "effectdrill/__init__.py",
    "effectdrill/__main__.py",
    "effectdrill/advice.py",
    "effectdrill/api.py",
    "effectdrill/cli.py",
    "effectdrill/errors.py",
    "effectdrill/html.py",
    "effectdrill/introspect.py",
    "effectdrill/kill.py",
    "effectdrill/kinds.py",
    "effectdrill/outbound.py",
    "effectdrill/plan.py",
    "effectdrill/processes.py",
    "effectdrill/replay.py",
    "effectdrill/report.py",
    "effectdrill/resent.py",
    "effectdrill/restart.py",
    "effectdrill/runs.py",
    "effectdrill/savers.py",
    "effectdrill/trace.py",
)
OWN = ROOT / "tools" / "starter"  # the starter's own files, copied as they are
EXIT_USAGE = 2


def write_starter(dest):
    """Copy CORE and OWN's files into dest (new or empty); the names written, sorted."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in CORE:
        (dest / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(ROOT / name, dest / name)
    caches = shutil.ignore_patterns("__pycache__", ".ruff_cache")  # made by running its tools here
    shutil.copytree(OWN, dest, dirs_exist_ok=True, ignore=caches)
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())


def refusal(dest):
    """Why DEST cannot be the starter's folder, or None: it must be a new or empty folder, not
    a symbolic link (the files would land where it points), not under a file, and outside
    this repository (inside tools/starter, every later starter would carry a copy)."""
    if dest.is_symlink():
        return f"DEST {dest} is a symbolic link; name a real folder (new or empty)"
    above = dest.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"DEST {dest} is under {above}, a file, not a folder; name another DEST"
    try:
        safefiles.refuse_source(dest, "DEST")
    except safefiles.NotAFile as error:
        return str(error)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        return f"{dest} exists and is not an empty folder; name a new DEST"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="make starter", description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path, help="a new or empty folder")
    args = parser.parse_args(argv)
    if why := refusal(args.dest):
        print(f"starter: {why}", file=sys.stderr)
        return EXIT_USAGE
    missing = [name for name in CORE if not (ROOT / name).is_file()]
    if missing:
        print(f"starter: {', '.join(missing)} missing from {ROOT}", file=sys.stderr)
        return EXIT_USAGE
    try:
        write_starter(args.dest)
    except OSError as error:  # the disk full, a folder made read-only meanwhile
        print(f"starter: cannot write into {args.dest}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"starter: wrote {len(CORE)} core files and the starter's own into {args.dest}")
    print(f"next: cd {args.dest} and follow its README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
