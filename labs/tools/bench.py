"""Benchmark the receiver and the CLI, side by side with the article's originals (make bench).

    .venv/bin/python -m labs.tools.bench [--quick]

Receiver: keyed POST /tickets with fresh keys (each creates a ticket: one fsync) and
with replays (a key and body sent before: a lookup, no write), from 8 client threads
posting back to back, a new connection per request, in time-boxed rounds. Prints
POSTs per second and p50/p99 latency (medians over the rounds) and the ratio ours /
article; also the article's receiver with only its listen backlog raised, to show
which part of the gap that one fix closes.
CLI: wall time of `workflow.py tickets`, `post` and `state` (a fresh interpreter each
run, as a learner types them), ours and the article's, medians of CLI_RUNS.
Log line: what one decision line costs when the receiver writes it to a file, and the
same receiver once more with stderr to /dev/null, end to end.
Workers: operations per second with 1, 2 and 4 workers on a throwaway Postgres
(labs.tools.bench_workers, with its own ROUNDS and OPERATIONS, as `make bench-workers`);
skipped with a note where PostgreSQL's binaries are missing.

The article's api.py and workflow.py are cut out of ../shared/seeds at run time into a
temporary folder (their hard-coded /data paths and port patched) and deleted afterwards;
they are never written into the repo. Without the seeds the baseline is skipped.

Every figure is printed; nothing is asserted. The last line is one JSON object with
all the figures, for scripts (and the smoke test of --quick).
"""

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from labs.tools.bench_workers import bench_workers
from labs.tools.local import ROOT, ReceiverProcess, free_port, lab_env
from labs.tools.pg import PostgresUnavailable
from workflow import Parser

SEED = ROOT.parent / "shared" / "seeds" / "stateful-agents-docker-lab.txt"
CLIENT_THREADS = 8  # concurrent clients: the load shape (a room hammering one receiver)
ROUNDS = 5  # per measurement; the median ignores one round disturbed by the machine
ROUND_S = 0.8  # seconds per round, kind and receiver: 600-2,000 requests at the rates seen
#                here, plenty for a p99; 5 rounds x 2 kinds x 4 receivers = 32 s of load
CLI_RUNS = 5  # per command and lab: each run costs 0.05-0.7 s; the median ignores a cold start
LOG_LINES = 20_000  # decision lines written to time one: ~0.1 s, and far above timer resolution
ARTICLE_BACKLOG = 128  # the article's receiver once more with our listen backlog: which part
#                        of the gain is that one-line fix, which part the rest
QUICK = dict(rounds=1, seconds=0.25, cli_runs=1)  # --quick: shows the script works, ~10 s
REQUEST_TIMEOUT_S = 10.0  # seconds: a request slower than this is counted as an error
TITLE = "Check supplier configuration"
FIGURES = ("rps", "p50_ms", "p99_ms")  # per round; the report shows the median over rounds


class ArticleLab(ReceiverProcess):
    """The article's api.py and workflow.py, patched to run from a temporary folder."""

    PATCHES = {  # file -> [(text in the article, replacement)]; each must match exactly once
        "api.py": [
            ('DB = "/data/receiver.sqlite"', "DB = {db!r}"),
            ('("0.0.0.0", 8000)', '("127.0.0.1", {port})'),
        ],
        "workflow.py": [('"/data/checkpoints.sqlite"', "{checkpoints!r}")],
    }
    BACKLOG_PATCH = (  # only with backlog=N
        "ThreadingHTTPServer((",
        "ThreadingHTTPServer.request_queue_size = {backlog}\nThreadingHTTPServer((",
    )

    def __init__(self, folder, port, backlog=None, log_path=None):
        """backlog: also raise its listen backlog (default 5), to show what that alone gives."""
        self.folder, self.port = Path(folder), port
        text = SEED.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        api_at, workflow_at = lines.index("api.py\n"), lines.index("workflow.py\n")
        sources = {
            "api.py": "".join(lines[api_at + 1 : workflow_at]),
            "workflow.py": "".join(lines[workflow_at + 1 :]),
        }
        values = dict(
            db=str(self.folder / "receiver.sqlite"),
            checkpoints=str(self.folder / "checkpoints.sqlite"),
            port=port,
            backlog=backlog,
        )
        for name, source in sources.items():
            patches = self.PATCHES[name]
            if backlog and name == "api.py":
                patches = [*patches, self.BACKLOG_PATCH]
            for old, new in patches:
                if source.count(old) != 1:
                    raise ValueError(f"the seed's {name} no longer contains {old!r} once")
                source = source.replace(old, new.format(**values))
            (self.folder / name).write_text(source, encoding="utf-8")
        # Started, polled and stopped (SIGTERM: Python's default handler ends it) as ours is.
        super().__init__(lab_env(self.folder, port), log_path, script=self.folder / "api.py")


