"""The `observe` profile: a real Prometheus scrapes the receiver, and a keyed replay shows up in
its receiver_idempotent_replays_total; it scrapes the ledger, and an effect left open shows up.
A real engine, in a project of our own (never stateful-lab). The image is LAB_PROMETHEUS_IMAGE
when set (CI: Debian's prometheus on the local base image, .ci/docker-setup.sh), else the
digest-pinned official one. The README's prepared graph is opened in headless Chromium, as a room
sees it: its panels name the run's series, and the same panels' table tab shows the run's numbers.
Debian's prometheus (2.42) serves the classic UI: /graph redirects to /classic/graph with the
query kept, which reads the same g0.expr/g0.tab/g0.range_input/g0.moment_input parameters as the
official image's React UI (web/ui/react-app/src/utils/index.ts, parseOption)."""

import json
import math
import os
import re
import socket
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from chromium_helpers import chromium
from prometheus_client.parser import text_string_to_metric_families

from tools.backends import TICKETS_SCRIPT, compose_command
from tools.local import COMMAND_TIMEOUT_S, run_command, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.long]

PROJECT = os.environ.get("LAB_DOCKER_PROJECT", "stateful-lab-test") + "-observe"
SCRAPE_DEADLINE_S = 60  # seconds: Prometheus starts, then scrapes every 2 s (observe/)
REPLAYS = "receiver_idempotent_replays_total"
COUNTERS = ("tickets_created", "idempotent_replays")  # receiver_*: the graph's first two panels
METRICS_SCRIPT = TICKETS_SCRIPT.replace("/tickets", "/metrics")  # the receiver's own counters
README = Path(__file__).resolve().parents[2] / "docs" / "observing.md"  # where the graph is
README_GRAPH = re.compile(r"^http://127\.0\.0\.1:9090/graph\?\S+$", re.M)  # the prepared graph
LABEL = re.compile(r'(\w+)="([^"]*)"')  # a label of a series as the UI names it: name="value"
OPENS = 3  # a page the UI did not build is opened again (page(): a fetch of its own failed)
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


def test_prometheus_scrapes_the_replay_a_resume_caused(lab, tmp_path):
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
    at_replay = moment_of(lab, REPLAYS)  # the scrape that saw it, to the second above
    own = lab("exec", "-T", "api", "python", "-c", METRICS_SCRIPT)
    families = {f.name: f for f in text_string_to_metric_families(own.stdout)}
    assert families["receiver_idempotent_replays"].samples[0].value == 1  # what was scraped
    assert families["receiver_tickets_created"].samples[0].value == 1
    rate = scraped(lab, f"rate({REPLAYS}[1m])")  # the README's query answers, with a number
    assert rate is not None and rate >= 0
    # The README's prepared graph, asked on the published loopback port: each of its queries
    # answers with this run's figures (one ticket created, one replay, within the last minute)
    graph = README_GRAPH.search(README.read_text(encoding="utf-8"))[0]
    url = urllib.parse.urlsplit(graph)
    queries = [v for k, v in urllib.parse.parse_qsl(url.query) if k.endswith(".expr")]
    assert queries == [
        "increase(receiver_tickets_created_total[1m])",
        f"increase({REPLAYS}[1m])",
        "sum by (state) (ledger_effects)",  # the ledger's (its ledger-metrics target): valid
    ]
    tickets, replays = (families[f"receiver_{n}"].samples[0].value for n in COUNTERS)
    for query, count in zip(queries[:2], (tickets, replays), strict=True):
        (sample,) = published(lab, query, at_replay)  # this run's: one ticket, one replay
        # increase() stretches the rise to the moment asked (1 s at most past the scrape), from
        # the window's first scrape, which read 0 (2 s or more before): short of twice the count
        assert count <= float(sample["value"][1]) < 2 * count, (query, sample)
    # The ledger's gauges (ledger-metrics, started with prometheus): a ledger run killed in the
    # crash window leaves its effect requested, and Prometheus shows it as open.
    window = ["start", "--thread", "open", "--operation", "case-open:v1", "--mode", "ledger"]
    assert lab("run", "--rm", "workflow", *window, "--crash-at", "after-send").returncode == 137
    requested = 'ledger_effects{job="ledger",state="requested"}'
    wait_until(lambda: scraped(lab, requested) == 1, SCRAPE_DEADLINE_S, "the open effect scraped")
    at_open = moment_of(lab, requested)
    assert scraped(lab, 'ledger_oldest_open_effect_age_seconds{job="ledger"}') >= 0
    # and the prepared graph's ledger panel, on the published port, shows it by state
    by_state = {
        s["metric"]["state"]: float(s["value"][1]) for s in published(lab, queries[2], at_open)
    }
    assert by_state["requested"] == 1, by_state  # the one run killed in the window
    # The README's graph itself, in headless Chromium, as a room opens it (its address, on this
    # test's port): no panel shows an error, the legends name the run's series, and it draws.
    ours = graph.replace("127.0.0.1:9090", f"127.0.0.1:{lab.port}", 1)
    png = tmp_path / "graph.png"
    picture = page(ours, f"--screenshot={png}")
    assert picture.errors == [], picture.errors
    assert picture.text.count('job="receiver"') >= 2, picture.text[-2000:]  # tickets, replays
    assert 'state="requested"' in picture.text, picture.text[-2000:]  # the ledger's panel
    assert png.stat().st_size > 20_000  # looked at by hand: three panels, a line each
    # Its panels on their table tab, each at the moment its figure was scraped: the page shows
    # Prometheus's answers for that moment, this run's numbers (asserted above): one ticket and
    # one replay (increase()'s figures), one effect requested.
    moments = [at_replay, at_replay, at_open]
    tables = page(table_of(ours, moments)).tables
    assert len(tables) == len(queries), tables
    for query, at, rows in zip(queries, moments, tables, strict=True):
        answered = {
            frozenset(s["metric"].items()): s["value"][1] for s in published(lab, query, at)
        }
        assert shown(rows) == answered, (query, rows)
    assert shown(tables[2])[frozenset({("state", "requested")})] == "1"


