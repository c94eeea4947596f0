"""The `observe` profile's trace backend (compose.yaml's jaeger, observe/tracing.compose.yaml).

The configuration is checked everywhere. The run against a real Jaeger needs its image, which
only a machine that reaches Docker Hub (or has LAB_JAEGER_IMAGE) has: CI and this lab's build
machine reach no registry, so there it is skipped, saying so."""

import json
import os
import re
import urllib.parse
import urllib.request

import pytest
import yaml

from tools.backends import compose_command
from tools.local import COMMAND_TIMEOUT_S, ROOT, free_port, run_command, wait_until

FILES = ("-f", "compose.yaml", "-f", "observe/tracing.compose.yaml")
TRACED = ("api", "workflow", "worker", "relay")  # what tracing.compose.yaml turns tracing on for
PINNED = re.compile(r"\$\{LAB_JAEGER_IMAGE:-(jaegertracing/jaeger:[\d.]+@sha256:[0-9a-f]{64})\}")
PROJECT = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test") + "-trace"
OPERATION = "case-traced:open-ticket:v1"
QUERY_DEADLINE_S = 60  # seconds: Jaeger starts, then the batches of spans arrive


def load(name):
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))


def test_jaeger_is_pinned_by_digest_and_only_the_tracing_file_turns_tracing_on():
    compose = load("compose.yaml")
    jaeger = compose["services"]["jaeger"]
    assert PINNED.fullmatch(jaeger["image"]), jaeger["image"]
    assert jaeger["profiles"] == ["observe"]
    assert "127.0.0.1:${LAB_JAEGER_PORT:-16686}:16686" in jaeger["ports"]  # loopback only
    assert not any("TRACE" in s.get("environment", {}) for s in compose["services"].values())
    traced = load("observe/tracing.compose.yaml")["services"]
    assert sorted(traced) == sorted(TRACED)
    for name in TRACED:
        env = traced[name]["environment"]
        assert env["TRACE"] == "otlp"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"  # its OTLP/HTTP port


def test_compose_reads_the_profile_with_the_tracing_file():
    """What Compose itself makes of the two files (no engine needed): the merged settings."""
    if compose_command() is None:
        pytest.skip("no docker compose here to read the files")
    done = run_command(
        [*compose_command(), *FILES, *profiles("observe", "cli", "outbox"), "config"],
        env={**os.environ, "LAB_JAEGER_IMAGE": ""},  # empty: the pinned default
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    merged = yaml.safe_load(done.stdout)["services"]
    assert merged["jaeger"]["image"] == PINNED.fullmatch(
        load("compose.yaml")["services"]["jaeger"]["image"]
    ).group(1)
    assert set(merged["jaeger"]["networks"]) == {"lab", "observe-ui"}
    assert merged["api"]["environment"]["TRACE"] == "otlp"
    assert merged["api"]["environment"]["RECEIVER_DB"] == "/data/receiver.sqlite"  # kept
    assert merged["workflow"]["environment"]["API_URL"] == "http://api:8000"
    relay = merged["relay"]["environment"]  # lab 19's: traced, and still on the workflow's file
    assert relay["TRACE"] == "otlp" and relay["CHECKPOINT_DB"] == "/data/checkpoints.sqlite"


def profiles(*names):
    return [arg for name in names for arg in ("--profile", name)]


def jaeger_image():
    """The image to run, or a skip that says why there is none."""
    from conftest import require_docker

    require_docker()
    image = os.environ.get("LAB_JAEGER_IMAGE") or PINNED.fullmatch(
        load("compose.yaml")["services"]["jaeger"]["image"]
    ).group(1)
    if run_command(["docker", "image", "inspect", image], timeout=60).returncode == 0:
        return image
    pulled = run_command(["docker", "pull", image], timeout=COMMAND_TIMEOUT_S)
    if pulled.returncode != 0:
        pytest.skip(
            f"JAEGER IMAGE UNAVAILABLE: {image} is not here and cannot be pulled "
            f"({(pulled.stderr.strip().splitlines() or ['no reason given'])[-1]}); this test "
            "runs where Docker Hub can "
            "be reached, or with LAB_JAEGER_IMAGE naming a local Jaeger image"
        )
    return image


def spans_under(port, service, key):
    """Jaeger's spans of service that carry the key (its query API), each as {tag: value}."""
    tags = urllib.parse.quote(json.dumps({"idempotency.key": key}))
    url = f"http://127.0.0.1:{port}/api/traces?service={service}&tags={tags}&limit=20"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            traces = json.load(answer)["data"] or []
    except OSError:
        return []
    return [
        {"name": s["operationName"], **{t["key"]: t["value"] for t in s["tags"]}}
        for trace in traces
        for s in trace["spans"]
        if {"key": "idempotency.key", "type": "string", "value": key} in s["tags"]
    ]


@pytest.mark.docker
@pytest.mark.long
def test_jaeger_shows_the_receivers_ticket_and_its_replay_under_one_key():
    image = jaeger_image()
    port = free_port()
    env = {**os.environ, "LAB_JAEGER_IMAGE": image, "LAB_JAEGER_PORT": str(port)}

    def compose(*args, timeout=120):
        return run_command([*compose_command(), "-p", PROJECT, *FILES, *args], env, timeout)

    compose("down", "-v", "--remove-orphans")
    try:
        up = compose("up", "-d", "--build", "api", "jaeger", timeout=COMMAND_TIMEOUT_S)
        assert up.returncode == 0, up.stderr[-2000:]
        start = ["start", "--thread", "t", "--operation", OPERATION, "--mode", "safe", "--crash"]
        assert compose("run", "--rm", "workflow", *start).returncode == 137
        resume = compose("run", "--rm", "workflow", "resume", "--thread", "t")
        assert resume.returncode == 0 and '"created": false' in resume.stdout, resume.stderr

        def both_answers():
            received = spans_under(port, "receiver", OPERATION)
            return sorted(s.get("receiver.replay") for s in received) == [False, True]

        wait_until(both_answers, QUERY_DEADLINE_S, "the receiver's two spans in Jaeger")
        sent = spans_under(port, "workflow", OPERATION)  # the resume's: it exited normally
        assert "POST /tickets" in [s["name"] for s in sent]
    finally:
        compose("down", "-v", "--remove-orphans")
