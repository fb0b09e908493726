"""Piper's HTTP server (piper-tts from PyPI, in a virtual environment of its own),
speaking a generated voice (``piper_model``) for text to speech."""

from __future__ import annotations

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import CPU_TORCH, LOCAL, PIPER_TTS, Installer, Layout, Recipe
from service.real_runtimes.piper_model import VOICE_FILE
from service.real_runtimes.steps import Step

MODEL = "piper-voice"
# The server, its Flask, and what the model writer needs: piper's VITS code ships in the
# wheel; torch and onnx export it.
PACKAGES = (f"piper-tts[http]=={PIPER_TTS}", CPU_TORCH, "onnx==1.23.2")


def _steps(installer: Installer) -> list[Step]:
    layout = installer.layout
    python = layout.piper_venv / "bin" / "python"
    return [
        installer.venv(f"piper-tts {PIPER_TTS} (with CPU torch)", layout.piper_venv, PACKAGES),
        installer.model("text-to-speech", "piper_model", layout.models / MODEL, python=python),
    ]


def _entries(layout: Layout) -> dict[str, RuntimeEntry]:
    voice = str(layout.models / MODEL / VOICE_FILE)
    command = (
        str(layout.piper_venv / "bin" / "python"),
        *("-m", "piper.http_server", "--model", voice, "--host", LOCAL, "--port", "${PORT}"),
    )
    return {
        "text-to-speech": RuntimeEntry(
            adapter="piper",
            command=command,
            model=voice,
            version=f"piper-tts {PIPER_TTS}",
            routes=("/v1/audio/speech",),
        )
    }


RECIPE = Recipe("piper", _steps, _entries)
