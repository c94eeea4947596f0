"""The receiver log lines a guide shows under `logs api` are the ones the receiver writes.

The runner compares `logs` without the name Compose puts before each line (`api-1  |` in v2,
`api_1  |` in v1), in both backends. Here, besides, every line a guide shows must be one the
receiver wrote (`receiver: ...`), compared with the native receiver's own log file.
"""

import pytest

from labs.tools.backends import LocalBackend
from labs.tools.local import ROOT
from labs.tools.runner import COMPOSE_PREFIX, lines_match, parse_guide, run_guide

GUIDES = [
    guide
    for guide in sorted((ROOT / "labs").glob("[0-9][0-9]-*.md"))
    if any(step.command.endswith(" logs api") for step in parse_guide(guide.read_text("utf-8")))
]


def test_the_guides_that_teach_from_the_log_show_it():
    assert {g.name[:2] for g in GUIDES} >= {"01", "02", "06"}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda g: g.stem)
def test_log_lines_in_a_guide_are_what_the_receiver_logs(guide, tmp_path):
    backend = LocalBackend(
        tmp_path / "data", log_path=tmp_path / "data" / "receiver.log", in_process=True
    )
    try:
        outcomes = [o for o in run_guide(guide, backend) if o.step.command.endswith(" logs api")]
    finally:
        backend.close()
    assert outcomes
    for outcome in outcomes:
        expected = [COMPOSE_PREFIX.sub("", line) for line in outcome.step.expected]
        assert all(line == "..." or line.startswith("receiver: ") for line in expected), expected
        assert lines_match(expected, outcome.stdout.splitlines()), outcome.stdout
