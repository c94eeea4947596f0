"""The guide format: how commands, expected output, exit codes and wildcards are read."""

import re
import time

import pytest

from tools import native
from tools.backends import LOST_ACK, LocalBackend, compose_stderr, parse_command
from tools.local import ROOT
from tools.native import RESET_DATA, override_environment
from tools.native_workers import HEARTBEAT_S
from tools.runner import lines_match, parse_guide

pytestmark = pytest.mark.fast  # make test-fast: in-process, or one receiver over HTTP

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
    cmd = parse_command("docker compose -p stateful-lab restart api")
    assert (cmd.files, cmd.verb, cmd.args) == ([], "restart", ["api"])
    with pytest.raises(ValueError):
        parse_command("docker compose restart api")


def test_compose_files_come_before_the_verb_and_start_with_compose_yaml():
    cmd = parse_command(
        "docker compose -p stateful-lab -f compose.yaml -f labs/lost-ack.compose.yaml up -d api"
    )
    assert cmd.overrides == [LOST_ACK] and cmd.verb == "up" and cmd.args == ["-d", "api"]
    with pytest.raises(ValueError, match="the first -f must be compose.yaml"):
        parse_command("docker compose -p stateful-lab -f labs/lost-ack.compose.yaml up -d api")


def test_the_local_backend_takes_a_fault_from_the_override_file_itself():
    assert override_environment([LOST_ACK]) == {"FAILPOINTS": "before-answer=drop-answer"}
    assert override_environment([]) == {}


def test_native_lines_are_the_commands_a_learner_pastes_from_the_readme(tmp_path):
    """What the demo prints under each guide command is docs/native.md's table, word for word."""
    readme = (ROOT / "docs" / "native.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)`", readme, re.M))
    backend = LocalBackend(tmp_path)
    prefix = "docker compose -p stateful-lab "
    for verb in ("up -d --build api", "restart api", "logs api", "down -v --remove-orphans"):
        assert backend.native(prefix + verb) == table[verb], verb
    up = f"docker compose -p stateful-lab -f compose.yaml -f {LOST_ACK} up -d --build api"
    assert backend.native(up) == table["up -d --build api"].replace(
        "python -m labs.receiver", "FAILPOINTS=before-answer=drop-answer python -m labs.receiver"
    )
    post = 'docker compose -p stateful-lab run --rm workflow post --title "Two words"'
    assert backend.native(post) == "python -m labs post --title 'Two words'"
    for row, args in [
        ("run --rm workflow ARGS", "tickets --operation a:op"),
        ("run --rm -e K=V workflow ARGS", "state"),
        ("run --rm drill ARGS", "labs.graphs.shop:graph --json"),
        ("run --rm relay ARGS", "--once --crash-at after-publish"),  # lab 19
        ("run --rm --entrypoint python workflow -c CODE", "-c 'print(1)'"),
    ]:

        def bare(text):  # the row without its placeholder
            return text.replace(" ARGS", "").replace(" -c CODE", "")

        assert backend.native(f"{prefix}{bare(row)} {args}") == f"{bare(table[row])} {args}", row


def test_the_native_table_gives_every_labs_override_file_as_the_demo_types_it():
    """docs/native.md's table of override files: one row per file a guide starts the receiver
    with, each the native line tools/native.py makes of the guide's `up` with it (started, or
    started again when the guide's receiver already runs), and labs/conditions.py's hints."""
    from labs import conditions

    readme = (ROOT / "docs" / "native.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d\d) \| `([^`]+)` \| `([^`]+)` \|$", readme, re.M)
    used = {
        (guide.name[:2], file)
        for guide in (ROOT / "labs").glob("[0-9][0-9]-*.md")
        for file in re.findall(r"-f (labs/[\w-]+\.compose\.yaml) up", guide.read_text())
    }
    assert {(lab, file) for lab, file, _ in rows} == used
    for _, file, typed in rows:
        up = parse_command(f"docker compose -p stateful-lab -f compose.yaml -f {file} up -d api")
        assert native.line(up, {}, typed.startswith("kill"), False) == typed, file
    for override in (conditions.SLOW_PAYMENTS, conditions.WEBHOOK_FAULTS):  # their hints
        (typed,) = [t for _, file, t in rows if file == override[0]]
        assert conditions.receiver_with(override).startswith(typed + " (Docker: "), override


