# One image for every program of the lab: Python, the hashed runtime requirements and the code.
# compose.yaml runs it as the receiver (python -m labs.receiver), the workflow CLI with the lab's switches
# (python -m labs, around workflow.py) and the scale profile's workers (python -m labs.workers).
#
# PYTHON_IMAGE is python:3.13-slim, pinned by digest so every build starts from the same
# bytes. To refresh the pin, take the digest of the multi-arch index (the manifest list), not the
# digest of one platform's image, or arm64 (Apple silicon) and amd64 users stop sharing one pin:
#   docker buildx imagetools inspect python:3.13-slim      # the "Digest:" line at the top
ARG PYTHON_IMAGE=python:3.13-slim@sha256:57b29a7c050c4e679e4bea572e14b3965cf4b5839de2da49d55e49ffc4024f39
# Where no registry answers (as in CI here), build FROM a local image instead:
# --build-arg BASE_IMAGE=<image>. compose.yaml forwards BASE_IMAGE from the environment; when it is not set,
# Compose 2 sends nothing but Compose 1.29 sends an empty value, hence the :- fallback to the pin.
ARG BASE_IMAGE=${PYTHON_IMAGE}
FROM ${BASE_IMAGE:-${PYTHON_IMAGE}}

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    LANGGRAPH_STRICT_MSGPACK=true

# A fixed, unprivileged uid/gid. /data is where compose mounts the named volumes: a new volume copies
# this directory's owner, so the app can write its SQLite files (and their -wal/-shm) there, while
# the root filesystem stays read-only (read_only: true in compose.yaml).
RUN groupadd --system --gid 10001 lab \
    && useradd --system --uid 10001 --gid lab --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin lab \
    && install -d -o lab -g lab -m 0750 /data

WORKDIR /app
# Every package, transitive ones included, is pinned by version and sha256 (uv-generated lock).
# pip compiles the packages' .pyc files here, at build time: at run time the root fs is read-only.
COPY requirements.txt .
RUN pip install --no-cache-dir --require-hashes -r requirements.txt

# Nothing may write bytecode at run time (read-only root fs). The code stays owned by root:
# the app user cannot change it. labs/receiver.py is the lab's receiver, built on api.py (the core's).
ENV PYTHONDONTWRITEBYTECODE=1
COPY *.py ./
COPY effectdrill/ effectdrill/
COPY labs/*.py labs/
COPY labs/graphs/*.py labs/graphs/
# Their bytecode, made once here: at run time nothing can write it (read-only root fs), and
# without it every command would compile the lab's own files again before it starts. /reports:
# the drill's mount (compose.yaml); a new report-data volume copies its owner, as /data's do.
RUN python -m compileall -q /app \
    && install -d -o lab -g lab -m 0750 /reports

# Numeric, so the host and orchestrators can tell it is not root without reading /etc/passwd.
USER 10001:10001
# The receiver's port, inside the lab's internal network only: compose publishes nothing.
EXPOSE 8000
CMD ["python", "-m", "labs", "--help"]
