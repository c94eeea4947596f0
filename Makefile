# Thin wrappers: each target bootstraps .venv from the hashed lock files, then runs one script.
# Variables: BACKEND=auto|local|docker  STEP=1  RUNS=30  JSON=1  PYTHON=python3 (3.11+)
#            PROJECT=name (demo through Docker: its Compose project, stateful-lab-demo by default)
#            SEED=N (chaos: the seed a chaos run printed, to draw the same kill offsets)
#            WORKERS=3  OPERATIONS=60  MODE=safe|naive (scale-chaos; chaos also node-uuid)
# Recipes are silent (@) and the bootstrap talks on stderr, so `make drill JSON=1 | jq .` and
# `make chaos | jq` see the tools' JSON on stdout and nothing else.
#            FAULTS=kill,freeze,... (scale-chaos)
#            BASELINE=REF (bench: the git ref this tree is measured against; default HEAD)

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BACKEND ?= auto
RUNS ?= 30
WORKERS ?= 3
FAULTS ?= kill,freeze,pg-restart,receiver-outage,deploy
OPERATIONS ?= 60
MODE ?= safe
BASELINE ?= HEAD  # bench: the last commit, so a change shows its cost and a clean tree the noise
SEED ?=  # chaos: empty draws a new seed, printed so the run can be replayed
TEST_WORKERS ?= 4  # pytest-xdist processes: most tests wait on a process, so more than the cores (docs/performance.md)
FAST_WORKERS ?= 3  # make test-fast's: its tests are short, each process's start is much of its cost;
#                   its property tests run a quarter of their examples (make test: all of them)
CACHED := PYTHONDONTWRITEBYTECODE=  # keep .pyc files even where the environment turns them off:
#                   the suite starts hundreds of Python processes (docs/performance.md)
PICTURES ?= data/demo
GUIDES ?= labs/01-the-duplicate.md labs/02-the-keyed-fix.md labs/03-a-retry-is-not-a-new-request.md
UV := $(abspath $(PY)) -m uv pip compile --quiet --universal --python-version 3.11 --generate-hashes --no-header

.PHONY: help demo reset test test-fast lint bench bench-engines bench-workers bench-docker drill drill-oldest chaos scale-chaos starter starter-mutations lock clean

help:  ## this list (a bare `make` prints it too)
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  make %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.DEFAULT_GOAL := help

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "make: Python 3.11 or newer is needed (set PYTHON=python3.13, say)" >&2; exit 2; }
	@echo "make: installing the hashed requirements into $(VENV) (2-3 minutes with an empty pip cache, once)" >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes \
		-r requirements.txt -r requirements-dev.txt >&2
	@touch $@

DRILL_OLDEST := .venv-drill-oldest
$(DRILL_OLDEST)/.installed: requirements-drill-oldest.txt
	@echo "make: installing the oldest LangGraph effectdrill supports into $(DRILL_OLDEST)" >&2
	@$(PYTHON) -m venv $(DRILL_OLDEST) >&2
	@$(DRILL_OLDEST)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes \
		-r requirements-drill-oldest.txt >&2
	@touch $@

drill-oldest: $(DRILL_OLDEST)/.installed  ## the oldest LangGraph effectdrill supports, in a second venv (tests/effectdrill/test_versions.py)

demo: $(VENV)/.installed  ## labs 01-03 told to a room (STEP=1 waits for Enter before each command)
	@exec $(PY) -m tools.demo --backend $(BACKEND) $(if $(STEP),--step) --pictures $(PICTURES) \
		$(if $(PROJECT),--project $(PROJECT)) $(GUIDES)
#	exec: make is the demo's parent, so on Ctrl-C make dies of the SIGINT after the demo's one line
#	(status 130, no "Error 130": tools/demo.py, MakeParent)

reset: $(VENV)/.installed  ## your own lab: `down -v --remove-orphans` of project stateful-lab, the native data/ (.venv stays)
	@$(PY) -m tools.reset

test: $(VENV)/.installed lint  ## the whole suite; the Docker tier runs when an engine answers
	$(CACHED) $(PY) -m pytest -n $(TEST_WORKERS)

test-fast: $(VENV)/.installed  ## the inner loop: tests marked fast (no Docker, no Postgres)
	$(CACHED) LAB_PROPERTY_SCALE=0.25 $(PY) -m pytest -n $(FAST_WORKERS) -m "fast and not long" -q -p no:schemathesis -p no:anyio

lint: $(VENV)/.installed  ## ruff check and ruff format --check (make test runs it first)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(VENV)/.installed  ## receiver, CLI and drill speed of this tree against git ref BASELINE (HEAD)
	@$(PY) -m tools.bench --baseline $(BASELINE)
	@$(PY) -m tools.bench_drill --baseline $(BASELINE)

drill: $(VENV)/.installed  ## every crash boundary x mode (JSON=1 for JSON lines)
	@$(PY) -m tools.drill --backend $(if $(filter auto,$(BACKEND)),local,$(BACKEND)) $(if $(JSON),--json)

chaos: $(VENV)/.installed  ## RUNS MODE runs killed at random moments (SEED=N replays); JSON out
	@$(PY) -m tools.chaos --runs $(RUNS) --mode $(MODE) $(if $(SEED),--seed $(SEED))

starter: $(VENV)/.installed  ## the core files copied unchanged, as a starter: make starter DEST=dir
	@test -n "$(DEST)" || { echo "make starter: name a new folder, e.g. make starter DEST=../ticket-starter"; exit 2; }
	@$(PY) -m tools.starter $(DEST)

starter-mutations: $(VENV)/.installed  ## the starter's suite against each mutant of the ledger (minutes)
	@$(PY) -m tools.starter_mutations

bench-engines: $(VENV)/.installed  ## effectdrill's snapshot and kill engines per crash point, against an invoke
	@$(PY) -m tools.bench_engines --runs 5

bench-workers: $(VENV)/.installed  ## operations per second with 1, 2 and 4 workers (part of bench)
	@$(PY) -m tools.bench_workers

bench-docker: $(VENV)/.installed  ## the Compose lifecycle timed on a real engine (up, restart, down)
	@$(PY) -m tools.bench_docker

scale-chaos: $(VENV)/.installed  ## WORKERS workers on a throwaway Postgres; FAULTS strike them and their dependencies
	@$(PY) -m tools.scale_chaos --workers $(WORKERS) --operations $(OPERATIONS) --mode $(MODE) --faults $(FAULTS)

lock: $(VENV)/.installed  ## regenerate the hashed lock files (the starter's too) from the .in files
	$(UV) -o requirements.txt requirements.in
	$(UV) -o requirements-dev.txt requirements-dev.in
	$(UV) -o requirements-drill-oldest.txt requirements-drill-oldest.in  # effectdrill's oldest LangGraph
	cd tools/starter && $(UV) -o requirements.txt requirements.in  # what the starter imports
	cd tools/starter && $(UV) -o requirements-otel.txt requirements-otel.in  # TRACE's extra
	cd tools/starter && $(UV) -o requirements-postgres.txt requirements-postgres.in

clean:  ## the native lab's data and the venv (Docker: make reset)
	rm -rf data $(VENV) $(DRILL_OLDEST) .pytest_cache .ruff_cache .hypothesis
