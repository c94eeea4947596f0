"""A pytest plugin: each test's CPU, this process's and its reaped children's, one JSON line per
test in PYTEST_CPU_OUT-WORKER.jsonl (each pytest-xdist worker its own file). Where a whole
`make test` spends its CPU (docs/performance.md, "Where make test's CPU goes"):

    make test PYTEST_ADDOPTS="-p tools.pytest_cpu" PYTEST_CPU_OUT=/tmp/cpu
    python -m tools.pytest_cpu /tmp/cpu    # the longest tests and files, and the totals

A container's CPU is not a child's: the engine runs it. So a Docker test counts only its
Compose clients; the machine's total (/proc/stat) less these sums is roughly the engine's."""

import collections
import glob
import json
import os
import resource
import sys
import time

import pytest


def spent():
    """(this process's CPU seconds, its reaped children's)."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    theirs = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime, theirs.ru_utime + theirs.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, children), began = spent(), time.monotonic()
    yield
    (own_after, children_after), wall = spent(), time.monotonic() - began
    out = os.environ.get("PYTEST_CPU_OUT", "pytest-cpu")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{out}-{worker}.jsonl", "a", encoding="utf-8") as lines:
        row = {"id": item.nodeid, "self": own_after - own, "children": children_after - children}
        lines.write(json.dumps({**row, "wall": wall}) + "\n")


def main(out):
    rows = [
        json.loads(line)
        for name in glob.glob(f"{out}-*.jsonl")
        for line in open(name, encoding="utf-8")
    ]
    cpu = {row["id"]: row["self"] + row["children"] for row in rows}
    print(f"{len(rows)} tests: {sum(cpu.values()):.1f} s of CPU in the tests' processes")
    for test, seconds in sorted(cpu.items(), key=lambda item: -item[1])[:25]:
        print(f"{seconds:7.1f}  {test}")
    files = collections.Counter()
    for test, seconds in cpu.items():
        files[test.split("::")[0]] += seconds
    for name, seconds in files.most_common(10):
        print(f"{seconds:7.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pytest-cpu")
