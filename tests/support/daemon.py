"""Run ``vramd serve`` for real in tests: a subprocess on a free loopback port.

    with running_daemon(policy_yaml(services=...), tmp_path) as daemon:
        daemon.get("/api/services").json()
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")

The daemon gets its own process group and a temp directory holding the policy file and
the SQLite database. On exit it is stopped with SIGTERM (the way systemd stops it), then
SIGKILL after a grace period, and every runtime it started is killed too if the daemon
failed to stop them, so no test leaves a process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from .ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
VRAMD = [sys.executable, "-m", "service.cli"]
# Creep detection's warm-up shortened, so a test sees a leak flagged within seconds.
FAST_CREEP = {
    "VRAMD_CREEP_MIN_AGE_S": "1",
    "VRAMD_CREEP_MIN_REQUESTS": "10",
    "VRAMD_CREEP_MIN_SAMPLES": "10",
}


def demo_command(
    memory: str = "40MiB",
    *extra: str,
    load_seconds: float = 0.1,
    gpu_memory: str | None = None,
) -> list[str]:
    """A policy ``command`` running the demo runtime with ``memory`` held.

    ``gpu_memory``: device memory it holds on simulated GPUs (``tests/support/simgpu.py``).
    """
    gpu = ["--gpu-memory", gpu_memory] if gpu_memory is not None else []
    return [
        "${PYTHON}",
        "-m",
        "service.demo_runtime",
        "--port",
        "${PORT}",
        "--model",
        "${MODEL}",
        "--memory",
        memory,
        "--load-seconds",
        str(load_seconds),
        *gpu,
        *extra,
    ]


def policy_yaml(
    services: dict[str, dict[str, Any]],
    *,
    budget: str | None = "600MiB",
    headroom: str = "16MiB",
    sample_interval: str = "0.2s",
    extra: str = "",
    backend: str = "host",
) -> str:
    """A policy around ``services`` (a mapping of name to service keys), on the host
    backend unless ``backend`` says otherwise; ``budget=None`` leaves the device's total."""
    import json

    lines = [
        "version: 1",
        "device:",
        f"  backend: {backend}",
        *([f"  budget: {budget}"] if budget is not None else []),
        f"  headroom: {headroom}",
        f"  sample_interval: {sample_interval}",
        "services:",
    ]
    for name, spec in services.items():
        lines.append(f"  {name}:")
        for key, value in spec.items():
            lines.append(f"    {key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n" + textwrap.dedent(extra)


@dataclass
class Daemon:
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    client: httpx.Client = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.workdir / "policy.yaml"

    @property
    def db(self) -> Path:
        return self.workdir / "vramd.db"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.post(path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.delete(path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def service(self, name: str) -> dict[str, Any]:
        response = self.get(f"/api/services/{name}")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def events(self, **params: Any) -> list[dict[str, Any]]:
        response = self.get("/api/events", params=params)
        response.raise_for_status()
        data: list[dict[str, Any]] = response.json()["events"]
        return data

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout}s\n{self.output()}")

    def output(self) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")

    def runtime_pids(self) -> list[int]:
        """Every live process of the daemon's tree except the daemon itself."""
        try:
            return [
                p.pid
                for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.NoSuchProcess:
            return []


def start_daemon(
    workdir: Path,
    *,
    port: int | None = None,
    ready: bool = True,
    env: dict[str, str] | None = None,
    host: str | None = None,
) -> Daemon:
    """Start ``vramd serve`` on ``workdir/policy.yaml`` (the caller stops it).

    ``env`` adds ``VRAMD_*`` settings (the test's own environment's are dropped).
    """
    port = port or free_port()
    log = (workdir / "daemon.log").open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")} | (env or {})
    proc = subprocess.Popen(
        [
            *VRAMD,
            "serve",
            "--config",
            str(workdir / "policy.yaml"),
            "--port",
            str(port),
            "--db",
            str(workdir / "vramd.db"),
            *(["--host", host] if host else []),
        ],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    log.close()
    daemon = Daemon(port, proc, workdir, httpx.Client(base_url=f"http://127.0.0.1:{port}"))
    if ready:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            with suppress(httpx.HTTPError):
                if daemon.get("/healthz", timeout=1).status_code in (200, 503):
                    return daemon
            time.sleep(0.05)
        stop_daemon(daemon)
        raise AssertionError(f"vramd did not come up:\n{daemon.output()}")
    return daemon


def stop_daemon(daemon: Daemon, sig: int = signal.SIGTERM, grace: float = 20.0) -> int | None:
    """Signal the daemon, wait, then make sure nothing of its tree survives."""
    tree = []
    with suppress(psutil.NoSuchProcess):
        tree = psutil.Process(daemon.proc.pid).children(recursive=True)
    with suppress(ProcessLookupError):
        os.kill(daemon.proc.pid, sig)
    code: int | None
    try:
        code = daemon.proc.wait(grace)
    except subprocess.TimeoutExpired:
        daemon.proc.kill()
        code = None
        daemon.proc.wait(5)
    for child in tree:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    daemon.client.close()
    return code


@contextmanager
def running_daemon(policy: str, workdir: Path, **kwargs: Any) -> Iterator[Daemon]:
    (workdir / "policy.yaml").write_text(policy)
    daemon = start_daemon(workdir, **kwargs)
    try:
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            stop_daemon(daemon)
        else:
            daemon.client.close()
