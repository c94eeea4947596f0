#!/usr/bin/env bash
# Prepare a real Docker engine for the lab's Docker tier, on a fresh Debian machine, as root.
#
#   1. packages      docker.io (engine 20.10), docker-compose (1.29, for the test that the README's
#                    "Compose v1" holds), debootstrap - if missing
#   1b. Compose v2   the `docker compose` plugin the guides use, from Debian trixie
#   2. engine        reuse an engine that already answers, else start dockerd in the background
#   3. base image    a local Python image made with debootstrap, because no registry can be
#                    reached here, so the Dockerfile's digest-pinned python:3.13-slim cannot be pulled
#   4. lab image     stateful-agent-lab:local, built FROM that base image
#   5. postgres      stateful-lab-postgres:local for the `scale` profile (lab 10): that base image
#                    plus Debian's postgresql package, standing in for the digest-pinned official
#                    postgres image, which cannot be pulled here either
#   6. prometheus    stateful-lab-prometheus:local for the `observe` profile: that base image plus
#                    Debian's prometheus package, standing in for the digest-pinned official image
#
# Idempotent: each phase is skipped when its result is already there. Run it again at will.
# Afterwards, in the same environment as the tests:
#   export BASE_IMAGE=stateful-lab-base:local DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
# and when done: bash .ci/docker-teardown.sh (it stops dockerd only if this script started it).
#
# Settings (environment):
#   BASE_IMAGE             tag of the local base image          (default stateful-lab-base:local)
#   LAB_DOCKER_STATE_DIR   dockerd's log and our pid file       (default /tmp/stateful-lab-docker)
#   LAB_DOCKERD_TIMEOUT    seconds to wait for the engine       (default 60)
#   LAB_DEBIAN_SUITE       Debian release of the base image     (default bookworm: Python 3.11)
#   LAB_REBUILD_BASE=1     rebuild the base image even if it exists
#   LAB_POSTGRES_IMAGE     tag of the local postgres image      (default stateful-lab-postgres:local)
#   LAB_PROMETHEUS_IMAGE   tag of the local prometheus image    (default stateful-lab-prometheus:local)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BASE_IMAGE=${BASE_IMAGE:-stateful-lab-base:local}
STATE_DIR=${LAB_DOCKER_STATE_DIR:-/tmp/stateful-lab-docker}
DOCKERD_TIMEOUT=${LAB_DOCKERD_TIMEOUT:-60}
SUITE=${LAB_DEBIAN_SUITE:-bookworm}
LAB_IMAGE=stateful-agent-lab:local
POSTGRES_IMAGE=${LAB_POSTGRES_IMAGE:-stateful-lab-postgres:local}
PROMETHEUS_IMAGE=${LAB_PROMETHEUS_IMAGE:-stateful-lab-prometheus:local}
PROJECT=stateful-lab
# The preinstalled docker 28 client has no BuildKit (buildx) here, and engine 20.10 does not need it:
# use the classic builder, from the docker CLI and from Compose alike.
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0 BASE_IMAGE

