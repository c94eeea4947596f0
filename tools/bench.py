"""Benchmark this tree's receiver and CLI against a git ref of this repository (make bench).

    .venv/bin/python -m tools.bench [--quick] [--baseline REF]

The baseline is the commit REF names (default HEAD): `git archive REF` unpacked into a temporary
folder, run from there exactly as this tree is run from here, and deleted afterwards; nothing is
written into the repository. Against HEAD a clean tree shows the noise of the machine (ratios near
1.0) and a changed one what the change costs; against an older ref, what the commits since gave.
"This tree" is the files as they are now, uncommitted changes included.

Receiver: keyed POST /tickets with fresh keys (each creates a ticket: one fsync) and with replays
(a key and body sent before: a lookup, no write), from 8 client threads posting back to back, a
new connection per request, in time-boxed rounds that alternate between the receivers. Prints
POSTs per second and p50/p99 latency (medians over the rounds), and the ratio this tree / baseline.
CLI: wall time of `workflow.py tickets`, `post` and `state` (a fresh interpreter each run, as a
learner types them), in both trees, medians of CLI_RUNS. A command the baseline's workflow.py
lacks or fails is reported in one line and left out of the ratios.
Log line: what one decision line costs when the receiver writes it to a file, and this tree's
receiver once more with stderr to /dev/null, end to end.
SIGTERM: seconds from SIGTERM to the receiver's exit while a client is stalled mid-request, in
both trees (the tests check that it exits without waiting for the stall; this is how fast).
Ledger: one keyed ticket four ways, interleaved, medians (tools.bench_ledger: a bare keyed
POST, workflow.py's graph without the ledger, with it, and LangGraph's @task), with the load
average, the ratio ledger / graph and the commits per run of LangGraph's saver and of the
ledger. This tree only.
Workers: operations per second with 1, 2 and 4 workers on a throwaway Postgres
(tools.bench_workers, with its own ROUNDS and OPERATIONS, as `make bench-workers`);
skipped with a note where PostgreSQL's binaries are missing. This tree only; --quick measures
1 worker only (one cluster: it shows the path works, not how it scales).

Every figure is printed; nothing is asserted. The last line is one JSON object with all the
figures, for scripts (and tests/tools/test_bench.py). Exit codes: 0 measured; 2 bad arguments;
3 a receiver did not start; 4 no baseline: REF names no commit, this folder is not a git work
tree, or REF's tree has no api.py or workflow.py; 130 Ctrl-C.
"""

import json
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from commandline import Parser
from exitcodes import EXIT_INTERRUPTED
from tools import bench_ledger
from tools.bench_workers import bench_workers
from tools.local import ROOT, LabError, ReceiverProcess, free_port, lab_env
from tools.pg import PostgresUnavailable

DEFAULT_BASELINE = "HEAD"  # the last commit: what an uncommitted change costs, or the noise level
CLIENT_THREADS = 8  # concurrent clients: the issue's load shape (a room hammering one receiver)
ROUNDS = 5  # per measurement; the median ignores one round disturbed by the machine
ROUND_S = 0.8  # seconds per round, kind and receiver: 600-2,000 requests at the rates seen
#                here, plenty for a p99; 5 rounds x 2 kinds x 3 receivers = 24 s of load
CLI_RUNS = 5  # per command and tree: each run costs 0.05-0.7 s; the median ignores a cold start
LOG_LINES = 20_000  # decision lines written to time one: ~0.1 s, and far above timer resolution
QUICK = dict(rounds=1, seconds=0.25, cli_runs=1)  # --quick: shows the script works, ~10 s
REQUEST_TIMEOUT_S = 10.0  # seconds: a request slower than this is counted as an error
GIT_TIMEOUT_S = 60  # seconds for one git command; they take milliseconds on this repository
STOP_TIMEOUT_S = 60  # seconds for a receiver to exit on SIGTERM: under a second when it works
TITLE = "Check supplier configuration"
FIGURES = ("rps", "p50_ms", "p99_ms")  # per round; the report shows the median over rounds
NEEDED = ("api.py", "workflow.py")  # what a ref must hold to be run: the receiver and the CLI
EXIT_OK, EXIT_NO_LAB, EXIT_NO_BASELINE = 0, 3, 4  # and 2 for bad arguments (Parser)