def test_compose_progress_and_the_repeated_exit_code_are_not_the_programs_stderr():
    stderr = (
        "Creating p_workflow_run ... \r\nCreating p_workflow_run ... done\r\n"
        "labs: no thread 'x' to resume; check --thread\n4\n"
    )
    assert compose_stderr(stderr, 4) == "labs: no thread 'x' to resume; check --thread\n"
    assert compose_stderr(" Container p-api-1  Running\n", 0) == ""


def test_lab_10_native_lines_name_the_worker_and_the_cluster(tmp_path):
    """The scale profile natively: tools.pg for postgres (heartbeat as compose.yaml sets it),
    labs/workers.py for `run --rm worker`, signals to the background workers, and a reset that stops
    them all (once the cluster was started)."""
    backend = LocalBackend(tmp_path)
    prefix = "docker compose -p stateful-lab "
    up_pg = backend.native(prefix + "up -d postgres")
    assert up_pg.startswith("python -m tools.pg >data/pg.url &")
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    heartbeat = compose["services"]["worker"]["environment"]["WORKER_HEARTBEAT_S"]
    assert f"WORKER_HEARTBEAT_S={heartbeat} " in up_pg + " " and heartbeat == HEARTBEAT_S
    scale = backend.native(prefix + "up -d --scale worker=3 worker")
    assert scale == "python -m tools.native_workers up 3"
    submit = prefix + "run --rm worker submit --thread a --operation a:op"
    assert backend.native(submit) == "python -m labs.workers submit --thread a --operation a:op"
    signals = "python -m tools.native_workers signal "
    assert backend.native(prefix + "kill -s SIGKILL worker") == signals + "SIGKILL"
    assert backend.native(prefix + "pause worker") == signals + "SIGSTOP"
    assert backend.native(prefix + "unpause worker") == signals + "SIGCONT"
    assert backend.native(prefix + "run --rm workflow tickets") == "python -m labs tickets"
    down = parse_command(prefix + "down -v --remove-orphans")
    assert native.line(down, {}, running=False, postgres_up=True) == (
        "python -m tools.native_workers stop; kill %1 2>/dev/null; wait; " + RESET_DATA + "; "
        "export CHECKPOINT_DB=data/workflow/checkpoints.sqlite; unset WORKER_HEARTBEAT_S"
    )
    readme = (ROOT / "docs" / "native.md").read_text(encoding="utf-8")
    assert "CHECKPOINT_DB=data/workflow/checkpoints.sqlite" in readme  # the native block's export
    assert backend.native(prefix + "down -v") == "kill %1 2>/dev/null; wait; " + RESET_DATA


def test_run_e_sets_the_workflows_environment_in_every_backend(tmp_path):
    """`run --rm -e K=V workflow ARGS` (lab 12's deploy): Compose sets K in the container; the
    local backend sets it for labs/cli.py, in process and as a process, and shows it on the line."""
    command = "docker compose -p stateful-lab run --rm -e LAB_GRAPH_VERSION=3 workflow state"
    cmd = parse_command(command)
    assert cmd.run_env() == ({"LAB_GRAPH_VERSION": "3"}, ["--rm", "workflow", "state"])
    assert parse_command(command.replace("-e LAB_GRAPH_VERSION=3 ", "")).run_env()[0] == {}
    for in_process in (True, False):
        backend = LocalBackend(tmp_path / f"data-{in_process}", in_process=in_process)
        try:
            assert backend.native(command) == "LAB_GRAPH_VERSION=3 python -m labs state"
            refused = backend.run(command)  # 3 is no graph version: labs/cli.py read the variable
            assert refused.exit_code == 2 and "LAB_GRAPH_VERSION='3'" in refused.stderr
            assert "LAB_GRAPH_VERSION" not in backend.env  # for that command only
            traced = "docker compose -p stateful-lab run --rm -e TRACE=/data/s.jsonl workflow state"
            # lab 05: a file in the workflow's volume is in the native data folder's workflow/
            assert backend.native(traced) == "TRACE=data/workflow/s.jsonl python -m labs state"
        finally:
            backend.close()


class SleepRecorder:
    """A module's time, whose sleep() notes its seconds instead of waiting them."""

    def __init__(self):
        self.slept = []

    def sleep(self, seconds):
        self.slept.append(seconds)

    def __getattr__(self, name):
        return getattr(time, name)


