"""whisper.cpp's ``whisper-server``, built from the sources the pywhispercpp sdist vendors,
serving a generated model (``whisper_model``) for speech to text."""

from __future__ import annotations

import re
from pathlib import Path

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import LOCAL, PYWHISPERCPP, Installer, Layout, Recipe
from service.real_runtimes.steps import Step

MODEL = "whisper-tiny-random.bin"


def _steps(installer: Installer) -> list[Step]:
    src = installer.layout.src("pywhispercpp", PYWHISPERCPP)
    return [
        installer.sdist("pywhispercpp", PYWHISPERCPP),
        installer.cmake(
            "whisper-server",
            lambda: src / "whisper.cpp",
            "-DWHISPER_BUILD_TESTS=OFF",
            "-DWHISPER_BUILD_EXAMPLES=ON",
            "-DWHISPER_SDL2=OFF",
            "-DWHISPER_CURL=OFF",
        ),
        installer.model("speech-to-text", "whisper_model", installer.layout.models / MODEL),
    ]


def _entries(layout: Layout) -> dict[str, RuntimeEntry]:
    model = str(layout.models / MODEL)
    command = (
        str(layout.binary("whisper-server")),
        *("--model", model, "--host", LOCAL, "--port", "${PORT}", "--threads", "2"),
        # Random weights never reach the confidence thresholds, so the temperature fallback
        # decodes each segment up to six times: the first request took 5-20 s without this.
        "--no-fallback",
    )
    vendored = whisper_version(layout.src("pywhispercpp", PYWHISPERCPP) / "whisper.cpp")
    return {
        "speech-to-text": RuntimeEntry(
            adapter="whisper.cpp",
            command=command,
            model=model,
            version=f"whisper.cpp {vendored} (pywhispercpp {PYWHISPERCPP})",
            routes=("/v1/audio/transcriptions",),
        )
    }


def whisper_version(sources: Path) -> str:
    """The version the vendored CMakeLists.txt declares (whisper-server has no --version)."""
    try:
        text = (sources / "CMakeLists.txt").read_text()
    except OSError:
        return "unknown"
    found = re.search(r'project\(\s*"?whisper\.cpp"?\s+VERSION\s+([\w.]+)', text)
    return found.group(1) if found else "unknown"


RECIPE = Recipe("whisper.cpp", _steps, _entries)
