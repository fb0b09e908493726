# vramd daemon image. Runtimes (llama-server, whisper-server, ...) are added in a
# derived image or mounted into /opt/runtimes; see docs (deployment).
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/vramd
COPY pyproject.toml README.md ./
COPY service ./service
RUN /opt/vramd/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 vramd \
    && mkdir -p /etc/vramd /var/lib/vramd \
    && chown vramd:vramd /var/lib/vramd
COPY --from=build /opt/vramd /opt/vramd
COPY migrations /opt/vramd/migrations
COPY config /etc/vramd/examples
ENV PATH="/opt/vramd/bin:/opt/runtimes/bin:$PATH" \
    VRAMD_MIGRATIONS=/opt/vramd/migrations \
    VRAMD_CONFIG=/etc/vramd/vramd.yaml \
    VRAMD_DB=/var/lib/vramd/vramd.db \
    PYTHONUNBUFFERED=1
USER vramd
VOLUME ["/etc/vramd", "/var/lib/vramd"]
EXPOSE 8400
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8400/healthz', timeout=4).status == 200 else 1)"
# Inside a container the daemon must listen on all interfaces for the published port to
# reach it; set server.api_keys and server.admin_keys in the policy (vramd refuses
# otherwise), and publish the port on the host's loopback only (see docker-compose.yml).
CMD ["vramd", "serve", "--host", "0.0.0.0"]
