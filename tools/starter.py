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


def core_files(root):
    """The core, as the tree has it: every Python file at the top of root and effectdrill/'s
    Python files and README.md, relative paths, sorted. Anything else is the lab's."""
    drill = root / "effectdrill"
    names = [p.name for p in root.glob("*.py")]
    names += [f"effectdrill/{p.name}" for p in drill.glob("*.py")]
    names += ["effectdrill/README.md"] if (drill / "README.md").is_file() else []
    return tuple(sorted(names))


CORE = core_files(ROOT)  # copied unchanged
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


def dest_refusal(dest):
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
    if why := dest_refusal(args.dest):
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
