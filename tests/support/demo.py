"""Start the demo runtime (``service.demo_runtime``) as a real subprocess in tests.

    with running_demo("--memory", "50MiB") as demo:
        httpx.get(f"{demo.url}/health")      # already 200: the context waited for it
        psutil.Process(demo.pid).memory_info().rss
        demo.output()                        # everything it printed so far

The process runs on a free loopback port in its own process group (so helpers it forks
go with it), and is always stopped on exit: SIGTERM to the group, then SIGKILL to the
group after a short grace. Output goes to files, not pipes, so a chatty runtime can never
block on a full pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from .ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_CMD = [sys.executable, "-m", "service.demo_runtime"]
STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when the context exits


@dataclass
class DemoProcess:
    port: int
    proc: subprocess.Popen[bytes]
    log_dir: Path
    _final_output: str | None = None  # kept when the context exits and the files go

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        """Captured stdout, then stderr, as text; still available after the context exits."""
        if self._final_output is not None:
            return self._final_output
        return "".join(
            (self.log_dir / name).read_text(errors="replace") for name in ("stdout", "stderr")
        )

    def health_status(self) -> int | None:
        """The status of GET /health, or None if nothing answers."""
        try:
            return httpx.get(f"{self.url}/health", timeout=1.0).status_code
        except httpx.TransportError:
            return None

    def wait_ready(self, timeout: float = 10) -> None:
        """Poll /health until 200; raise if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"demo runtime exited with {self.proc.returncode}:\n{self.output()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.02)
        raise TimeoutError(f"demo runtime not ready after {timeout}s:\n{self.output()}")


@contextmanager
def running_demo(
    *args: str, ready: bool = True, timeout: float = 10, env: dict[str, str] | None = None
) -> Iterator[DemoProcess]:
    """Run ``python -m service.demo_runtime --port <free> *args`` for the with-block.

    With ``ready`` it waits (up to ``timeout`` seconds) for /health to answer 200. ``env``
    is added to this process's environment (e.g. ``CUDA_VISIBLE_DEVICES``).
    """
    with tempfile.TemporaryDirectory(prefix="demo-runtime-") as tmp:
        log_dir = Path(tmp)
        port = free_port()
        with open(log_dir / "stdout", "wb") as out, open(log_dir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                [*DEMO_CMD, "--port", str(port), *args],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                env=None if env is None else os.environ | env,
            )
        demo = DemoProcess(port=port, proc=proc, log_dir=log_dir)
        try:
            if ready:
                demo.wait_ready(timeout)
            yield demo
        finally:
            stop_group(proc)
            demo._final_output = demo.output()


def stop_group(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds, and reap the leader."""
    _signal_group(proc.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # Even when the leader is gone, forked helpers may linger in its group.
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):  # the group is already empty
        os.killpg(pgid, signum)
