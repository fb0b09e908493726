"""whisper.cpp's ``whisper-server``.

Readiness: ``GET /health`` answers 200 ``{"status":"ok"}`` when a model is loaded and 503
``{"status":"loading model"}`` while one is (at start, or after ``POST /load``), the same
shape as llama-server's older builds, so it shares llama.cpp's judgement.

Metrics: none.

Out of memory: the ggml backend lines, plus whisper's own
``whisper_kv_cache_init: failed to allocate memory for the kv cache`` and
``whisper_sched_graph_init: failed to allocate the compute buffer`` (both in the shared
ggml set).

Shutdown: builds without a SIGTERM handler die of the signal (-15), which is clean here.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.adapters.base import GGML_OOM_PATTERNS, BaseAdapter
from service.adapters.llamacpp import ggml_health_ok


@dataclass(frozen=True)
class WhisperCppAdapter(BaseAdapter):
    def health_ok(self, status_code: int, body: bytes) -> bool:
        return ggml_health_ok(status_code, body)


WHISPER_CPP = WhisperCppAdapter(
    name="whisper.cpp",
    health_path="/health",
    oom_patterns=GGML_OOM_PATTERNS,
)