def post_bytes(key):
    body = json.dumps({"title": TITLE}).encode()
    head = f"POST /tickets HTTP/1.0\r\nIdempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Content-Type: application/json\r\n\r\n" + body


def send(port, raw):
    """One request on a new connection; returns (status or error name, seconds)."""
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as sock:
            sock.sendall(raw)
            answer = b""
            while chunk := sock.recv(65536):  # HTTP/1.0: the server closes after answering
                answer += chunk
        status = int(answer.split(b" ", 2)[1]) if answer else "no answer"
    except OSError as error:
        status = type(error).__name__
    return status, time.perf_counter() - start


def load_round(port, key_of, expected, seconds):
    """CLIENT_THREADS clients POST back to back for `seconds`; returns the round's figures.

    A time box, not a fixed count: with a fixed count one request stuck in a 1 s SYN retry
    would hold up the end of the round for everyone, and measure that one request.
    key_of(thread, i) is the key of a client's i-th request.
    """
    latencies, errors, answered = [], [], []
    lock = threading.Lock()
    start_together = threading.Barrier(CLIENT_THREADS + 1)
    deadline = []

    def client(thread):
        start_together.wait()
        i = 0
        while time.perf_counter() < deadline[0]:
            key = key_of(thread, i)
            status, seconds = send(port, post_bytes(key))
            with lock:
                latencies.append(seconds)
                if status != expected:
                    errors.append(status)
                elif time.perf_counter() <= deadline[0]:
                    answered.append(key)  # finished within the time box: counts for rps
            i += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENT_THREADS)]
    for thread in threads:
        thread.start()
    deadline.append(time.perf_counter() + seconds)
    start_together.wait()
    for thread in threads:
        thread.join()
    latencies.sort()
    return {
        "rps": len(answered) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "errors": errors,
        "keys": answered,
    }


def median_rounds(rounds):
    figures = {name: statistics.median(r[name] for r in rounds) for name in FIGURES}
    figures["errors"] = sum(len(r["errors"]) for r in rounds)
    figures["error_kinds"] = sorted({str(e) for r in rounds for e in r["errors"]})
    return figures


def fresh_keys(prefix):
    return lambda thread, i: f"{prefix}:{thread}:{i}"


def replay_keys(made):
    """Cycle through the keys a fresh round made: every request is a replay."""
    made = made or ["none"]
    return lambda thread, i: made[(thread + i * CLIENT_THREADS) % len(made)]


def bench_receivers(servers, rounds, seconds):
    """servers: name -> port. Rounds alternate between servers so drift hits them alike."""
    results = {name: {"fresh": [], "replay": []} for name in servers}
    for number in range(rounds):
        for name, port in servers.items():
            fresh = load_round(port, fresh_keys(f"bench:{name}:{number}"), 201, seconds)
            replay = load_round(port, replay_keys(fresh["keys"]), 200, seconds)
            results[name]["fresh"].append(fresh)
            results[name]["replay"].append(replay)
    return {
        name: {kind: median_rounds(r) for kind, r in kinds.items()}
        for name, kinds in results.items()
    }


