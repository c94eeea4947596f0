"""tools/pytest_cpu.py, the plugin docs/performance.md's figures of make test's CPU name: each
test's CPU, its own process's and its children's, and the summary of a run."""

import json
import sys

from tools.local import ROOT, run_command

BUSY = """
import subprocess, sys

def test_spins_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)

def test_idle():
    pass
"""


def test_each_test_gets_its_own_and_its_childrens_cpu_and_the_summary_ranks_them(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY, encoding="utf-8")
    out = tmp_path / "cpu"
    env = {"PYTEST_CPU_OUT": str(out), "PYTHONPATH": str(ROOT)}
    ran = run_command(
        [sys.executable, "-m", "pytest", "-q", "-p", "tools.pytest_cpu", "-p", "no:cacheprovider",
         "-p", "no:randomly", str(tmp_path / "test_busy.py")],
        env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    rows = {r["id"].split("::")[1]: r for r in map(json.loads, open(f"{out}-main.jsonl"))}
    assert set(rows) == {"test_spins_in_a_child", "test_idle"}
    spun, idle = rows["test_spins_in_a_child"], rows["test_idle"]
    assert spun["children"] > 0.01 and idle["children"] == 0, rows  # the child's, where it ran
    summary = run_command([sys.executable, "-m", "tools.pytest_cpu", str(out)], cwd=ROOT)
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("2 tests: ") and lines[1].endswith("::test_spins_in_a_child")
