"""Any other OpenAI-compatible server: TTS servers, wrappers, runtimes vramd has no
adapter for.

Readiness: ``GET /v1/models`` is the one route every OpenAI-compatible server has, and
most bind their port only when they can serve; a policy can name a better ``health``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.adapters.base import (
    GGML_OOM_PATTERNS,
    ONNX_OOM_PATTERNS,
    PYTHON_HOST_OOM_PATTERNS,
    BaseAdapter,
    RuntimeMetrics,
    as_count,
    as_ratio,
)
from service.adapters.prometheus import MetricSamples
from service.adapters.tei import CANDLE_OOM_PATTERNS
from service.adapters.vllm import KV_USAGE_NAMES, VLLM_OOM_PATTERNS


def _unique(*groups: tuple[re.Pattern[str], ...]) -> tuple[re.Pattern[str], ...]:
    seen: dict[str, re.Pattern[str]] = {}
    for group in groups:
        for pattern in group:
            seen.setdefault(pattern.pattern, pattern)
    return tuple(seen.values())


@dataclass(frozen=True)
class GenericAdapter(BaseAdapter):
    """Metrics: no default path. If a policy names one, the known metric names of the runtimes
    vramd has adapters for (and of SGLang and TGI, which often sit behind such servers) are
    tried in turn, so a runtime started through a wrapper still reports what it can.

    Out of memory: the union of the ggml, PyTorch and ONNX Runtime messages; the bare phrase
    "out of memory" is not matched, because servers print it in hints and help text too.
    """

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        samples = MetricSamples.parse(text)
        usage = samples.mean(*KV_USAGE_NAMES, "llamacpp:kv_cache_usage_ratio", "sglang:token_usage")
        return RuntimeMetrics(
            kv_cache_usage_ratio=as_ratio(usage),
            kv_cache_tokens=as_count(samples.total("llamacpp:kv_cache_tokens")),
            requests_running=as_count(
                samples.total(
                    "vllm:num_requests_running",
                    "llamacpp:requests_processing",
                    "sglang:num_running_reqs",
                    "tgi_batch_current_size",
                )
            ),
            requests_waiting=as_count(
                samples.total(
                    "vllm:num_requests_waiting",
                    "llamacpp:requests_deferred",
                    "sglang:num_queue_reqs",
                    "tgi_queue_size",
                    "te_queue_size",
                )
            ),
            raw=samples.raw(),
        )


OPENAI = GenericAdapter(
    name="openai",
    health_path="/v1/models",
    oom_patterns=_unique(
        GGML_OOM_PATTERNS,
        VLLM_OOM_PATTERNS,
        CANDLE_OOM_PATTERNS,
        ONNX_OOM_PATTERNS,
        PYTHON_HOST_OOM_PATTERNS,
    ),
)