def bench_cli(labs, runs):
    """labs: name -> (workflow.py path, env). Median wall seconds per command and lab."""
    commands = {
        "tickets": ["tickets"],
        "post": ["post", "--operation", "bench:cli:post"],  # one ticket, then replays
        "state": ["state", "--thread", "bench-cli"],  # the finished thread made here
    }
    for script, env in labs.values():
        run_cli(script, ["start", "--thread", "bench-cli", "--operation", "bench:cli:start"], env)
    figures = {}
    for command, args in commands.items():
        times = {name: [] for name in labs}
        for _ in range(runs):  # alternate the labs, so a busy moment hits both alike
            for name, (script, env) in labs.items():
                times[name].append(run_cli(script, args, env))
        figures[command] = {name + "_s": statistics.median(t) for name, t in times.items()}
    return figures


def log_line_seconds(folder):
    """Seconds one decision line costs: the receiver's sys.stderr.write, to a file, unbuffered."""
    code = (
        "import sys, time\n"
        "start = time.perf_counter()\n"
        f"for i in range({LOG_LINES}):\n"
        "    sys.stderr.write(f'receiver: created key=case-{i}:open-ticket:v1 ticket={i}\\n')\n"
        f"print((time.perf_counter() - start) / {LOG_LINES})\n"
    )
    with open(Path(folder) / "log-lines.log", "wb") as log:
        done = subprocess.run(
            [sys.executable, "-c", code],
            stderr=log,
            stdout=subprocess.PIPE,
            env=dict(lab_env(folder, 0), PYTHONUNBUFFERED="1"),  # as the receiver runs
            check=True,
        )
    return float(done.stdout)


