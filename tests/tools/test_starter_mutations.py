"""tools/starter_mutations.py: each mutation still applies to the core as it is now, and a
cheap one of them is caught by the test of the starter's suite that should catch it. The whole
score (every mutation against the whole suite: minutes) is the tool's, run by hand:
`python -m tools.starter_mutations`."""

import ast
import shutil
import sys

import pytest

from tools import starter, starter_mutations
from tools.local import run_command


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    dest = tmp_path_factory.mktemp("mutations") / "fresh"
    starter.write_starter(dest)
    return dest


@pytest.mark.parametrize("mutation", starter_mutations.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_changes_its_scope_once_and_leaves_valid_python(fresh, tmp_path, mutation):
    folder = tmp_path / "mutated"
    folder.mkdir()
    shutil.copyfile(fresh / mutation.file, folder / mutation.file)
    before = (folder / mutation.file).read_text(encoding="utf-8")
    starter_mutations.mutate(folder, mutation)
    after = (folder / mutation.file).read_text(encoding="utf-8")
    assert after != before and after.count(mutation.new) == before.count(mutation.new) + 1
    ast.parse(after)


def test_a_mutation_that_no_longer_applies_is_an_error_not_a_pass(fresh, tmp_path, capsys):
    stale = starter_mutations.Mutation("stale", "effects.py", "claim", "no such text", "x")
    (tmp_path / "m").mkdir()
    shutil.copyfile(fresh / "effects.py", tmp_path / "m" / "effects.py")
    with pytest.raises(ValueError, match="0 times, not once"):
        starter_mutations.mutate(tmp_path / "m", stale)
    assert starter_mutations.main(["no such mutation"]) == starter_mutations.EXIT_STALE
    assert "no mutation" in capsys.readouterr().err


def test_unknown_not_treated_as_open_is_caught_by_the_late_answer_test(fresh, tmp_path):
    """The cheapest of the five a review found surviving (REVIEW part E): in-process, one
    stand-in provider. The same test passes on the starter as it is."""
    late = "tests.test_failures.LateAnswerTest.test_nothing_is_sent_again_before_the_settle_time"
    late += "_and_the_late_one_is_adopted"
    (mutation,) = [
        m for m in starter_mutations.MUTATIONS if m.name == "unknown not treated as open"
    ]
    folder = tmp_path / "mutated"
    shutil.copytree(fresh, folder)
    starter_mutations.mutate(folder, mutation)
    for where, passes in ((fresh, True), (folder, False)):
        done = run_command([sys.executable, "-m", "unittest", late], cwd=where, timeout=300)
        assert (done.returncode == 0) is passes, done.stderr[-3000:]
    assert "Unsettled not raised" in done.stderr


def test_in_progress_taken_for_a_refusal_is_caught_by_the_in_progress_test(fresh, tmp_path):
    """One of the second review's classes (issue 42): the IETF draft's 409 "in progress" taken
    for a refusal records `failed` for a charge that is still being made. In-process, one
    stand-in provider; the same test passes on the starter as it is."""
    test = "tests.test_failures.LateAnswerTest.test_in_progress_after_a_kill_mid_request"
    test += "_stays_unknown_and_the_first_answer_wins"
    (mutation,) = [
        m for m in starter_mutations.MUTATIONS if m.name == "in progress (409) taken for a refusal"
    ]
    folder = tmp_path / "mutated"
    shutil.copytree(fresh, folder)
    starter_mutations.mutate(folder, mutation)
    for where, passes in ((fresh, True), (folder, False)):
        done = run_command([sys.executable, "-m", "unittest", test], cwd=where, timeout=300)
        assert (done.returncode == 0) is passes, done.stderr[-3000:]
    assert "Refused" in done.stderr


def test_make_starter_mutations_runs_the_tool():
    """The command that runs the whole list (minutes): make starter-mutations."""
    text = (starter.ROOT / "Makefile").read_text(encoding="utf-8")
    assert "starter-mutations:" in text and "-m tools.starter_mutations" in text