t_start=$EPOCHREALTIME
phase_start=$t_start
say() { printf '[docker-setup] %s\n' "$*"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
phase() { phase_start=$EPOCHREALTIME; say "== $*"; }
done_phase() { say "   ${1:-done} ($(elapsed "$phase_start") s)"; }
die() { say "ERROR: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run me as root (apt-get, dockerd, debootstrap and chroot need it)"
mkdir -p "$STATE_DIR"

engine_answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
# live NAME PID: true if PID is a running NAME. A killed process can linger as a zombie until it is
# reaped; kill -0 (and so dockerd's own pid-file checks) still sees it, so read its state instead.
live() {
  local stat
  stat=$(cat "/proc/$2/stat" 2>/dev/null) || return 1
  [[ $stat == *"($1) "[!Z]* ]]
}

# ---------------------------------------------------------------- 1. packages
phase "packages: docker.io, docker-compose, debootstrap"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
  say "   installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >"$STATE_DIR/apt.log" 2>&1 \
    || { tail -n 30 "$STATE_DIR/apt.log" >&2; die "apt-get install failed"; }
  done_phase "installed"
else
  done_phase "already installed"
fi
command -v docker >/dev/null || die "no docker client on PATH"

# ---------------------------------------------------------------- 1b. Compose v2
# The guides say `docker compose` (v2, a CLI plugin), as Docker Desktop and Docker's own packages
# install it. Debian bookworm packages only Compose 1.29 (a Python program: about 0.6 s of CPU per
# command, against 0.05 s for v2), so take the v2 plugin from Debian trixie's archive: apt verifies
# it against the Debian archive keyring, and it needs only libc6 (>= 2.34). Only the plugin binary is
# copied, to Docker's system plugin folder; bookworm's packages stay as they are.
phase "Compose v2 plugin"
if docker compose version >/dev/null 2>&1; then
  done_phase "already there: $(docker compose version --short 2>/dev/null)"
else
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
  { apt-get "${apt_opts[@]}" update -qq && (cd "$apt_dir" && apt-get "${apt_opts[@]}" download -qq docker-compose/trixie); } \
    >"$STATE_DIR/compose-v2.log" 2>&1 \
    || { tail -n 20 "$STATE_DIR/compose-v2.log" >&2; rm -rf "$apt_dir"; die "could not fetch trixie's docker-compose (v2)"; }
  dpkg-deb -x "$apt_dir"/docker-compose_*.deb "$apt_dir/root"
  install -D -m 0755 "$apt_dir/root/usr/libexec/docker/cli-plugins/docker-compose" \
    /usr/local/lib/docker/cli-plugins/docker-compose
  rm -rf "$apt_dir"
  docker compose version >/dev/null 2>&1 || die "the Compose v2 plugin does not run"
  done_phase "installed $(docker compose version --short) in /usr/local/lib/docker/cli-plugins"
fi

# ---------------------------------------------------------------- 2. engine
phase "engine"
if engine_answers; then
  done_phase "an engine already answers ($(docker version --format '{{.Server.Version}}')); leaving it alone"
else
  # A dockerd killed without cleanup (e.g. with the machine's previous session) leaves pid files:
  # dockerd refuses to start while its own names a process that still exists, and waits in vain
  # for the containerd that the other names. Remove those that name no running dockerd/containerd.
  for stale in dockerd:/var/run/docker.pid containerd:/var/run/docker/containerd/containerd.pid; do
    file=${stale#*:}
    if [[ -f $file ]] && ! live "${stale%%:*}" "$(<"$file")"; then
      say "   removing stale $file ($(<"$file"))"
      rm -f "$file"
    fi
  done
  say "   starting dockerd (log: $STATE_DIR/dockerd.log)"
  # setsid: its own session, so it outlives this script and no terminal hang-up reaches it.
  setsid dockerd >"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
  dockerd_pid=$!
  echo "$dockerd_pid" >"$STATE_DIR/dockerd.pid"
  deadline=$(awk -v n="$EPOCHREALTIME" -v t="$DOCKERD_TIMEOUT" 'BEGIN { printf "%d", n + t }')
  until engine_answers; do
    if ! live dockerd "$dockerd_pid"; then
      tail -n 30 "$STATE_DIR/dockerd.log" >&2
      rm -f "$STATE_DIR/dockerd.pid"
      die "dockerd exited"
    fi
    if (( ${EPOCHREALTIME%.*} >= deadline )); then
      tail -n 30 "$STATE_DIR/dockerd.log" >&2
      die "dockerd did not answer within ${DOCKERD_TIMEOUT} s (pid $dockerd_pid left running)"
    fi
    sleep 0.2 # poll interval, not a synchronisation guess: the loop ends on the engine's answer
  done
  done_phase "engine $(docker version --format '{{.Server.Version}}') answers, dockerd pid $dockerd_pid"
fi

# ---------------------------------------------------------------- 3. base image
phase "base image $BASE_IMAGE"
if [[ ${LAB_REBUILD_BASE:-0} != 1 ]] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  done_phase "already present"
else
  rootfs=$(mktemp -d /var/tmp/stateful-lab-rootfs.XXXXXX)
  trap 'rm -rf --one-file-system "$rootfs"' EXIT
  say "   debootstrap $SUITE minbase + python3, python3-venv, ca-certificates into $rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$rootfs" >"$STATE_DIR/debootstrap.log" 2>&1 \
    || { tail -n 30 "$STATE_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  say "   debootstrap done ($(elapsed "$phase_start") s)"
  # pip in the lab build must reach PyPI through this machine's network, which may re-sign TLS:
  # trust the same extra CA certificates as the host (Debian's pip uses the system bundle).
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    say "   added the host's extra CA certificates"
  fi
  chroot "$rootfs" python3 -m venv /opt/venv
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* \
         "$rootfs"/root/.cache
  say "   importing ($(du -sm "$rootfs" | cut -f1) MB)"
  # Like python:3.13-slim: `python` and `pip` on PATH, UTF-8, an interpreter as default command.
  tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$BASE_IMAGE" >/dev/null
  rm -rf --one-file-system "$rootfs"
  trap - EXIT
  done_phase "built: $(docker run --rm "$BASE_IMAGE" python --version 2>&1)"
fi

# ---------------------------------------------------------------- 4. lab image
phase "lab image $LAB_IMAGE (FROM $BASE_IMAGE, classic builder)"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi
say "   ${compose[*]} -p $PROJECT build api (log: $STATE_DIR/build.log)"
"${compose[@]}" -p "$PROJECT" build api >"$STATE_DIR/build.log" 2>&1 \
  || { tail -n 40 "$STATE_DIR/build.log" >&2; die "image build failed"; }
done_phase "built $(docker image inspect --format '{{.Id}}' "$LAB_IMAGE" | cut -c1-19), $(docker image inspect --format '{{.Size}}' "$LAB_IMAGE" | awk '{ printf "%d MB", $1 / 1e6 }')"

# ---------------------------------------------------------------- 5. postgres image
phase "postgres image $POSTGRES_IMAGE (FROM $BASE_IMAGE + Debian's postgresql)"
if [[ ${LAB_REBUILD_BASE:-0} != 1 ]] && docker image inspect "$POSTGRES_IMAGE" >/dev/null 2>&1; then
  done_phase "already present"
else
  # What compose.yaml relies on in the official image: a postgres user with uid 999 (the service
  # runs as 999:999) owning /var/run/postgresql, PGDATA initialised on first start with
  # POSTGRES_PASSWORD, `postgres` and `pg_isready` on PATH. The official entrypoint does much more; this one does just that.
  build_dir=$(mktemp -d)
  cat >"$build_dir/docker-entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" >"$pwfile"
  initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" -E UTF8 --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
fi
exec "$@"
ENTRYPOINT
  cat >"$build_dir/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
RUN groupadd --system --gid 999 postgres \
    && useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql --shell /bin/sh postgres \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 3777 /var/run/postgresql \
    && ln -s /usr/lib/postgresql/*/bin/postgres /usr/lib/postgresql/*/bin/initdb /usr/local/bin/
COPY docker-entrypoint.sh /usr/local/bin/
ENV PGDATA=/var/lib/postgresql/data
USER 999:999
ENTRYPOINT ["sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
DOCKERFILE
  docker build -t "$POSTGRES_IMAGE" "$build_dir" >"$STATE_DIR/postgres-build.log" 2>&1 \
    || { tail -n 30 "$STATE_DIR/postgres-build.log" >&2; rm -rf "$build_dir"; die "postgres image build failed"; }
  rm -rf "$build_dir"
  done_phase "built: $(docker run --rm --entrypoint postgres "$POSTGRES_IMAGE" --version)"
fi

# ---------------------------------------------------------------- 6. prometheus image
phase "prometheus image $PROMETHEUS_IMAGE (FROM $BASE_IMAGE + Debian's prometheus)"
if [[ ${LAB_REBUILD_BASE:-0} != 1 ]] && docker image inspect "$PROMETHEUS_IMAGE" >/dev/null 2>&1; then
  done_phase "already present"
else
  # What compose.yaml relies on in the official image: `prometheus` and `promtool` on PATH, run
  # as nobody (65534). The service names its own flags and mounts its own configuration.
  build_dir=$(mktemp -d)
  cat >"$build_dir/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
USER 65534:65534
ENTRYPOINT ["prometheus"]
DOCKERFILE
  docker build -t "$PROMETHEUS_IMAGE" "$build_dir" >"$STATE_DIR/prometheus-build.log" 2>&1 \
    || { tail -n 30 "$STATE_DIR/prometheus-build.log" >&2; rm -rf "$build_dir"; die "prometheus image build failed"; }
  rm -rf "$build_dir"
  done_phase "built: $(docker run --rm "$PROMETHEUS_IMAGE" --version 2>&1 | head -n 1)"
fi

say "ready in $(elapsed "$t_start") s. For the tests: export BASE_IMAGE=$BASE_IMAGE LAB_POSTGRES_IMAGE=$POSTGRES_IMAGE LAB_PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0"
