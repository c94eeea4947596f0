"""The README is executed too: its demo block, its file table, its links."""

import re
import subprocess

from labs.tools.local import ROOT, free_port, lab_env
from labs.tools.runner import BLOCK, lines_match, parse_guide

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_demo_block_prints_what_it_shows(tmp_path):
    (step,) = [s for s in parse_guide(README) if s.command.startswith("make demo")]
    env = lab_env(tmp_path, free_port())  # PORT: a free port, not the default 8000
    for inherited in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):  # run it as a learner would, not
        env.pop(inherited, None)  # as a sub-make of `make test` (which prints "Entering ...")
    done = subprocess.run(
        step.command.split(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == step.exit_code, done.stdout + done.stderr
    assert lines_match(step.expected, done.stdout.splitlines()), done.stdout
    assert done.stdout.startswith("backend: local")


def test_every_console_block_in_the_readme_is_run_by_a_test():
    commands = [s.command for s in parse_guide(README)]
    assert commands == ["make demo BACKEND=local"], "a new README command needs a test"
    assert len(BLOCK.findall(README)) == 1


def test_the_files_table_matches_the_repository():
    table = README.split("## Files", 1)[1].split("\n## ", 1)[0]
    listed = {
        name.rstrip("/")
        for row in table.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([^`]+)`", row.split("|")[1])
    }
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    top_level = {path.split("/")[0] for path in tracked}
    expected = top_level - {"README.md", ".gitignore", ".dockerignore"}
    assert listed == expected


def test_relative_links_point_at_files_that_exist():
    for target in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (ROOT / target).exists(), target
    for guide in (ROOT / "labs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)\)", guide.read_text(encoding="utf-8")):
            assert (guide.parent / target).exists(), f"{guide.name}: {target}"
