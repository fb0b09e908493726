"""Fault injection for the reliability tests: real conditions, never mocks.

    with no_leftovers(workdir):                 # fails if a process of this test survives
        spec = demo_service(workdir, ["m"], "--ignore-sigterm")
    with sqlite_lock(db):                       # another process holds BEGIN EXCLUSIVE
        code, output = serve_until_exit(workdir, db=db)
    with tmpfs("1MiB") as disk:                 # a tiny real filesystem: fill it, remount ro
        fill(disk)

Processes are attributed to a test by its working directory: every runtime a test's
policy starts runs with ``cwd: <workdir>`` (``demo_service`` sets it), and the daemon's
command line names ``<workdir>/policy.yaml``. Other people's daemons and runtimes on the
same machine are never counted, and never touched.
"""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from .daemon import REPO_ROOT, VRAMD, demo_command
from .ports import free_port


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def demo_service(
    workdir: Path,
    models: list[str],
    *flags: str,
    kind: str = "chat",
    memory: str = "20MiB",
    load_seconds: float = 0.1,
    **keys: Any,
) -> dict[str, Any]:
    """A policy service running the demo runtime with ``flags``, tagged with ``workdir``."""
    mib = int(memory.removesuffix("MiB"))
    spec: dict[str, Any] = {
        "kind": kind,
        "models": models,
        "command": demo_command(memory, *flags, load_seconds=load_seconds),
        "cwd": str(workdir),
        "memory": {"estimate": f"{mib + 40}MiB"},
        "stop_timeout": "2s",
    }
    spec.update(keys)
    return spec


def processes_of(workdir: Path) -> list[psutil.Process]:
    """Live processes started for ``workdir``: runtimes run there, daemons name it."""
    mark = str(workdir)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = proc.info
        if info["pid"] == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cwd = info["cwd"] or ""
        if cwd == mark or cwd.startswith(mark + os.sep) or mark in " ".join(info["cmdline"] or []):
            found.append(proc)
    return found


@contextmanager
def no_leftovers(workdir: Path, grace: float = 5.0) -> Iterator[Path]:
    """Fail if a process of ``workdir`` outlives the block (after killing it)."""
    try:
        yield workdir
    finally:
        deadline = time.monotonic() + grace
        left = processes_of(workdir)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = processes_of(workdir)
        described = []
        for proc in left:
            with suppress(psutil.Error):
                described.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
                proc.kill()
        assert not described, "processes left behind:\n" + "\n".join(described)


def serve_until_exit(
    workdir: Path, *, db: Path, timeout: float = 60.0, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``vramd serve`` on ``workdir/policy.yaml`` and ``db``, expecting it to exit.

    Returns the exit status and everything it printed. A daemon that does not exit in
    ``timeout`` seconds is killed and the test fails.
    """
    log_path = workdir / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *VRAMD,
                "serve",
                "--config",
                str(workdir / "policy.yaml"),
                "--port",
                str(free_port()),
                "--db",
                str(db),
            ],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")} | (env or {}),
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"vramd serve kept running:\n{log_path.read_text(errors='replace')}")
    return code, log_path.read_text(errors="replace")


def serve_briefly(workdir: Path, *, db: Path, timeout: float = 30.0) -> None:
    """Run ``vramd serve`` on ``db`` until it answers ``/healthz``, then stop it (SIGTERM).

    Used to create and migrate a database where ``start_daemon`` cannot put it.
    """
    port = free_port()
    config = str(workdir / "policy.yaml")
    log_path = workdir / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*VRAMD, "serve", "--config", config, "--port", str(port), "--db", str(db)],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            with suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"vramd did not come up:\n{log_path.read_text(errors='replace')}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
conn.rollback()
conn.close()
"""


@contextmanager
def sqlite_lock(db: Path) -> Iterator[None]:
    """Another process holds ``BEGIN EXCLUSIVE`` on ``db`` for the block."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        try:
            yield
        finally:
            holder.communicate(input="", timeout=10)


def integrity(db: Path, *, read_only: bool = False) -> str:
    """``PRAGMA integrity_check`` of ``db`` ("ok" when sound).

    ``read_only`` opens it as immutable, for a file on a read-only filesystem, where
    SQLite cannot create the -shm file a WAL database otherwise needs.
    """
    uri = f"file:{db}?immutable=1" if read_only else f"file:{db}"
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    return "; ".join(str(row[0]) for row in rows)


@contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (mount(8) syntax, e.g. ``1m``) mounted for the block.

    Needs CAP_SYS_ADMIN (root in a container that allows mounts); skips otherwise.
    """
    mountpoint = Path(tempfile.mkdtemp(prefix="vramd-tmpfs-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        for _ in range(50):  # a process we started may still be closing a file there
            if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def remount_read_only(mountpoint: Path) -> None:
    """Make a ``tmpfs`` read-only: EROFS binds root too, unlike file modes."""
    subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem is full; returns the file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 4096
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    return filler


def ensure_fd_limit(minimum: int) -> None:
    """Raise this process's soft open-file limit to at least ``minimum`` (or skip)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= minimum:
        return
    if hard != resource.RLIM_INFINITY and hard < minimum:
        pytest.skip(f"needs {minimum} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (minimum, hard))


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def established(pid: int) -> list[Any]:
    """The TCP connections of ``pid`` in the ESTABLISHED state."""
    return [
        c
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED
    ]


def listening(pid: int) -> list[Any]:
    return [
        c for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
    ]