def test_sleep_is_the_one_command_without_compose_and_both_backends_really_wait(
    tmp_path, monkeypatch
):
    """`$ sleep N` (lab 14 waits out the key retention): parsed as its own verb, typed as is
    natively, and a real wait of N seconds in the local backend and in the docker backend's
    run() (the same function; the docker backend is built without an engine check here): the
    backends' time.sleep(N), on a clock the test keeps (the sleep's length is time.sleep's)."""
    from tools import backends
    from tools.backends import DockerBackend, parse_sleep

    clock = SleepRecorder()
    monkeypatch.setattr(backends, "time", clock)

    steps = parse_guide("```console\n$ sleep 1\n```\n")
    assert [s.command for s in steps] == ["sleep 1"] and steps[0].expected == []
    assert parse_command("sleep 1").verb == "sleep" and parse_sleep("sleep 1") == 1
    assert parse_sleep("sleep 0.5") is None  # whole seconds: Windows PowerShell's Start-Sleep
    assert parse_sleep("docker compose -p stateful-lab down -v") is None
    with pytest.raises(ValueError, match="guide commands start with"):
        parse_command("sleep 1; rm -rf data")
    local = LocalBackend(tmp_path)
    docker = DockerBackend.__new__(DockerBackend)  # run() needs no engine for a sleep
    try:
        assert local.native("sleep 1") is None
        for backend in (local, docker):
            clock.slept.clear()
            result = backend.run("sleep 1")
            assert clock.slept == [1], backend.name
            assert (result.stdout, result.exit_code) == ("", 0)
        with pytest.raises(ValueError, match="at most 60 s"):
            local.run("sleep 61")
    finally:
        local.close()


def test_a_second_up_with_another_override_restarts_the_local_receiver_with_it(tmp_path):
    """As Compose recreates an api whose configuration changed: lab 14 goes from a 2 s key
    retention to 24 h with a second `up`; the tickets stay."""
    prefix = "docker compose -p stateful-lab -f compose.yaml -f "
    backend = LocalBackend(tmp_path)
    try:
        backend.run(prefix + f"{LOST_ACK} up -d --build api")
        first = backend.receiver.proc.pid
        backend.run(prefix + f"{LOST_ACK} up -d --build api")  # the same: left alone
        assert backend.receiver.proc.pid == first
        backend.run("docker compose -p stateful-lab run --rm workflow post --title kept")
        up = "docker compose -p stateful-lab up -d --build api"
        assert backend.native(up) == (
            "kill %1; wait; python -m labs.receiver 2>>data/receiver.log"
            " & echo $! >data/receiver.pid"
        )
        backend.run(up)
        assert backend.receiver.proc.pid != first and backend.faults == {}
        assert "FAILPOINTS" not in backend.receiver.env
        assert [t["ticket_id"] for t in backend.tickets()] == [1]
    finally:
        backend.close()


@pytest.mark.fast
def test_logs_are_compared_without_composes_prefix_and_codes_and_tables_word_by_word():
    """`logs api` as Compose 2.26 prints it (an erase-line code, `api-1  | `) and as 1.29 does
    (the name in colour) matches the guide's lines; a table matches whatever its column widths,
    and a changed word still fails."""
    from tools.runner import Step, check, line_matches

    step = Step(
        "docker compose -p stateful-lab logs api",
        ["...", "api-1  | receiver: replayed key=k ticket=1"],
    )
    v2 = (
        "\x1b[2Kapi-1  | receiver: created key=k ticket=1\n"
        "\x1b[2Kapi-1  | receiver: replayed key=k ticket=1\n"
    )
    v1 = "Attaching to p_api_1\n\x1b[36mp_api_1 |\x1b[0m receiver: replayed key=k ticket=1\n"
    native = "receiver: listening\nreceiver: replayed key=k ticket=1\n"
    for stdout in (v2, v1, native):
        assert check(step, stdout, 0) == [], stdout
    assert check(step, native.replace("replayed", "created"), 0) == [
        "output differs from the guide"
    ]
    assert line_matches("put step 1   step 0: charge    1  ok", "put step 1 step 0: charge 1 ok")
    assert not line_matches(
        "put step 1   step 0: charge    1  ok", "put step 1 step 0: charge 2 ok"
    )
