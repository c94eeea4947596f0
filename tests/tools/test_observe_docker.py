"""The `observe` profile: a real Prometheus scrapes the receiver, and a keyed replay shows up in
its receiver_idempotent_replays_total; it scrapes the ledger, and an effect left open shows up.
A real engine, in a project of our own (never stateful-lab). The image is LAB_PROMETHEUS_IMAGE
when set (CI: Debian's prometheus on the local base image, .ci/docker-setup.sh), else the
digest-pinned official one."""

import os
import re

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
PROMQL_VALUE = re.compile(r"=> (\S+) @")  # promtool query instant: `name{labels} => 1 @[time]`


@pytest.fixture
def lab():

    def compose(*args, timeout=120):
        return run_command([*compose_command(), "-p", PROJECT, *args], timeout=timeout)

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
    # The ledger's gauges (ledger-metrics, started with prometheus): a ledger run killed in the
    # crash window leaves its effect requested, and Prometheus shows it as open.
    window = ["start", "--thread", "open", "--operation", "case-open:v1", "--mode", "ledger"]
    assert lab("run", "--rm", "workflow", *window, "--crash-at", "after-send").returncode == 137
    requested = 'ledger_effects{job="ledger",state="requested"}'
    wait_until(lambda: scraped(lab, requested) == 1, SCRAPE_DEADLINE_S, "the open effect scraped")
    assert scraped(lab, 'ledger_oldest_open_effect_age_seconds{job="ledger"}') >= 0
