# vramd with llama.cpp's llama-server, built from the sources llama-cpp-python's sdist
# vendors, for the same Debian release as the vramd image (a CPU build: portable x86-64,
# no -march=native). A pattern for adding any runtime; docs/deployment.md, "Adding
# runtimes to the image".
#
#   make image-runtimes           (builds localhost/vramd:latest first)
#   docker build -f deploy/runtimes.Dockerfile -t localhost/vramd-runtimes:latest .
#
# The build stage runs vramd's own installer (python -m service.real_runtimes install,
# what `make real-runtimes` runs), so the llama.cpp version and build flags are the ones
# the real-runtime tests use. It also writes tiny random-weight GGUF models, which the
# image keeps in /opt/runtimes/models (1.4 MB) for a smoke test; mount real models.

ARG VRAMD_IMAGE=localhost/vramd:latest

FROM ${VRAMD_IMAGE} AS llama
ARG PIP_CERT
ARG PIP_INDEX_URL
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m service.real_runtimes install --only llama.cpp --dir /build

FROM ${VRAMD_IMAGE}
USER root
# llama-server links OpenMP (libgomp) and OpenSSL (libssl3, already in the image).
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=llama /build/build/llama-server/bin/llama-server /opt/runtimes/bin/llama-server
COPY --from=llama /build/models/ /opt/runtimes/models/
# Fail the build, not the first load, when the binary misses a library.
RUN ! ldd /opt/runtimes/bin/llama-server | grep "not found" \
    && llama-server --version
USER vramd
