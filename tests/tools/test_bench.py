"""tools.bench (make bench): this tree against a git ref of this repository, which it unpacks
with `git archive` into a temporary folder and runs as it runs this tree."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tools import bench
from tools.local import ROOT, lab_env

QUICK_TIMEOUT_S = 600  # seconds for `--quick`: ~20 s alone, minutes on a loaded 2-core machine


def git(folder, *args):
    done = subprocess.run(
        [
            "git",
            "-C",
            str(folder),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def scratch():
    """An empty folder the postgres user can enter (the throwaway cluster of the workers' figures
    runs as that user when the tests run as root; tmp_path's parents are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.long
def test_quick_bench_against_head_names_the_commit_and_measures_both_trees(scratch):
    env = {**os.environ, "TMPDIR": str(scratch)}  # where its temporary folders go, and go
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench", "--quick", "--baseline", "HEAD"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    head = git(ROOT, "rev-parse", "HEAD")
    assert figures["baseline"] == {
        "ref": "HEAD",
        "commit": head,
        "short": git(ROOT, "rev-parse", "--short", "HEAD"),
    }
    assert f"against baseline HEAD = {figures['baseline']['short']}" in done.stdout
    for tree in ("this_tree", "baseline"):
        for kind in ("fresh", "replay"):
            got = figures["receiver"][tree][kind]
            assert got["errors"] == 0 and got["rps"] > 0 and got["p99_ms"] >= got["p50_ms"] > 0
        for command in ("tickets", "post", "state"):
            assert figures["cli"][command][f"{tree}_s"] > 0
    assert figures["cli"]["failed"] == {}
    assert set(figures["sigterm_s"]) == {"this_tree", "baseline"}
    assert all(seconds > 0 for seconds in figures["sigterm_s"].values()), figures["sigterm_s"]
    assert "SIGTERM -> exit, a client stalled mid-request: this tree " in done.stdout
    assert figures["ratios"]["fresh_rps"] == pytest.approx(
        figures["receiver"]["this_tree"]["fresh"]["rps"]
        / figures["receiver"]["baseline"]["fresh"]["rps"]
    )
    assert set(figures["ratios"]) >= {"cli_tickets", "cli_post", "cli_state"}
    assert list(figures["workers"]["ops_per_s"]) == ["1"], figures["workers"]  # --quick: 1 worker
    assert figures["workers"]["ops_per_s"]["1"] > 0, figures["workers"]
    ledger = figures["ledger"]  # the ledger's cost, four ways in one run
    ways = {"post", "graph", "ledger", "task", "graph_no_fsync", "ledger_no_fsync"}
    assert set(ledger["median_ms"]) == ways
    assert set(ledger["where_ms"]) == {
        "ledger_statements_ms",
        "ledger_fsyncs_ms",
        "langgraph_fsyncs_ms",
    }
    assert all(ms > 0 for ms in ledger["median_ms"].values()), ledger
    commits = ledger["commits_per_run"]  # the ledger's: the intent, then the receipt
    assert commits["ledger"]["ledger"] == 2 and commits["graph"]["ledger"] == 0
    assert commits["ledger"]["saver"] == commits["graph"]["saver"] > 0  # LangGraph's own
    assert ledger["ledger_over_graph"] == pytest.approx(
        ledger["median_ms"]["ledger"] / ledger["median_ms"]["graph"], abs=0.01
    )
    assert "ledger cost per effect, 5 runs per way" in done.stdout
    assert list(scratch.iterdir()) == [], "a temporary folder was left behind"


@pytest.mark.fast
@pytest.mark.parametrize("ref", ["no-such-ref", "--help", "HEAD~100000"])
def test_a_ref_that_names_no_commit_is_one_line_and_exit_4(ref, capsys):
    assert bench.main([f"--baseline={ref}"]) == bench.EXIT_NO_BASELINE == 4
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"bench: --baseline {ref!r} names no commit of this repository\n"


@pytest.mark.fast
def test_a_folder_that_is_not_the_top_of_a_git_work_tree_has_no_baseline(tmp_path):
    for folder in (tmp_path, ROOT / "labs"):
        with pytest.raises(bench.NoBaseline, match="is not a git work tree"):
            bench.baseline_commit("HEAD", root=folder)


@pytest.mark.fast
def test_a_commit_without_the_receiver_or_the_cli_is_refused_after_unpacking(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "api.py").write_text("print('a receiver')\n")
    git(repo, "add", "api.py")
    git(repo, "commit", "-q", "-m", "only the receiver")
    sha, short = bench.baseline_commit("HEAD", root=repo)
    assert sha == git(repo, "rev-parse", "HEAD") and sha.startswith(short)
    with pytest.raises(bench.NoBaseline, match=r"^old \(x\) has no workflow.py: nothing to run"):
        bench.export_commit(sha, tmp_path / "out", "old (x)", root=repo)
    assert (tmp_path / "out" / "api.py").read_text() == "print('a receiver')\n"


@pytest.mark.fast
def test_a_command_the_cli_lacks_is_one_line_not_a_traceback(tmp_path):
    """A ref whose workflow.py has no such command: the table shows why, the bench goes on."""
    env = lab_env(tmp_path / "data", 9)  # no receiver needed: argparse refuses first
    why = bench.run_cli(ROOT / "workflow.py", ["no-such-command"], env)
    assert why.startswith("workflow.py no-such-command exited 2: workflow.py: ")
    assert "invalid choice: 'no-such-command'" in why and "\n" not in why


def test_a_tree_whose_commands_fail_gets_no_figure_and_one_line_each(receiver, lab, tmp_path):
    """The bench goes on: the working tree is timed, the failing one is reported, not raised."""
    # Nothing listens on port 9: the receiver is not there. One attempt (API_ATTEMPTS): the
    # client's retries of a refused connection, 1.75 s a command, are test_workflow.py's
    # (test_receiver_unreachable_exits_3_with_one_line); the line the bench keeps is the same.
    gone = lab_env(tmp_path / "gone", 9, API_ATTEMPTS="1")
    script = ROOT / "workflow.py"
    cli = bench.bench_cli({"this_tree": (script, lab), "baseline": (script, gone)}, runs=1)
    for command in ("tickets", "post"):  # they only speak HTTP, to no one
        assert cli[command]["this_tree_s"] > 0 and cli[command]["baseline_s"] is None
    # start saved prepare's checkpoint before it found no receiver: state has a thread to show
    assert cli["state"]["this_tree_s"] > 0 and cli["state"]["baseline_s"] > 0
    assert sorted(cli["failed"]) == ["baseline:post", "baseline:start", "baseline:tickets"]
    assert cli["failed"]["baseline:tickets"].startswith(
        "workflow.py tickets exited 3: workflow.py: cannot reach the receiver at "
    )
    assert all("\n" not in why for why in cli["failed"].values())
