"""Write a reference starter: the lab's own files with every lab-only part dropped.

    python -m labs.tools.starter DEST

The lab marks what only a lesson needs (the crash and fault switches, the naive and node-uuid
modes, the durability flag) in api.py, workflow.py, Dockerfile and compose.yaml:

    some_line()  # lab-only            one line, dropped
    # lab-only: begin                  a block, dropped with both marker lines
    ...
    # lab-only: end

DEST gets those four files without the marked lines, requirements.txt as it is, and the
starter's README.md and test_smoke.py from labs/tools/starter/. Nothing is kept twice: the
code a copier gets is the code the lab's tests run, less the marked lines.
Exit codes: 0 written; 2 bad arguments; 3 DEST exists and is not empty (nothing is touched).
"""

import argparse
import re
import shutil
import sys
from pathlib import Path

from labs.tools.local import ROOT

FENCED = ("api.py", "workflow.py", "Dockerfile", "compose.yaml")
COPIED = ("requirements.txt", ".dockerignore", "httpguard.py", "failpoints.py")
TEMPLATES = ROOT / "labs" / "tools" / "starter"  # README.md and test_smoke.py of the starter
MARK = re.compile(r"#\s*lab-only\b(?P<rest>.*)$")
EXIT_USAGE, EXIT_DEST_NOT_EMPTY = 2, 3


def strip_lab_only(text):
    """The text without lab-only lines and blocks; ValueError for an unbalanced block."""
    kept, depth = [], 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        mark = MARK.search(line)
        rest = mark.group("rest").strip() if mark else ""
        if mark and rest == ": begin":
            depth += 1
        elif mark and rest == ": end":
            if depth == 0:
                raise ValueError(f"line {number}: lab-only: end without a begin")
            depth -= 1
        elif not mark and depth == 0:
            kept.append(line)
    if depth:
        raise ValueError("a lab-only: begin has no end")
    return re.sub(r"\n{4,}", "\n\n\n", "".join(kept))  # a dropped block leaves no wider gap


def write_starter(dest):
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in FENCED:
        source = ROOT / name
        try:
            text = strip_lab_only(source.read_text(encoding="utf-8"))
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
        (dest / name).write_text(text, encoding="utf-8")
    for name in COPIED:
        shutil.copyfile(ROOT / name, dest / name)
    for template in sorted(TEMPLATES.iterdir()):
        shutil.copyfile(template, dest / template.name)
    return sorted(p.name for p in dest.iterdir())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="make starter", description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path, help="a new or empty folder")
    args = parser.parse_args(argv)
    if args.dest.exists() and (not args.dest.is_dir() or any(args.dest.iterdir())):
        print(f"starter: {args.dest} exists and is not an empty folder; pick a new DEST")
        return EXIT_DEST_NOT_EMPTY
    files = write_starter(args.dest)
    print(f"starter: wrote {', '.join(files)} to {args.dest}")
    print(f"next: cd {args.dest} and follow its README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