class NoBaseline(Exception):
    """The baseline cannot be had: an unknown ref, no git work tree, a tree without the lab."""


def baseline_commit(ref, root=ROOT):
    """(full sha, short sha) of the commit ref names in root's repository, or NoBaseline."""
    top = git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
        raise NoBaseline(f"{root} is not a git work tree: no commit to compare with")
    found = git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if found.returncode != 0:
        raise NoBaseline(f"--baseline {ref!r} names no commit of this repository")
    sha = found.stdout.strip()
    return sha, git(root, "rev-parse", "--short", sha).stdout.strip()


def export_commit(sha, folder, name, root=ROOT):
    """Unpack the commit's files (`git archive`) into folder; NoBaseline if it lacks the lab.
    name: how the messages call the commit (the ref and its short sha)."""
    folder.mkdir(parents=True)
    with subprocess.Popen(
        ["git", "-C", str(root), "archive", "--format=tar", sha],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as archive:
        try:
            with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
                tar.extractall(folder, filter="data")  # nothing outside folder, no device files
        except tarfile.TarError as error:
            raise NoBaseline(f"git archive of {name} gave no files: {error}") from None
    missing = [file for file in NEEDED if not (folder / file).is_file()]
    if missing:
        raise NoBaseline(f"{name} has no {' or '.join(missing)}: nothing to run as the baseline")
    return folder


def receiver_of(folder):
    """ReceiverProcess's arguments for a tree's lab receiver: labs/receiver.py, run as a module
    in its folder, or, in a tree from before it moved there, its api.py."""
    if (Path(folder) / "labs" / "receiver.py").is_file():
        return {"script": "labs.receiver", "cwd": folder}
    return {"script": Path(folder) / "api.py", "cwd": folder}


def post_bytes(key):
    body = json.dumps({"title": TITLE}).encode()
    head = f"POST /tickets HTTP/1.0\r\nIdempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Content-Type: application/json\r\n\r\n" + body


def send_raw(port, raw):
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
            status, seconds = send_raw(port, post_bytes(key))
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


def bench_cli(scripts, runs):
    """scripts: tree -> (workflow.py, env). Median wall seconds per command and tree.

    A command that fails in a tree (an older workflow.py without it, say) is timed no more
    there: its figure is None, and its error, in one line, is kept under "failed".
    """
    commands = {
        "tickets": ["tickets"],
        "post": ["post", "--operation", "bench:cli:post"],  # one ticket, then replays
        "state": ["state", "--thread", "bench-cli"],  # the finished thread made here
    }
    failed = {}
    for tree, (script, env) in scripts.items():
        start = ["start", "--thread", "bench-cli", "--operation", "bench:cli:start"]
        if isinstance(why := run_cli(script, start, env), str):
            failed[f"{tree}:start"] = why
    figures = {}
    for command, args in commands.items():
        times = {tree: [] for tree in scripts}
        for _ in range(runs):  # alternate the trees, so a busy moment hits both alike
            for tree, (script, env) in scripts.items():
                if f"{tree}:{command}" in failed:
                    continue
                seconds = run_cli(script, args, env)
                if isinstance(seconds, str):
                    failed[f"{tree}:{command}"] = seconds
                else:
                    times[tree].append(seconds)
        figures[command] = {
            tree + "_s": statistics.median(t) if t else None for tree, t in times.items()
        }
    figures["failed"] = failed
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


def sigterm_seconds(server):
    """Seconds from SIGTERM to exit for a running receiver with a client stalled mid-request
    (its body never comes); the receiver is gone afterwards."""
    port = urlsplit(server.url).port
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as staller:
        staller.sendall(b"POST /tickets HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")
        send_raw(port, post_bytes("bench:sigterm"))  # served after the staller: its thread waits
        start = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(STOP_TIMEOUT_S)
        return time.perf_counter() - start


def run_cli(script, args, env):
    """Wall seconds of `python script ARGS` (a fresh interpreter, as a learner runs it, in the
    script's folder), or the last line it wrote to stderr when it fails."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, cwd=script.parent, capture_output=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no stderr)"])[-1]
        return f"workflow.py {args[0]} exited {done.returncode}: {last}"
    return seconds


def main(argv=None):
    parser = Parser(prog="tools.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~10 s)")
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        metavar="REF",
        help=f"the git ref to compare this tree with (default: {DEFAULT_BASELINE})",
    )
    args = parser.parse_args(argv)
    size = QUICK if args.quick else dict(rounds=ROUNDS, seconds=ROUND_S, cli_runs=CLI_RUNS)
    try:
        sha, short = baseline_commit(args.baseline)
        with tempfile.TemporaryDirectory(prefix="stateful-lab-bench-") as tmp:
            figures = measure_against_baseline(Path(tmp), args.baseline, sha, short, size)
    except NoBaseline as error:
        print(f"bench: {error}", file=sys.stderr)
        return EXIT_NO_BASELINE
    except LabError as error:
        print(f"bench: {error}", file=sys.stderr)
        return EXIT_NO_LAB
    except KeyboardInterrupt:
        print("bench: stopped; the receivers and the temporary folder are gone", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_figures(figures)
    return EXIT_OK


def measure_against_baseline(tmp, ref, sha, short, size):
    """Every figure, measured with the baseline's files unpacked under tmp."""
    baseline = export_commit(sha, tmp / "baseline", f"{ref} ({short})")
    figures = {
        "settings": dict(size, client_threads=CLIENT_THREADS),
        "baseline": {"ref": ref, "commit": sha, "short": short},
        "this_tree": {"uncommitted_files": uncommitted_files()},
    }
    changed, named = figures["this_tree"]["uncommitted_files"], ref
    if ref != short:
        named = f"{ref} = {short}"
    print(
        f"# bench: this tree ({changed} tracked file(s) changed since HEAD) against "
        f"baseline {named} (git archive, in a temporary folder)"
    )
    print(
        f"# rounds: {size['rounds']} x {size['seconds']:g} s of keyed POSTs per kind, "
        f"{CLIENT_THREADS} client threads, a new connection per request; medians of rounds"
    )
    folders = {"this_tree": ROOT, "baseline": baseline}  # the JSON's names for the two trees
    servers = {
        tree: ReceiverProcess(
            lab_env(tmp / f"{tree}-data", free_port()),
            tmp / f"{tree}.log",
            **receiver_of(folder),
        )
        for tree, folder in folders.items()
    }
    servers["this_tree_log_devnull"] = ReceiverProcess(
        lab_env(tmp / "quiet-data", free_port()), log_path=None
    )
    started = []
    try:
        for tree, server in servers.items():
            started.append(server)
            start_receiver(tree, server)
        cli = {
            tree: (folder / "workflow.py", servers[tree].env) for tree, folder in folders.items()
        }
        figures["cli"] = bench_cli(cli, size["cli_runs"])
        ports = {tree: urlsplit(server.url).port for tree, server in servers.items()}
        figures["receiver"] = bench_receivers(ports, size["rounds"], size["seconds"])
        figures["log_line_s"] = log_line_seconds(tmp)
        figures["sigterm_s"] = {tree: sigterm_seconds(servers[tree]) for tree in folders}
        figures["workers"] = worker_figures(quick=size is QUICK)
        runs = bench_ledger.QUICK_RUNS if size is QUICK else bench_ledger.RUNS
        figures["ledger"] = bench_ledger.measure_ledger(tmp / "ledger", runs)
    finally:
        for server in started:
            server.stop()
    return figures


def worker_figures(quick):
    """Operations per second with 1, 2 and 4 workers, or why not: as `make bench-workers`
    measures them (its rounds and operations), so both print the same kind of figure."""
    try:
        if quick:  # one worker count: one throwaway cluster, not three
            return bench_workers(rounds=QUICK["rounds"], operations=8, counts=(1,))
        return bench_workers()
    except PostgresUnavailable as error:
        return f"skipped: {error}"
    except (RuntimeError, TimeoutError) as error:  # a cluster or a worker that did not start
        return f"failed: {error}"


def print_figures(figures):
    """Print the tables and the log-line cost; last, every figure as one JSON line."""
    receiver, cli = figures["receiver"], figures["cli"]
    ours, theirs, quiet = (
        receiver["this_tree"],
        receiver["baseline"],
        receiver["this_tree_log_devnull"],
    )
    short = figures["baseline"]["short"]
    ratios = figures["ratios"] = {}
    print(f"\n{'receiver: keyed POST /tickets':<38}{'this tree':>11}{short:>11}{'ratio':>9}")
    for kind in ("fresh", "replay"):
        for name, unit in (("rps", "POST/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms")):
            ratios[f"{kind}_{name}"] = ours[kind][name] / theirs[kind][name]
            print(
                f"  {kind} keys, {unit:<24}{ours[kind][name]:>11.1f}{theirs[kind][name]:>11.1f}"
                f"{ratios[f'{kind}_{name}']:>8.2f}x"
            )
    for name, result in receiver.items():
        for kind, got in result.items():
            if got["errors"]:
                print(
                    f"  ! {name}, {kind}: {got['errors']} unexpected answers {got['error_kinds']}"
                )
    print(f"\n{'cli: python workflow.py ... (wall s)':<38}{'this tree':>11}{short:>11}{'ratio':>9}")
    for command in ("tickets", "post", "state"):
        mine, base = cli[command]["this_tree_s"], cli[command]["baseline_s"]
        line = f"  {command:<36}{cell(mine, 11, '.3f')}{cell(base, 11, '.3f')}"
        if mine is not None and base is not None:
            ratios[f"cli_{command}"] = mine / base
            line += f"{ratios[f'cli_{command}']:>8.2f}x"
        print(line)
    for what, why in cli["failed"].items():
        tree, command = what.split(":")
        print(f"  ! {short if tree == 'baseline' else 'this tree'}, {command}: {why}")
    line_s = figures["log_line_s"]
    share = figures["log_line_share"] = {k: line_s * ours[k]["rps"] for k in ("fresh", "replay")}
    print(
        f"\ndecision log line (one per POST): {1e6 * line_s:.1f} us each when written to a file, "
        f"{100 * share['fresh']:.2f}% of the time per fresh POST, "
        f"{100 * share['replay']:.2f}% per replay at this tree's rates above"
    )
    print(
        "  end to end, this tree's receiver with stderr to /dev/null instead of a file: "
        f"fresh {quiet['fresh']['rps']:.0f}, replay {quiet['replay']['rps']:.0f} POST/s"
    )
    sigterm = figures["sigterm_s"]
    print(
        f"\nSIGTERM -> exit, a client stalled mid-request: this tree {sigterm['this_tree']:.2f} s, "
        f"{short} {sigterm['baseline']:.2f} s"
    )
    workers = figures["workers"]
    if isinstance(workers, str):
        print(f"\nworkers on one Postgres queue (this tree): {workers}")
    else:
        print(
            f"\nworkers on one Postgres queue, this tree ({workers['operations_per_round']} safe "
            f"operations per round, median of {workers['rounds']}):"
        )
        for count, rate in workers["ops_per_s"].items():
            print(f"  {count} worker(s){'':<27}{rate:>9.1f} operations/s")
    print("\n" + "\n".join(bench_ledger.lines(figures["ledger"])))
    print(json.dumps(figures, sort_keys=True))


# helpers


def start_receiver(tree, server):
    """Start it, or a LabError naming the tree and the receiver's last log line."""
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as error:
        log = server.log_path.read_text(errors="replace") if server.log_path else ""
        last = (log.strip().splitlines() or ["(no log)"])[-1]
        raise LabError(
            f"{tree}'s receiver did not start: {error}; its last log line: {last}"
        ) from None


def uncommitted_files():
    """How many tracked files differ from HEAD (0: this tree is HEAD)."""
    done = git(ROOT, "status", "--porcelain", "--untracked-files=no")
    return len(done.stdout.splitlines())


def git(root, *args):
    """git ARGS in root; NoBaseline when there is no git to run."""
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except FileNotFoundError:
        raise NoBaseline("git is not installed: no commit to compare with") from None


def cell(value, width, spec):
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


if __name__ == "__main__":
    sys.exit(main())
