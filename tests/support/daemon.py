"""Run the daemon for real in tests, on a free loopback port.

    with running_daemon(policy_yaml(services=...), tmp_path) as daemon:
        daemon.get("/api/services").json()
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")

Two ways, one interface:

- ``running_daemon(...)``: ``vramd serve`` as a subprocess, in its own process group,
  stopped with SIGTERM (the way systemd stops it), then SIGKILL after a grace period.
  For tests of the process itself: signals, exit codes, what it prints, orphans after a
  crash, a second daemon on the same database.
- ``running_daemon(..., in_thread=True)``: the same app and server (``create_app``,
  ``DaemonServer``) served by uvicorn in a thread of the test's process. It skips an
  interpreter start and the import of the whole daemon (about 1.5 s of CPU each), and
  is the default choice for tests of what the daemon does, not of its process. Its
  runtimes are real processes, its database a real SQLite file; stopping it is what a
  SIGTERM does (``handle_exit`` on the daemon's loop).

Each gets a temp directory holding the policy file, the SQLite database and the log, and
every runtime it started is killed too if the daemon failed to stop them, so no test
leaves a process behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from .ports import free_port
from .waiting import wait_until_blocking

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
    # In a thread of this process (``in_thread=True``): the thread and the daemon's loop.
    thread: InThreadServer | None = field(default=None, repr=False)

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
        wait_until_blocking(predicate, timeout=timeout, detail=self.output)

    def output(self) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")

    def runtime_pids(self) -> list[int]:
        """Every live process of the daemon's tree except the daemon itself."""
        if self.thread is not None:
            return self.thread.runtime_pids()
        try:
            return [
                p.pid
                for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.NoSuchProcess:
            return []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The daemon's event loop (in-thread daemons only)."""
        assert self.thread is not None and self.thread.loop is not None
        return self.thread.loop


def start_daemon(
    workdir: Path,
    *,
    port: int | None = None,
    ready: bool = True,
    env: dict[str, str] | None = None,
    host: str | None = None,
    args: Sequence[str] = (),
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
            *args,
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
def running_daemon(
    policy: str, workdir: Path, *, in_thread: bool = False, **kwargs: Any
) -> Iterator[Daemon]:
    (workdir / "policy.yaml").write_text(policy)
    if in_thread:
        with in_thread_daemon(workdir, **kwargs) as daemon:
            yield daemon
        return
    daemon = start_daemon(workdir, **kwargs)
    try:
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            stop_daemon(daemon)
        else:
            daemon.client.close()
    # Every line the daemon logs must be writable: a formatter that fails prints a
    # traceback to the operator's terminal for each line (and loses the line).
    assert "--- Logging error ---" not in daemon.output(), daemon.output()[-4000:]


class InThreadServer:
    """The daemon's app and server (as ``vramd serve`` builds them) in a thread."""

    def __init__(self, workdir: Path, port: int) -> None:
        from service.server import assemble, bind_listener
        from service.settings import Settings

        settings = Settings(
            config=workdir / "policy.yaml",
            db=workdir / "vramd.db",
            port=port,
            host="127.0.0.1",
            log_level="warning",
        )
        self._listener = bind_listener("127.0.0.1", port)
        self.server = assemble(
            settings, listener=self._listener, database=workdir / "vramd.db", access_log=False
        )
        self.app = self.server.app
        self.loop: asyncio.AbstractEventLoop | None = None
        self._before = _children()
        self._thread = threading.Thread(target=self._run, name=f"vramd:{port}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        runner = asyncio.Runner(loop_factory=self.server.config.get_loop_factory())
        try:
            self.loop = runner.get_loop()
            runner.run(self._serve())
        finally:
            # A connection whose last bytes were still in flight when the server stopped
            # can outlive it by a moment; uvloop then refuses to close (EBUSY) and warns
            # about the socket. A process would exit over it; this thread lets it go
            # (pyproject.toml ignores uvloop's "unclosed resource" warning for it).
            with suppress(OSError):
                runner.close()

    async def _serve(self) -> None:
        await self.server.serve(sockets=[self._listener])
        await asyncio.sleep(0.2)  # let connections the peers closed finish closing

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def runtime_pids(self) -> list[int]:
        return [p.pid for p in _children() - self._before if _running(p)]

    def stop(self, grace: float = 30.0) -> None:
        """What SIGTERM does: the daemon hears of it on its loop, uvicorn shuts down."""
        if self.loop is not None and self.alive:
            with suppress(RuntimeError):  # the loop has already closed
                self.loop.call_soon_threadsafe(self.server.handle_exit, signal.SIGTERM, None)
        self._thread.join(grace)
        for child in _children() - self._before:
            with suppress(psutil.NoSuchProcess):
                child.kill()
        assert not self._thread.is_alive(), "the in-thread daemon did not stop"


def _children() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def in_thread_daemon(
    workdir: Path, *, env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[Daemon]:
    """The daemon in a thread of this process, on ``workdir/policy.yaml``.

    ``env`` (``VRAMD_*`` settings, ``VRAMD_SIMULATED_GPUS``) is this process's
    environment while the daemon runs, as it would be the daemon's own: the settings are
    read from it and the runtimes inherit it. The test's own ``VRAMD_*`` are set aside.
    """
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("VRAMD_")]:
        del os.environ[key]
    os.environ.update(env or {})
    log = logging.FileHandler(workdir / "daemon.log")
    log.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    vramd_log = logging.getLogger("vramd")
    vramd_log.addHandler(log)
    vramd_log.setLevel(logging.INFO)
    port = port or free_port()
    server: InThreadServer | None = None
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
    try:
        server = InThreadServer(workdir, port)
        daemon = Daemon(port, None, workdir, client, thread=server)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while not server.server.started:
            if not server.alive or time.monotonic() > deadline:
                raise AssertionError(f"vramd did not come up:\n{daemon.output()}")
            time.sleep(0.02)
        yield daemon
    finally:
        client.close()
        try:
            if server is not None:
                server.stop()
        finally:
            vramd_log.removeHandler(log)
            log.close()
            os.environ.clear()
            os.environ.update(saved)
