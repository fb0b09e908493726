"""Hugging Face text-embeddings-inference (``text-embeddings-router``).

Readiness: it downloads, loads and warms the model up before it binds its port, then
``GET /health`` answers 200, or 503 once the backend has become unhealthy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.adapters.base import (
    TORCH_OOM_PATTERNS,
    BaseAdapter,
    RuntimeMetrics,
    as_count,
)
from service.adapters.prometheus import MetricSamples

CANDLE_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (re.compile(r"\bCUDA_ERROR_OUT_OF_MEMORY\b"),)


@dataclass(frozen=True)
class TeiAdapter(BaseAdapter):
    """Metrics: Prometheus text at ``/metrics`` on the main port (newer releases also serve it on
    a separate ``--prometheus-port``, 9000 by default; vramd scrapes the
    instance's own port). TEI keeps no KV cache and has no running-requests gauge: only the
    queue (``te_queue_size``) is read.

    Out of memory: the Candle backend reports ``DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of
    memory")``, the Python backend the PyTorch errors.
    """

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        samples = MetricSamples.parse(text)
        return RuntimeMetrics(
            requests_waiting=as_count(samples.total("te_queue_size")),
            raw=samples.raw(),
        )


TEI = TeiAdapter(
    name="tei",
    health_path="/health",
    oom_patterns=CANDLE_OOM_PATTERNS + TORCH_OOM_PATTERNS,
)
