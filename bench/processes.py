"""Real processes for the live benchmarks: ``vramd serve``, demo runtimes, reference servers.

``bench.proxy`` and ``bench.idle`` measure the daemon as it runs, not a model of it, so
both start ``vramd serve`` as a subprocess on a free loopback port, on a policy written
to a temporary folder (the SQLite database goes there too). Every process gets its own
process group and is stopped with SIGTERM, then SIGKILL of the whole group after a grace
period, so a benchmark that fails half-way leaves nothing behind: vramd stops the
runtimes it started, and whatever it could not stop dies with its group.

A policy service here always runs the demo runtime (``python -m service.demo_runtime``),
which answers at once when asked to (``--latency-ms 0 --chunk-delay-ms 0``): what is
left of a request's time is then the HTTP path itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    ready: Callable[[], bool], *, timeout: float, what: str, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:g}s")
        time.sleep(0.05)


def answers(url: str, *statuses: int) -> Callable[[], bool]:
    """A readiness check: ``GET url`` answers one of ``statuses`` (200 by default)."""
    wanted = statuses or (200,)

    def check() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code in wanted
        except httpx.TransportError:
            return False

    return check


@contextlib.contextmanager
def spawn(
    argv: list[str], *, log: Path | None = None, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` in its own process group until the block ends.

    Output goes to ``log`` (or nowhere): a terminal or a pipe read by nobody would make
    the servers' per-request log lines cost what they do not cost in production.
    ``env`` is the whole environment of the process (default: this one's).
    """
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )
    finally:
        if log is not None and not isinstance(out, int):
            out.close()
    try:
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # Whatever is left of the group (a runtime vramd failed to stop) goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def demo_command(*flags: str) -> list[str]:
    """A policy ``command`` running the demo runtime, answering without delay."""
    return [
        "${PYTHON}",
        *("-m", "service.demo_runtime", "--port", "${PORT}", "--model", "${MODEL}"),
        *("--latency-ms", "0", "--chunk-delay-ms", "0", *flags),
    ]


def policy_text(
    services: Mapping[str, Mapping[str, Any]],
    *,
    budget: str,
    headroom: str = "64MiB",
    sample_interval: str | None = "1s",
    defaults: Mapping[str, Any] | None = None,
) -> str:
    """A host-backend policy around ``services`` (name -> service keys), as YAML text;
    ``sample_interval=None`` leaves the policy's default.

    JSON is YAML, so each value is written as JSON: no YAML library needed to build it.
    """
    lines = ["version: 1", "device:", "  backend: host", f"  budget: {budget}"]
    lines.append(f"  headroom: {headroom}")
    if sample_interval is not None:
        lines.append(f"  sample_interval: {sample_interval}")
    if defaults:
        lines.append(f"defaults: {json.dumps(dict(defaults))}")
    lines.append("services:")
    lines += [f"  {name}: {json.dumps(dict(spec))}" for name, spec in services.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Vramd:
    """A running ``vramd serve``."""

    url: str
    proc: subprocess.Popen[bytes]
    workdir: Path

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=10)
        response.raise_for_status()
        return response.json()

    def services(self) -> list[dict[str, Any]]:
        services: list[dict[str, Any]] = self.get("/api/services")
        return services

    def wait_ready(self, names: list[str], timeout: float = 60.0) -> None:
        """Until every service in ``names`` is ready."""

        def all_ready() -> bool:
            states = {svc["name"]: svc["state"] for svc in self.services()}
            return all(states.get(name) == "ready" for name in names)

        wait_until(all_ready, timeout=timeout, what=f"services {names}", proc=self.proc)


@contextlib.contextmanager
def running_vramd(
    policy: str | Path,
    *,
    argv_prefix: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    keep: Path | None = None,
) -> Iterator[Vramd]:
    """``vramd serve`` on ``policy`` (YAML text, or a file), until the block ends.

    ``argv_prefix`` replaces ``python -m service.cli`` (a profiler wrapping the daemon);
    its log and database lie in a temporary folder, or in ``keep`` when given.
    """
    with contextlib.ExitStack() as stack:
        if keep is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vramd-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True, exist_ok=True)
        if isinstance(policy, Path):
            config = policy.resolve()
        else:
            config = workdir / "policy.yaml"
            config.write_text(policy, encoding="utf-8")
        port = free_port()
        argv = list(argv_prefix or [sys.executable, "-m", "service.cli"])
        argv += ["serve", "--config", str(config), "--port", str(port)]
        argv += ["--db", str(workdir / "vramd.db")]
        # The daemon's own settings come from the environment: start from none of them.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")}
        clean |= dict(env or {})
        proc = stack.enter_context(spawn(argv, log=workdir / "vramd.log", env=clean))
        url = f"http://127.0.0.1:{port}"
        wait_until(answers(url + "/healthz", 200, 503), timeout=60, what="vramd", proc=proc)
        yield Vramd(url, proc, workdir)
