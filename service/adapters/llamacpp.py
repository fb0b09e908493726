"""llama.cpp's ``llama-server``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from service.adapters.base import (
    GGML_OOM_PATTERNS,
    BaseAdapter,
    RuntimeMetrics,
    as_count,
    as_ratio,
)
from service.adapters.prometheus import MetricSamples

# server.cpp: SRV_INF("%s", "model loaded\n") right after ctx_http.is_ready.store(true),
# in llama_server() (main() before the server became a library function).
LLAMA_READY_LINE = re.compile(r"\bsrv\s+(?:llama_server|main): model loaded\b")

# JSON "status" values older builds sent with a 2xx or 5xx that do not mean ready.
_NOT_READY_STATUS = frozenset({"loading model", "loading", "error", "unavailable"})


def ggml_health_ok(status_code: int, body: bytes) -> bool:
    """2xx, unless the body says the model is still loading (or failed to).

    Shared by the ggml servers (llama-server, whisper-server) that answer ``/health``
    while loading.
    """
    if not 200 <= status_code < 300:
        return False
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return True  # a 2xx without JSON: nothing says it is not ready
    if isinstance(payload, dict):
        if "error" in payload:
            return False
        status = payload.get("status")
        if isinstance(status, str) and status.strip().lower() in _NOT_READY_STATUS:
            return False
    return True


@dataclass(frozen=True)
class LlamaCppAdapter(BaseAdapter):
    """Readiness: the HTTP server starts before the model is loaded, so the port answers long
    before the runtime can serve. ``GET /health`` says 503
    ``{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`` while
    loading and 200 ``{"status":"ok"}`` once ready. Builds from early 2024 answered
    ``{"status":"loading model"}`` / ``{"status":"error"}`` instead. The status code is what
    decides, but as a guard against builds and proxies that get it wrong, a 2xx whose JSON
    carries an ``error`` object or a loading/error ``status`` is not taken as ready either.
    Right after it flips to ready, the server's main function logs ``model loaded`` through
    ``SRV_INF``: ``srv  llama_server: model loaded`` in current builds, ``srv          main:
    model loaded`` in older ones (the function's name padded to 12), with a timestamp and
    level before it when the log prefix is on (``0.00.099.290 I srv  llama_server: ...``,
    the default now) and colour codes around it with ``--log-colors``. That is the
    ``ready_line``, so a load is seen the moment it ends, not at the next poll. Only that
    line says "model loaded", and a router (``--models-dir``) prints it only from children.
    Every build sets its ready flag before it prints the line, so the line is final: no
    health request needs to confirm it (``ready_line_final``; the poll stays the fallback).

    Metrics: served at ``/metrics`` only when started with ``--metrics``. The request gauges
    (``llamacpp:requests_processing``, ``llamacpp:requests_deferred``) are in every build.
    ``llamacpp:kv_cache_usage_ratio`` and ``llamacpp:kv_cache_tokens`` were removed in
    May 2025 (ggml-org/llama.cpp#13660) as too implementation-specific, so on current builds
    the KV-cache fields are ``None`` and vramd splits the footprint without them.

    KV use from ``GET /slots`` instead (on by default; ``--no-slots`` turns it off): each
    slot reports its context (``n_ctx``) and, while it works, the tokens it holds
    (``n_prompt_tokens``: prompt and generated so far; ``n_past`` in some builds). The share
    held by busy slots is the runtime's KV use as vLLM counts it: an idle slot's cached
    prompt can be dropped at once, so it is not load.

    Shutdown: SIGTERM runs the server's handler, which finishes and returns 0 within
    milliseconds; a second signal makes it exit(1) at once, which we only send as SIGKILL
    anyway. A SIGTERM that lands while it decodes can deadlock the handler on the queue's
    lock, so a stop waits 3 s at most (``exit_grace_s``) before the SIGKILL.
    """

    def health_ok(self, status_code: int, body: bytes) -> bool:
        return ggml_health_ok(status_code, body)

    def kv_from_slots(self, payload: object) -> float | None:
        return slots_kv_usage(payload)

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        samples = MetricSamples.parse(text)
        return RuntimeMetrics(
            kv_cache_usage_ratio=as_ratio(samples.mean("llamacpp:kv_cache_usage_ratio")),
            kv_cache_tokens=as_count(samples.total("llamacpp:kv_cache_tokens")),
            requests_running=as_count(samples.total("llamacpp:requests_processing")),
            requests_waiting=as_count(samples.total("llamacpp:requests_deferred")),
            raw=samples.raw(),
        )


def slots_kv_usage(payload: object) -> float | None:
    """Tokens held by busy slots over the context of every slot, from ``GET /slots``;
    ``None`` when the answer is not a slot list with contexts."""
    if not isinstance(payload, list) or not payload:
        return None
    context = held = 0
    for slot in payload:
        n_ctx = slot.get("n_ctx") if isinstance(slot, dict) else None
        if not isinstance(n_ctx, int) or n_ctx <= 0:
            return None
        context += n_ctx
        if slot.get("is_processing"):
            held += min(n_ctx, _slot_tokens(slot))
    return as_ratio(held / context)


def _slot_tokens(slot: dict[str, object]) -> int:
    for key in ("n_prompt_tokens", "n_past"):
        value = slot.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return 0


LLAMA_CPP = LlamaCppAdapter(
    name="llama.cpp",
    health_path="/health",
    oom_patterns=GGML_OOM_PATTERNS,
    slots_path="/slots",
    ready_line=LLAMA_READY_LINE,
    ready_line_final=True,
    # It exits within milliseconds of SIGTERM, or never: a SIGTERM that lands while it
    # decodes can deadlock its signal handler on the queue's lock (docs/runtimes.md).
    exit_grace_s=3.0,
)