# helpers


def published(lab, query, at):
    """The result of query at the moment at (Unix seconds), asked of Prometheus on its published
    loopback port."""
    asked = urllib.parse.urlencode({"query": query, "time": at})
    with urllib.request.urlopen(
        f"http://127.0.0.1:{lab.port}/api/v1/query?{asked}", timeout=30
    ) as answer:
        said = json.load(answer)
    assert said["status"] == "success", (query, said)
    return said["data"]["result"]


def moment_of(lab, series):
    """The whole second at or just after the latest scrape of series (one sample). A query at
    that moment answers the same whenever it is asked: the target's next scrape is 2 s later."""
    (sample,) = published(lab, f"timestamp({series})", time.time())
    return math.ceil(float(sample["value"][1]))


def table_of(graph, moments):
    """The graph's address with each panel on its table tab, at its own moment (the UI's
    gN.moment_input: UTC, YYYY-MM-DD HH:MM:SS)."""
    url = urllib.parse.urlsplit(graph)
    params = []
    for key, value in urllib.parse.parse_qsl(url.query):
        panel = key.split(".")[0]
        params.append((key, "1" if key.endswith(".tab") else value))
        if key.endswith(".tab"):
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(moments[int(panel[1:])]))
            params.append((f"{panel}.moment_input", at))
    query = urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
    return url._replace(query=query).geturl()


def shown(rows):
    """A table's rows as {labels: value}, its labels read from the series the page names."""
    return {frozenset(LABEL.findall(series)): value for series, value in rows}


def page(url, *flags):
    """The page at url as headless Chromium built it, after its scripts fetched their data: its
    text, its error alerts' texts, and its tables (rows of two cells: series, value).
    The classic UI builds each panel from a template its script fetches first (static/js/graph/
    index.js, init()). When that fetch fails, or the page itself, Chromium still exits 0 with a
    page of no panels and no error (CI got one once: no table at all; a proxy failing that one
    fetch gives a bare page, failing the page gives an empty one). That is Prometheus's UI not
    loading, not the link: such a page is opened again, at most OPENS times in all."""
    panels = urllib.parse.urlsplit(url).query.count(".expr=")
    opens = []
    while len(opens) < OPENS:
        dom = chromium(
            url, "--dump-dom", "--virtual-time-budget=5000", "--window-size=1400,2200", *flags
        )
        opens.append(len(dom))
        if dom.count("console_table") >= panels:  # each panel's template is in the page
            break
    else:
        pytest.fail(f"Prometheus's UI built no panels in {OPENS} opens (page sizes {opens}): {url}")

    class Reader(HTMLParser):
        def __init__(self):
            super().__init__()
            self.text, self.errors, self.tables = [], [], []
            self.row = self.error = None

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables.append([])
            elif tag == "tr":
                self.row = []
            elif tag == "td" and self.row is not None:
                self.row.append("")
            elif "alert-danger" in (dict(attrs).get("class") or "").split():
                self.error = len(self.errors)
                self.errors.append("")

        def handle_endtag(self, tag):
            if tag == "tr" and self.row is not None:
                if len(self.row) == 2 and self.tables:
                    self.tables[-1].append(tuple(c.strip() for c in self.row))
                self.row = None
            elif tag == "div":
                self.error = None

        def handle_data(self, data):
            self.text.append(data)
            if self.row:
                self.row[-1] += data
            if self.error is not None:
                self.errors[self.error] += data

    reader = Reader()
    reader.feed(dom)
    reader.text = "".join(reader.text)
    reader.errors = [e for e in reader.errors if e.strip()]
    return reader
