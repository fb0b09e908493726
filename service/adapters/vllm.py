"""vLLM's OpenAI-compatible server (``vllm serve``), and its sleep mode.

Readiness: the API server binds its port only after the engine has loaded the model,
profiled memory and allocated the KV cache; ``GET /health`` then answers 200 (503 once the
engine has died).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from service.adapters.base import (
    TORCH_OOM_PATTERNS,
    BaseAdapter,
    RuntimeMetrics,
    as_count,
    as_ratio,
)
from service.adapters.prometheus import MetricSamples

log = logging.getLogger("vramd.adapters.vllm")

VLLM_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    *TORCH_OOM_PATTERNS,
    re.compile(r"No available memory for the cache blocks"),
    re.compile(r"Free memory on device .*less than desired GPU memory utilization"),
    re.compile(r"KV cache is needed, which is larger than the available KV cache memory"),
    # V0 wording of the same refusal
    re.compile(r"larger than the maximum number of tokens that can be stored in KV cache"),
    # the CPU build: VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes) beyond the node
    re.compile(r"on kv cache allocation is less than requested memory for kv\b"),
)

# Newest name first: the first one a scrape contains is used.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def _kv_cache_tokens(samples: MetricSamples, usage: float | None) -> int | None:
    """usage * num_gpu_blocks * block_size, from ``vllm:cache_config_info``'s labels."""
    if usage is None:
        return None
    capacity = 0
    for sample in samples.series("vllm:cache_config_info"):
        labels = dict(sample.labels)
        try:
            capacity += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            return None
    return math.ceil(usage * capacity) if capacity else None


@dataclass(frozen=True)
class VllmAdapter(BaseAdapter):
    """Metrics: Prometheus text at ``/metrics``, labelled by ``model_name`` (and ``engine`` with
    data parallelism). KV-cache use was ``vllm:gpu_cache_usage_perc`` and is
    ``vllm:kv_cache_usage_perc`` since the V1 engine's metrics rework (the old name is hidden
    from 0.11 on); both are 0..1 despite the "perc". Several engines each report their own
    cache, so usage is their mean; requests are summed. There is no token gauge, but
    ``vllm:cache_config_info`` carries ``block_size`` and ``num_gpu_blocks`` as labels, and
    usage * blocks * block size approximates the tokens held (rounded up to whole blocks).

    Out of memory: the PyTorch errors at request time (torch's host allocator on the CPU
    build), and the refusals at start that all mean "the memory this configuration needs is
    not there": "No available memory for the cache blocks", "Free memory on device (…) on
    startup is less than desired GPU memory utilization", the KV cache being too small for
    ``max_model_len``, and the CPU build's KV space beyond its NUMA node.

    Sleep mode: with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` the server can
    offload its weights to host memory and drop its KV cache (level 1) or drop both (level 2)
    without exiting, then wake in a fraction of a load's time. Without dev mode the routes
    do not exist (404); the helpers below then return ``False`` and the caller stops the
    instance instead. The CPU build refuses ``--enable-sleep-mode`` at start, and with dev mode
    alone answers ``/sleep`` with success while freeing nothing; the caller checks the
    footprint and stops such a runtime rather than trust the answer.

    Shutdown: once serving, SIGTERM makes uvicorn exit 0 within a second and the engine
    process is killed after it. During start-up the signal can be lost: 0.32's CPU build
    went on loading and served, never exiting, so a stop while loading ends in the process
    group's SIGKILL after ``stop_timeout``.
    """

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        samples = MetricSamples.parse(text)
        usage = as_ratio(samples.mean(*KV_USAGE_NAMES))
        return RuntimeMetrics(
            kv_cache_usage_ratio=usage,
            kv_cache_tokens=_kv_cache_tokens(samples, usage),
            requests_running=as_count(samples.total("vllm:num_requests_running")),
            requests_waiting=as_count(samples.total("vllm:num_requests_waiting")),
            raw=samples.raw(),
        )


VLLM = VllmAdapter(
    name="vllm",
    health_path="/health",
    oom_patterns=VLLM_OOM_PATTERNS,
)


# --- sleep mode ------------------------------------------------------------------------
# ``client`` is the instance's own client, its base_url the runtime's root
# (http://127.0.0.1:PORT). Errors are logged and answered False/None, never raised: every
# caller has a fallback (stop the instance), and a failed sleep must not fail an eviction.


async def _post(client: httpx.AsyncClient, path: str, params: httpx.QueryParams) -> bool:
    try:
        response = await client.post(path, params=params)
    except httpx.HTTPError as exc:
        log.warning("vLLM %s failed: %s", path, exc)
        return False
    if not response.is_success:
        log.warning("vLLM %s answered %d", path, response.status_code)
        return False
    return True


async def sleep(client: httpx.AsyncClient, *, level: int = 1) -> bool:
    """``POST /sleep?level=N``: level 1 offloads weights to host memory, 2 discards them.

    True once the server says it is asleep. Sleeping takes seconds (weights are copied out),
    so the client's timeout must allow for that.
    """
    if level not in (1, 2):
        raise ValueError(f"vLLM sleep level must be 1 or 2, not {level}")
    return await _post(client, "/sleep", httpx.QueryParams({"level": str(level)}))


async def wake_up(client: httpx.AsyncClient, *, tags: Sequence[str] = ()) -> bool:
    """``POST /wake_up``; ``tags`` (``weights``, ``kv_cache``) wakes only those parts."""
    params = httpx.QueryParams([("tags", tag) for tag in tags])
    return await _post(client, "/wake_up", params)
