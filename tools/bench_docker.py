"""Time the lab's Compose lifecycle on a real engine, as a learner meets it. Prints figures only.

    python -m tools.bench_docker [--runs 3] [--cold] [--project stateful-lab-measure]

- up -> first result: `down -v`, then `up -d --build api` and the first `run --rm workflow
  tickets`, timed together (and each). Warm: the image is already built, as on every run after
  the first. With --cold the lab image, the engine's dangling images and its build cache are
  removed first, so the build installs every package again (the base image stays: pulling it
  depends on the network, not on the lab).
- restart api: `restart api` alone, and restart -> the next `run --rm workflow tickets` result.
- down -v: `down -v` of a lab with both volumes in use.

Each figure is the median of --runs runs (min and max beside it). Uses project
stateful-lab-measure by default (never a learner's stateful-lab): it removes that project's
data. Set BASE_IMAGE and DOCKER_BUILDKIT=0 as for the tests where the pinned base image cannot
be pulled.
"""

import statistics
import subprocess
import sys
import time

from commandline import Parser
from tools.backends import compose_command, docker_engine_answers
from tools.local import ROOT

IMAGE = "stateful-agent-lab:local"
TIMEOUT_S = 900


def timed(argv):
    """Run argv in the repository; return its duration in seconds, exit if it fails."""
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return elapsed


def print_timing(label, values):
    cells = " ".join(f"{v:6.2f}" for v in values)
    print(
        f"  {label:<34} median {statistics.median(values):6.2f} s"
        f"   (min {min(values):.2f}, max {max(values):.2f}; runs: {cells})",
        flush=True,
    )


def main(argv=None):
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--cold", action="store_true", help="also time a build from scratch")
    parser.add_argument("--project", default="stateful-lab-measure", help="Compose project name")
    args = parser.parse_args(argv)

    compose = compose_command()
    if compose is None or not docker_engine_answers():
        sys.exit("no Docker engine with Compose answers")
    lab = [*compose, "-p", args.project]
    engine = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    version = subprocess.run([*compose, "version"], capture_output=True, text=True).stdout
    print(f"engine {engine}; {version.splitlines()[0] if version else ' '.join(compose)}")
    print(f"project {args.project}, {args.runs} runs per figure")

    def up_to_first_result(cold):
        timed([*lab, "down", "-v"])
        if cold:
            # The classic builder's cache is the image's parent layers; older builds of the
            # lab, now dangling, share them. Remove both, or the "cold" build is all cache hits.
            subprocess.run(["docker", "image", "rm", IMAGE], capture_output=True)
            subprocess.run(["docker", "image", "prune", "-f"], capture_output=True)
            subprocess.run(["docker", "builder", "prune", "-f"], capture_output=True)
        up = timed([*lab, "up", "-d", "--build", "api"])
        first = timed([*lab, "run", "--rm", "workflow", "tickets"])
        return up, first

    kinds = [("cold", True), ("warm", False)] if args.cold else [("warm", False)]
    for kind, cold in kinds:
        ups, firsts = [], []
        for _ in range(args.runs):
            up, first = up_to_first_result(cold)
            ups.append(up)
            firsts.append(first)
        print(f"{kind} start (image {'removed first' if cold else 'already built'}):")
        print_timing("up -d --build api", ups)
        print_timing("first run --rm workflow tickets", firsts)
        print_timing(
            "up -> first tickets result", [u + f for u, f in zip(ups, firsts, strict=True)]
        )

    restarts, restart_to_result = [], []
    for _ in range(args.runs):
        restart = timed([*lab, "restart", "api"])
        result = timed([*lab, "run", "--rm", "workflow", "tickets"])
        restarts.append(restart)
        restart_to_result.append(restart + result)
    print("restart:")
    print_timing("restart api", restarts)
    print_timing("restart -> next tickets result", restart_to_result)

    downs = []
    for _ in range(args.runs):
        timed([*lab, "up", "-d", "api"])
        timed([*lab, "run", "--rm", "workflow", "tickets"])  # both volumes exist and were used
        downs.append(timed([*lab, "down", "-v"]))
    print("cleanup:")
    print_timing("down -v", downs)


if __name__ == "__main__":
    main()
