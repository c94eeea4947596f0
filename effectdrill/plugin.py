"""The pytest plugin (entry point `effect_drill`): the `effect_drill` fixture.

def test_no_crash_repeats_an_effect(effect_drill):
    effect_drill(build_graph, {"order": "{thread}"}, count_effects).assert_clean()
"""

import pytest

from effectdrill.api import drill


@pytest.fixture
def effect_drill(tmp_path):
    """effectdrill.drill(graph, input, observe, **options), checkpoints in the test's tmp_path."""

    def run(graph, input, observe, **options):
        options.setdefault("checkpoint_db", str(tmp_path / "effect-drill.sqlite"))
        return drill(graph, input, observe, **options)

    return run
