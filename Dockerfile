# vramd daemon image: the daemon only. Runtimes (llama-server, vLLM, whisper-server, ...)
# are added in a derived image (deploy/runtimes.Dockerfile adds llama-server) or mounted
# at /opt/runtimes; see docs/deployment.md.
#
#   make image                    (docker where an engine runs, else buildah; no daemon needed)
#   docker build -t localhost/vramd:latest .
#   docker compose up -d          (docker-compose.yml: GPU, loopback port, volumes)

# Pinned to a Debian release: runtime binaries mounted into /opt/runtimes must be built
# against the same glibc. Any Debian bookworm image with python3 (>= 3.11) and
# python3-venv works: `make image` makes one from Debian's packages
# (localhost/vramd-base:bookworm) where no registry is in reach.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Behind a TLS-intercepting proxy, `make image` mounts the host's CA bundle and names it
# here; unset, pip uses its own.
ARG PIP_CERT
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python3 -m venv /opt/vramd
COPY pyproject.toml README.md ./
COPY service ./service
RUN /opt/vramd/bin/pip install .

FROM ${PYTHON_IMAGE}
ARG VRAMD_UID=10001
# tini reaps the runtimes' orphaned workers and forwards SIGTERM to vramd; -s keeps it
# doing so when it is not pid 1 (pid: host, hostPID). The local base already has it.
RUN if ! command -v tini >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends tini \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid "${VRAMD_UID}" --user-group vramd \
    && mkdir -p /etc/vramd /var/lib/vramd /opt/runtimes/bin /opt/runtimes/lib \
    && chown vramd:vramd /var/lib/vramd
COPY --from=build /opt/vramd /opt/vramd
COPY migrations /opt/vramd/migrations
COPY config /etc/vramd/examples
# PATH and LD_LIBRARY_PATH reach the runtimes (see service/supervisor/environment.py):
# a binary in /opt/runtimes/bin is found by its name in a policy's `command`. The NVIDIA
# Container Toolkit mounts NVML (utility: vramd's measurements) and CUDA (compute: the
# runtimes) into the container for these capabilities.
ENV PATH="/opt/vramd/bin:/opt/runtimes/bin:$PATH" \
    LD_LIBRARY_PATH="/opt/runtimes/lib" \
    VRAMD_MIGRATIONS=/opt/vramd/migrations \
    VRAMD_CONFIG=/etc/vramd/vramd.yaml \
    VRAMD_DB=/var/lib/vramd/vramd.db \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER vramd
WORKDIR /var/lib/vramd
# The policy (read-only is fine) and the SQLite database.
VOLUME ["/etc/vramd", "/var/lib/vramd"]
EXPOSE 8400
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request; port = os.environ.get('VRAMD_PORT', '8400'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"]
# vramd stops its runtimes itself on SIGTERM: give it time (compose: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "-s", "--"]
# Inside a container the daemon must listen on all interfaces for the published port to
# reach it; vramd refuses to unless server.api_keys and server.admin_keys are both set in
# the policy. Publish the port on the host's loopback only (see docker-compose.yml).
CMD ["vramd", "serve", "--host", "0.0.0.0"]
