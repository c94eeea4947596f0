#!/usr/bin/env bash
# Undo .ci/docker-setup.sh: stop dockerd - only if docker-setup.sh started it (its pid file says so).
# Images are kept, so the next setup on this machine skips the base image and reuses the build cache.
# Safe to run more than once, and when setup never ran.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

STATE_DIR=${LAB_DOCKER_STATE_DIR:-/tmp/stateful-lab-docker}
PID_FILE=$STATE_DIR/dockerd.pid
STOP_TIMEOUT=${LAB_DOCKERD_TIMEOUT:-60}
say() { printf '[docker-teardown] %s\n' "$*"; }
# True if PID is a live dockerd; a zombie (exited, not yet reaped) does not count.
live_dockerd() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $stat == *"(dockerd) "[!Z]* ]]
}

# No `down -v` here: the tests run in Compose projects of their own and remove them; the project
# stateful-lab is a learner's, and a script must not delete a lab somebody started by hand.

if [[ ! -f $PID_FILE ]]; then
  say "dockerd was not started by docker-setup.sh: leaving the engine alone"
  exit 0
fi
pid=$(<"$PID_FILE")
# Only signal the process if it is still the dockerd we started (pids get reused).
if [[ $pid =~ ^[0-9]+$ ]] && live_dockerd "$pid"; then
  say "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  deadline=$((SECONDS + STOP_TIMEOUT))
  while live_dockerd "$pid"; do
    if ((SECONDS >= deadline)); then
      say "dockerd still running after ${STOP_TIMEOUT} s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      break
    fi
    sleep 0.2 # poll interval; the loop ends when the process is gone
  done
  say "dockerd stopped"
else
  say "pid $pid is no longer dockerd: nothing to stop"
fi
rm -f "$PID_FILE"
