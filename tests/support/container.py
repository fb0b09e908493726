"""Run the vramd image as a container, with whatever engine the machine has.

    engine = container_engine()             # None where neither docker nor buildah runs
    with engine.run(IMAGE, port=port, mounts=[Mount(policy, POLICY, read_only=True)]) as box:
        box.main_process()                  # the container's main process, seen from the host

Two engines, one interface, as ``deploy/image/build`` chooses them: ``docker`` where a
Docker engine answers (``docker run -p 127.0.0.1:PORT:8400``), else ``buildah run`` with
chroot isolation. Buildah's containers share the host's network and pid namespace: the
published port is the daemon's own (``VRAMD_PORT``), and the host's pids are the
container's. Either way ``main_process()`` is the host's view of the entrypoint, so a
test signals and watches it as the engine would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

BUILDAH_STORAGE = os.environ.get("BUILDAH_STORAGE_DRIVER", "vfs")


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False

    def flag(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


class Container(Protocol):
    name: str

    def main_process(self) -> psutil.Process: ...

    def logs(self) -> str: ...

    def wait(self, timeout: float) -> int | None: ...

    def exec(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]: ...


class Engine(Protocol):
    name: str

    def image_config(self, image: str) -> dict[str, Any]: ...

    def user_id(self, image: str, user: str) -> int: ...

    def run(
        self,
        image: str,
        *,
        port: int,
        mounts: Sequence[Mount],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> Any: ...


def container_engine() -> Engine | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        return Docker(docker)
    buildah = shutil.which("buildah")
    return Buildah(buildah) if buildah else None


def _fresh_name() -> str:
    return f"vramd-test-{uuid.uuid4().hex[:8]}"


def _check(argv: Sequence[str]) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


# --- buildah -------------------------------------------------------------------------------


@dataclass
class BuildahContainer:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    engine: Buildah
    mounts: list[str]  # buildah run's --volume flags: each run of the container gets them
    _main: psutil.Process | None = None
    _root: tuple[int, int] | None = None  # (st_dev, st_ino) of the container's root

    def main_process(self) -> psutil.Process:
        """The entrypoint: the first process under buildah's own helpers (which re-exec
        buildah, so their argv, not their name, says what they are)."""
        if self._main is not None:
            return self._main
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with suppress(psutil.Error):
                for child in psutil.Process(self.process.pid).children(recursive=True):
                    if not Path(child.cmdline()[0]).name.startswith("buildah"):
                        root = os.stat(f"/proc/{child.pid}/root")
                        self._main, self._root = child, (root.st_dev, root.st_ino)
                        return child
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"container {self.name} has no main process:\n{self.logs()}")

    def processes(self) -> list[psutil.Process]:
        """Every host process in the container: those whose root is its root. Without a
        pid namespace, a process whose parent died is not ended with the container."""
        found = []
        for process in psutil.process_iter():
            with suppress(OSError):
                there = os.stat(f"/proc/{process.pid}/root")
                if (there.st_dev, there.st_ino) == self._root:
                    found.append(process)
        return found

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def exec(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Another process in the container (buildah run shares its root and network)."""
        command = self.engine._cmd(
            "run", "--isolation", "chroot", *self.mounts, self.name, "--", *argv
        )
        return subprocess.run(command, capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class Buildah:
    binary: str
    name: str = "buildah"

    def _cmd(self, *args: str) -> list[str]:
        return [self.binary, "--storage-driver", BUILDAH_STORAGE, *args]

    def image_config(self, image: str) -> dict[str, Any]:
        data = json.loads(_check(self._cmd("inspect", "--type", "image", image)))
        config: dict[str, Any] = data["Docker"]["config"]
        return config

    def user_id(self, image: str, user: str) -> int:
        name = _fresh_name()
        _check(self._cmd("from", "--quiet", "--name", name, image))
        try:
            argv = self._cmd("run", "--isolation", "chroot", name, "--", "id", "-u", user)
            return int(_check(argv))
        finally:
            subprocess.run(self._cmd("rm", name), capture_output=True, timeout=120)

    @contextmanager
    def run(
        self,
        image: str,
        *,
        port: int,
        mounts: Sequence[Mount],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> Iterator[BuildahContainer]:
        name = _fresh_name()
        config = self.image_config(image)
        _check(self._cmd("from", "--quiet", "--name", name, image))
        try:
            settings = ["--env", f"VRAMD_PORT={port}"]
            for key, value in (env or {}).items():
                settings += ["--env", f"{key}={value}"]
            # buildah run mounts the image's anonymous volumes over a bind on the same
            # path; drop them, so the binds given here are the container's volumes.
            for volume in config.get("Volumes") or {}:
                settings += ["--volume", f"{volume}-"]
            _check(self._cmd("config", *settings, name))
            argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
            flags = [f"--volume={mount.flag()}" for mount in mounts]
            log = workdir / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    self._cmd("run", "--isolation", "chroot", *flags, name, "--", *argv),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            box = BuildahContainer(name, process, log, self, flags)
            try:
                box.main_process()
                yield box
            finally:
                leftover = box.processes()
                _kill_tree(process)
                for stray in leftover:
                    with suppress(psutil.Error):
                        stray.kill()
        finally:
            subprocess.run(self._cmd("rm", name), capture_output=True, timeout=120)


# --- docker --------------------------------------------------------------------------------


@dataclass
class DockerContainer:
    name: str
    binary: str

    def exec(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = [self.binary, "exec", self.name, *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    def main_process(self) -> psutil.Process:
        pid = int(_check([self.binary, "inspect", "-f", "{{.State.Pid}}", self.name]))
        return psutil.Process(pid)

    def logs(self) -> str:
        done = subprocess.run([self.binary, "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def wait(self, timeout: float) -> int | None:
        try:
            done = subprocess.run(
                [self.binary, "wait", self.name], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return None
        return int(done.stdout.strip() or -1)


@dataclass(frozen=True)
class Docker:
    binary: str
    name: str = "docker"

    def image_config(self, image: str) -> dict[str, Any]:
        (data,) = json.loads(_check([self.binary, "image", "inspect", image]))
        config: dict[str, Any] = data["Config"]
        return config

    def user_id(self, image: str, user: str) -> int:
        argv = [self.binary, "run", "--rm", "--entrypoint", "id", image, "-u", user]
        return int(_check(argv))

    @contextmanager
    def run(
        self,
        image: str,
        *,
        port: int,
        mounts: Sequence[Mount],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> Iterator[DockerContainer]:
        name = _fresh_name()
        flags = [f"--volume={mount.flag()}" for mount in mounts]
        for key, value in (env or {}).items():
            flags += ["--env", f"{key}={value}"]
        _check([self.binary, "run", "--detach", "--name", name,
                "--publish", f"127.0.0.1:{port}:8400", *flags, image])  # fmt: skip
        try:
            yield DockerContainer(name, self.binary)
        finally:
            subprocess.run([self.binary, "rm", "--force", name], capture_output=True, timeout=120)


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Whatever of the container is left: the test failed before stopping it."""
    with suppress(psutil.Error):
        for child in psutil.Process(process.pid).children(recursive=True):
            with suppress(psutil.Error):
                child.kill()
    with suppress(ProcessLookupError):
        os.killpg(process.pid, 9)
    with suppress(subprocess.TimeoutExpired):
        process.wait(30)
