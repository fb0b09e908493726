"""whisper.cpp's ``whisper-server``.

Readiness: the server loads its model before it binds its port, so at start the port is
refused, then ``GET /health`` answers 200 ``{"status":"ok"}``. It answers 503
``{"status":"loading model"}`` only while ``POST /load`` swaps the model: the same shape as
llama-server's older builds, so it shares llama.cpp's judgement. The "listening" line goes
to block-buffered stdout and is no use as a ready line.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.adapters.base import GGML_OOM_PATTERNS, BaseAdapter
from service.adapters.llamacpp import ggml_health_ok


@dataclass(frozen=True)
class WhisperCppAdapter(BaseAdapter):
    """Metrics: none (``/metrics`` is 404).

    Out of memory: the ggml backend lines; on the CPU backend ``ggml_aligned_malloc:
    insufficient memory`` then a GGML_ASSERT abort (-6), or ``std::bad_alloc`` when the model
    itself does not fit. GPU builds print whisper's own ``whisper_kv_cache_init: failed to
    allocate memory for the kv cache`` and ``whisper_sched_graph_init: failed to allocate the
    compute buffer`` (all in the shared ggml set).

    Shutdown: 1.8 builds catch SIGTERM, finish the request in flight and exit 0; a second
    signal exits 1 at once. Older builds without the handler die of the signal (-15). Both
    are clean.
    """

    def health_ok(self, status_code: int, body: bytes) -> bool:
        return ggml_health_ok(status_code, body)


WHISPER_CPP = WhisperCppAdapter(
    name="whisper.cpp",
    health_path="/health",
    oom_patterns=GGML_OOM_PATTERNS,
)
