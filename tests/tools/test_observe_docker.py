"""The `observe` profile: a real Prometheus scrapes the receiver, and a keyed replay shows up in
its receiver_idempotent_replays_total; it scrapes the ledger, and an effect left open shows up.
A real engine, in a project of our own (never stateful-lab). The image is LAB_PROMETHEUS_IMAGE
when set (CI: Debian's prometheus on the local base image, .ci/docker-setup.sh), else the
digest-pinned official one."""

import json
import os
import re
import socket
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from labs.tools.backends import TICKETS_SCRIPT, compose_command
from labs.tools.local import COMMAND_TIMEOUT_S, wait_until
from labs.tools.local import run as run_command

pytestmark = [pytest.mark.docker, pytest.mark.long]

PROJECT = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test") + "-observe"
SCRAPE_DEADLINE_S = 60  # seconds: Prometheus starts, then scrapes every 2 s (observe/)
REPLAYS = "receiver_idempotent_replays_total"
METRICS_SCRIPT = TICKETS_SCRIPT.replace("/tickets", "/metrics")  # the receiver's own counters
README = Path(__file__).resolve().parents[2] / "README.md"
README_GRAPH = re.compile(r"^http://127\.0\.0\.1:9090/graph\?\S+$", re.M)  # the prepared graph
PROMQL_VALUE = re.compile(r"=> (\S+) @")  # promtool query instant: `name{labels} => 1 @[time]`


@pytest.fixture
def lab():
    with socket.socket() as probe:  # a free loopback port for Prometheus's UI
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def compose(*args, timeout=120):
        env = {**os.environ, "LAB_PROMETHEUS_PORT": str(port)}  # never the learner's 9090
        return run_command([*compose_command(), "-p", PROJECT, *args], timeout=timeout, env=env)

    compose.port = port
    compose("down", "-v", "--remove-orphans")
    yield compose
    compose("down", "-v", "--remove-orphans")
    label = f"label=com.docker.compose.project={PROJECT}"
    left = run_command(["docker", "ps", "-aq", "--filter", label], timeout=60).stdout.split()
    assert left == [], "containers left behind"


def scraped(lab, query):
    """The value Prometheus holds for query now, or None before its first scrape."""
    done = lab(
        "exec", "-T", "prometheus", "promtool", "query", "instant", "http://127.0.0.1:9090", query
    )
    match = PROMQL_VALUE.search(done.stdout)
    return float(match.group(1)) if done.returncode == 0 and match else None


def test_prometheus_scrapes_the_replay_a_resume_caused(lab):
    up = lab("up", "-d", "--build", "api", "prometheus", timeout=COMMAND_TIMEOUT_S)
    assert up.returncode == 0, up.stderr[-2000:]
    wait_until(lambda: scraped(lab, REPLAYS) == 0, SCRAPE_DEADLINE_S, "the first scrape")
    start = [
        "start",
        "--thread",
        "seen",
        "--operation",
        "case-seen:open-ticket:v1",
        "--mode",
        "safe",
        "--crash",
    ]  # safe: the resume is a replay
    assert lab("run", "--rm", "workflow", *start).returncode == 137
    resume = lab("run", "--rm", "workflow", "resume", "--thread", "seen")
    assert resume.returncode == 0 and '"created": false' in resume.stdout, resume.stderr
    wait_until(lambda: scraped(lab, REPLAYS) == 1, SCRAPE_DEADLINE_S, "the replay scraped")
    own = lab("exec", "-T", "api", "python", "-c", METRICS_SCRIPT)
    families = {f.name: f for f in text_string_to_metric_families(own.stdout)}
    assert families["receiver_idempotent_replays"].samples[0].value == 1  # what was scraped
    assert families["receiver_tickets_created"].samples[0].value == 1
    rate = scraped(lab, f"rate({REPLAYS}[1m])")  # the README's query answers, with a number
    assert rate is not None and rate >= 0
    # The README's prepared graph, asked on the published loopback port: each of its queries
    # answers with this run's figures (one ticket created, one replay, within the last minute)
    url = urllib.parse.urlsplit(README_GRAPH.search(README.read_text(encoding="utf-8"))[0])
    queries = [v for k, v in urllib.parse.parse_qsl(url.query) if k.endswith(".expr")]
    assert queries == [
        "increase(receiver_tickets_created_total[1m])",
        f"increase({REPLAYS}[1m])",
        "sum by (state) (ledger_effects)",  # the ledger's (its ledger-metrics target): valid
    ]
    for query in queries[:2]:  # this run's: one ticket, one replay
        (sample,) = published(lab, query)
        assert float(sample["value"][1]) > 0, (query, sample)  # increase() extrapolates
    # The ledger's gauges (ledger-metrics, started with prometheus): a ledger run killed in the
    # crash window leaves its effect requested, and Prometheus shows it as open.
    window = ["start", "--thread", "open", "--operation", "case-open:v1", "--mode", "ledger"]
    assert lab("run", "--rm", "workflow", *window, "--crash-at", "after-send").returncode == 137
    requested = 'ledger_effects{job="ledger",state="requested"}'
    wait_until(lambda: scraped(lab, requested) == 1, SCRAPE_DEADLINE_S, "the open effect scraped")
    assert scraped(lab, 'ledger_oldest_open_effect_age_seconds{job="ledger"}') >= 0
    # and the prepared graph's ledger panel, on the published port, shows it by state
    by_state = {s["metric"]["state"]: float(s["value"][1]) for s in published(lab, queries[2])}
    assert by_state["requested"] == 1, by_state


def published(lab, query):
    """The result of query, asked of Prometheus on its published loopback port."""
    ask = f"http://127.0.0.1:{lab.port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(ask, timeout=30) as answer:
        said = json.load(answer)
    assert said["status"] == "success", (query, said)
    return said["data"]["result"]
