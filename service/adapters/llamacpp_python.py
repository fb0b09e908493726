"""llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``).

Readiness: it has no health route (``/health`` is a 404), but it loads the model before
uvicorn binds the port, so the first answer from ``GET /v1/models`` means ready.

Metrics: none in Prometheus form.

Out of memory: the model is loaded by the bundled llama.cpp, whose ggml lines reach the
same stderr before Python's own "Failed to load model from file" / "Failed to create
llama_context"; those generic errors are not matched on their own, because a bad path or
a corrupt file ends the same way. A host-side ``MemoryError`` counts too.

Shutdown: uvicorn handles SIGTERM and exits 0.
"""

from __future__ import annotations

from service.adapters.base import GGML_OOM_PATTERNS, PYTHON_HOST_OOM_PATTERNS, BaseAdapter

LLAMA_CPP_PYTHON = BaseAdapter(
    name="llama-cpp-python",
    health_path="/v1/models",
    oom_patterns=GGML_OOM_PATTERNS + PYTHON_HOST_OOM_PATTERNS,
)