def run_cli(script, args, env):
    """Wall seconds of `python script ARGS`: a fresh interpreter, as a learner runs it."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed: {done.stderr.decode().strip()}")
    return seconds


def main(argv=None):
    parser = Parser(prog="labs.tools.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~10 s)")
    size = dict(rounds=ROUNDS, seconds=ROUND_S, cli_runs=CLI_RUNS)
    if parser.parse_args(argv).quick:
        size = QUICK
    figures = {"settings": dict(size, client_threads=CLIENT_THREADS), "baseline": "article"}
    print(
        f"# bench: rounds: {size['rounds']} x {size['seconds']:g} s of keyed POSTs per kind, "
        f"{CLIENT_THREADS} client threads, a new connection per request; medians of rounds"
    )
    with tempfile.TemporaryDirectory(prefix="stateful-lab-bench-") as tmp:
        tmp, started = Path(tmp), []
        try:
            servers = {
                "ours": ReceiverProcess(lab_env(tmp / "ours", free_port()), tmp / "ours.log"),
                "ours_log_devnull": ReceiverProcess(
                    lab_env(tmp / "quiet", free_port()), log_path=None
                ),
            }
            for server in servers.values():
                started.append(server)
                server.start()
            cli = {"ours": (ROOT / "workflow.py", servers["ours"].env)}
            try:
                for name, backlog in [("article", None), ("article_backlog", ARTICLE_BACKLOG)]:
                    (tmp / name).mkdir()
                    servers[name] = ArticleLab(
                        tmp / name, free_port(), backlog, log_path=tmp / f"{name}.log"
                    )
                    started.append(servers[name])
                    servers[name].start()
                cli["article"] = (servers["article"].folder / "workflow.py", servers["article"].env)
                figures["cli"] = bench_cli(cli, size["cli_runs"])
            except (OSError, ValueError, RuntimeError) as error:
                figures["baseline"] = f"skipped: {error}"
                print(f"# article baseline SKIPPED, only our figures follow ({SEED}): {error}")
                servers = {k: v for k, v in servers.items() if not k.startswith("article")}
                figures["cli"] = bench_cli({"ours": cli["ours"]}, size["cli_runs"])
            ports = {name: urlsplit(server.url).port for name, server in servers.items()}
            figures["receiver"] = bench_receivers(ports, size["rounds"], size["seconds"])
            figures["log_line_s"] = log_line_seconds(tmp)
            figures["workers"] = worker_figures(quick=size is QUICK)
        finally:
            for server in started:
                server.stop()
    report(figures)


def worker_figures(quick):
    """Operations per second with 1, 2 and 4 workers, or why not: as `make bench-workers`
    measures them (its rounds and operations), so both print the same kind of figure."""
    try:
        if quick:
            return bench_workers(rounds=QUICK["rounds"], operations=8)
        return bench_workers()
    except PostgresUnavailable as error:
        return f"skipped: {error}"


def report(figures):
    """Print the table, the goals and the log-line cost; last, every figure as one JSON line."""
    receiver, cli = figures["receiver"], figures["cli"]
    ours, quiet, article = receiver["ours"], receiver["ours_log_devnull"], receiver.get("article")
    ratios = figures["ratios"] = {}
    print(f"\n{'receiver (ours: WAL, synchronous=FULL)':<40}{'ours':>9}{'article':>9}{'ratio':>9}")
    for kind in ("fresh", "replay"):
        for name, unit in (("rps", "POST/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms")):
            line = f"  {kind} keys, {unit:<26}{ours[kind][name]:>9.1f}"
            if article:
                ratios[f"{kind}_{name}"] = ours[kind][name] / article[kind][name]
                line += f"{article[kind][name]:>9.1f}{ratios[f'{kind}_{name}']:>8.2f}x"
            print(line)
    backlog = receiver.get("article_backlog")
    if backlog:
        print(f"  article with listen backlog {ARTICLE_BACKLOG} instead of 5 (that fix alone):")
        for kind in ("fresh", "replay"):
            ratios[f"{kind}_rps_vs_backlog_fix"] = ours[kind]["rps"] / backlog[kind]["rps"]
            print(
                f"    {kind} keys, {'POST/s':<24}{'':>9}{backlog[kind]['rps']:>9.1f}"
                f"{ratios[f'{kind}_rps_vs_backlog_fix']:>8.2f}x"
            )
    for name, result in receiver.items():
        for kind, got in result.items():
            if got["errors"]:
                print(
                    f"  ! {name}, {kind}: {got['errors']} unexpected answers {got['error_kinds']}"
                )
    print(f"\n{'cli: python workflow.py ... (wall s)':<40}{'ours':>9}{'article':>9}{'ratio':>9}")
    for command, times in cli.items():
        line = f"  {command:<38}{times['ours_s']:>9.3f}"
        if "article_s" in times:
            ratios[f"cli_{command}"] = times["ours_s"] / times["article_s"]
            line += f"{times['article_s']:>9.3f}{ratios[f'cli_{command}']:>8.2f}x"
        print(line)
    if article:
        print("\ngoals (ours / article):")
        for key, goal, better in [
            ("fresh_rps", 1.5, "at least"),
            ("replay_rps", 1.0, "at least"),
            ("cli_tickets", 0.15, "at most"),
            ("cli_post", 0.15, "at most"),
        ]:
            met = ratios[key] >= goal if better == "at least" else ratios[key] <= goal
            verdict = "met" if met else "NOT met"
            print(f"  {key:<14}{ratios[key]:>6.2f}x  goal {better} {goal}x: {verdict}")
    line_s = figures["log_line_s"]
    share = figures["log_line_share"] = {k: line_s * ours[k]["rps"] for k in ("fresh", "replay")}
    print(
        f"\ndecision log line (one per POST): {1e6 * line_s:.1f} us each when written to a file, "
        f"{100 * share['fresh']:.2f}% of the time per fresh POST, "
        f"{100 * share['replay']:.2f}% per replay at the rates above"
    )
    print(
        "  end to end, the same receiver with stderr to /dev/null instead of a file: "
        f"fresh {quiet['fresh']['rps']:.0f}, replay {quiet['replay']['rps']:.0f} POST/s"
    )
    workers = figures["workers"]
    if isinstance(workers, str):
        print(f"\nworkers on one Postgres queue: {workers}")
    else:
        print(
            f"\nworkers on one Postgres queue ({workers['operations_per_round']} safe operations "
            f"per round, median of {workers['rounds']}):"
        )
        for count, rate in workers["ops_per_s"].items():
            print(f"  {count} worker(s){'':<27}{rate:>9.1f} operations/s")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
