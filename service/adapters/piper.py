"""Piper's HTTP server (``python -m piper.http_server``, piper-tts), for text to speech.

Readiness: it loads its voice before it binds its port, then ``GET /voices`` answers 200
with the voices it has (it has no ``/health``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from service.adapters.base import (
    ONNX_OOM_PATTERNS,
    PYTHON_HOST_OOM_PATTERNS,
    BaseAdapter,
    NativeRoute,
)

PIPER_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    *ONNX_OOM_PATTERNS,
    re.compile(r"\bstd::bad_alloc\b"),
    *PYTHON_HOST_OOM_PATTERNS,
)

# OpenAI's speech formats; piper writes WAV only ("pcm" would need the header cut off).
WAV_FORMATS = frozenset({"wav"})


def speech_request(payload: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's ``/v1/audio/speech`` body as piper's ``/synthesize`` one.

    ``input`` becomes ``text``; ``speed`` (0.25-4, faster above 1) becomes piper's
    ``length_scale`` (longer above 1); ``voice`` names a speaker of a multi-speaker voice
    (piper falls back to its default speaker for a name it does not know). ``model`` and
    ``instructions`` mean nothing to piper. ``ValueError`` names what piper cannot do.
    """
    text = payload.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("'input' must be the text to speak")
    response_format = payload.get("response_format", "wav")
    if response_format not in WAV_FORMATS:
        raise ValueError(
            f"response_format {response_format!r} is not one piper writes; ask for 'wav'"
        )
    request: dict[str, Any] = {"text": text}
    speed = payload.get("speed")
    if speed is not None:
        if isinstance(speed, bool) or not isinstance(speed, int | float) or speed <= 0:
            raise ValueError(f"'speed' must be a positive number, not {speed!r}")
        request["length_scale"] = 1.0 / speed
    voice = payload.get("voice")
    if isinstance(voice, str) and voice:
        request["speaker"] = voice
    return request


@dataclass(frozen=True)
class PiperAdapter(BaseAdapter):
    """Routes: it speaks its own API, not OpenAI's: ``POST /synthesize`` with ``{"text": ...}``
    answers a WAV labelled ``text/html`` (as Flask labels bytes). vramd's route map sends
    ``/v1/audio/speech`` there, ``speech_request`` reshapes OpenAI's body into piper's and the
    answer goes out as ``audio/wav``, so the openai client's ``audio.speech.create`` works
    unchanged. Piper writes WAV only.

    Metrics: none.

    Out of memory: onnxruntime's session failing for want of memory (``pthread_create
    failed, error code: 12 error msg: Cannot allocate memory`` under a small address space,
    ``Failed to allocate memory for requested buffer`` from its arena, ``std::bad_alloc``),
    and Python's ``MemoryError`` (under a smaller one, while it imports).

    Shutdown: Flask's development server has no SIGTERM handler; it dies of the signal (-15)
    at once, a request in flight with it.
    """

    native_routes: Mapping[str, NativeRoute] = field(
        default_factory=lambda: MappingProxyType(
            {"/v1/audio/speech": NativeRoute(speech_request, answer_type="audio/wav")}
        )
    )


PIPER = PiperAdapter(
    name="piper",
    health_path="/voices",
    oom_patterns=PIPER_OOM_PATTERNS,
)
