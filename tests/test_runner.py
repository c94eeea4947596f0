"""The guide format: how commands, expected output, exit codes and wildcards are read."""

import pytest

from labs.tools.runner import lines_match, parse_guide, split_compose

GUIDE = """# A guide

Prose is ignored, and so are other code blocks:

```bash
$ not a command
```

```console
$ docker compose -p stateful-lab up -d --build api
$ docker compose -p stateful-lab run --rm workflow post --title "Two words"
{"event": "post", "ticket_id": 1}
[exit 1]
```
"""


def test_parse_guide_reads_console_blocks_only():
    steps = parse_guide(GUIDE)
    assert [s.command for s in steps] == [
        "docker compose -p stateful-lab up -d --build api",
        'docker compose -p stateful-lab run --rm workflow post --title "Two words"',
    ]
    assert steps[0].expected == [] and steps[0].exit_code == 0
    assert steps[1].expected == ['{"event": "post", "ticket_id": 1}']
    assert steps[1].exit_code == 1


def test_output_before_a_command_is_an_error():
    with pytest.raises(ValueError, match="output before the first command"):
        parse_guide("```console\n{}\n```\n")


def test_json_lines_compare_as_values():
    assert lines_match(['{"a": 1, "b": [2]}'], ['{"b":[2],"a":1}'])
    assert not lines_match(['{"a": 1}'], ['{"a": 2}'])
    assert not lines_match(['{"a": 1}'], ['{"a": 1, "b": 2}'])
    assert not lines_match(['{"a": 1}'], ['{"a": true}'])  # 1 == True in Python, not here
    assert not lines_match(['{"a": 1}'], ['{"a": 1}', "extra"])


def test_angle_bracket_strings_and_ellipsis_are_wildcards():
    assert lines_match(['{"key": "<uuid>"}'], ['{"key": "4b1c"}'])
    assert lines_match(['{"key": "<uuid>"}'], ['{"key": null}'])
    assert not lines_match(['{"key": "<uuid>"}'], ['{"other": "x"}'])
    assert lines_match(["...", "last"], ["a", "b", "last"])
    assert lines_match(["first", "..."], ["first"])
    assert not lines_match(["...", "last"], ["a", "b"])


def test_guide_commands_must_name_the_project():
    assert split_compose("docker compose -p stateful-lab restart api") == ("restart", ["api"])
    with pytest.raises(ValueError):
        split_compose("docker compose restart api")
