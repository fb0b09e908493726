"""The installer's building blocks: timed, skippable steps and the commands they run.

Every step says what it does and how long it took, and is skipped when its output is
already there, so ``make real-runtimes`` can run again after a failure or an upgrade and
only does what is missing. A step's output is written under a temporary name and moved
into place at the end, so an interrupted step is redone, never taken as done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class StepFailed(Exception):
    """A step's command failed; the message names the step and the command."""


def say(message: str) -> None:
    print(f"[real-runtimes] {message}", flush=True)


@dataclass(frozen=True)
class Step:
    """One thing to install: ``run`` makes what ``done`` checks for."""

    name: str
    done: Callable[[], bool]
    run: Callable[[], None]

    def perform(self) -> float:
        """Run the step unless it is done; the seconds it took (0 when skipped)."""
        if self.done():
            say(f"{self.name}: already there")
            return 0.0
        say(f"{self.name}: ...")
        started = time.monotonic()
        self.run()
        took = time.monotonic() - started
        if not self.done():
            raise StepFailed(f"{self.name}: ran, but what it makes is not there")
        say(f"{self.name}: done in {took:.1f} s")
        return took


def run(argv: Sequence[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        log: Path | None = None) -> None:  # fmt: skip
    """Run ``argv``; its output goes to ``log`` when given (the tail is shown on failure)."""
    command = [str(arg) for arg in argv]
    full_env = {**os.environ, **(env or {})}
    if log is None:
        code = subprocess.run(command, cwd=cwd, env=full_env, check=False).returncode
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            code = subprocess.run(
                command, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT, check=False
            ).returncode
    if code != 0:
        tail = ""
        if log is not None:
            tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise StepFailed(f"{' '.join(command)} exited {code}{tail}")


def output_of(argv: Sequence[str | Path]) -> str:
    """What ``argv`` prints (stdout and stderr), or '' when it cannot run."""
    try:
        done = subprocess.run(
            [str(arg) for arg in argv], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def extract_within(archive: tarfile.TarFile, into: Path) -> None:
    """Extract every member under ``into``, refusing one that would land (or link)
    outside it. tarfile's own ``filter="data"`` arrived in Python 3.11.4; Debian
    bookworm's python3, the image's, is 3.11.2."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(into, filter="data")
        return
    root = into.resolve()
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        linked = (target.parent / member.linkname).resolve() if member.issym() else target
        if member.islnk():
            linked = (root / member.linkname).resolve()
        if not (target.is_relative_to(root) and linked.is_relative_to(root)):
            raise StepFailed(f"{member.name} would land outside {into}")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise StepFailed(f"{member.name} is not a file, folder or link")
    archive.extractall(into)


def fetch_sdist(python: Path, name: str, version: str, into: Path, *, log: Path) -> Path:
    """The source distribution of ``name==version`` from the package index, unpacked into
    ``into`` (the folder is replaced whole, so it never holds two versions). ``python``
    runs pip, in an environment that has the sdist's build backend."""
    downloads = into.parent / f"{into.name}.download"
    shutil.rmtree(downloads, ignore_errors=True)
    # --no-build-isolation: pip reads the sdist's metadata with the backends installed in
    # this environment instead of installing its build requirements first (minutes).
    run(
        [python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", "-d", downloads, f"{name}=={version}"],
        log=log,
    )  # fmt: skip
    archives = sorted(downloads.glob("*.tar.gz"))
    if len(archives) != 1:
        raise StepFailed(f"pip download {name}=={version} left {archives or 'nothing'}")
    partial = into.parent / f"{into.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(archives[0]) as archive:
        extract_within(archive, partial)
    (top,) = partial.iterdir()
    shutil.rmtree(into, ignore_errors=True)
    top.rename(into)
    shutil.rmtree(partial)
    shutil.rmtree(downloads)
    return into


def cmake_build(source: Path, build: Path, target: str, flags: Sequence[str], *, log: Path) -> Path:
    """Configure and build one cmake ``target``; the binary's path."""
    jobs = str(os.cpu_count() or 2)
    run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", *flags], log=log)
    run(
        ["cmake", "--build", build, "--target", target, "-j", jobs],
        log=log.with_suffix(".build.log"),
    )
    binary = build / "bin" / target
    if not binary.is_file():
        raise StepFailed(f"cmake built {target}, but {binary} is not there")
    return binary
