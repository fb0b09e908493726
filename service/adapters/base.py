"""What every runtime adapter provides, and the out-of-memory patterns they share.

An adapter is vramd's knowledge of one runtime, kept as data: where to ask whether it is
ready, where it publishes metrics and what they are called, which log lines mean it ran
out of memory, and which exit codes after SIGTERM mean it shut down cleanly. Nothing here
does I/O: the supervisor and the orchestrator fetch health, metrics and logs, and ask the
adapter what they mean. (The one exception, vLLM's sleep endpoints, lives in ``vllm.py``.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from service.adapters.prometheus import parse_prometheus


@dataclass(frozen=True)
class RuntimeMetrics:
    """What vramd reads from a runtime's metrics page; ``None`` where it does not say.

    ``kv_cache_usage_ratio`` is always 0..1 whatever the runtime's own scale, and the counts
    are whole requests or tokens. ``raw`` keeps every sample (see ``parse_prometheus``) so
    an operator can see what the runtime did say when a field is ``None``.
    """

    kv_cache_usage_ratio: float | None = None
    kv_cache_tokens: int | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None
    raw: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}), hash=False)


@dataclass(frozen=True)
class NativeRoute:
    """A client route that a runtime serves through an API of its own (piper's
    ``/synthesize`` for OpenAI's ``/v1/audio/speech``)."""

    # The client's JSON body in the runtime's shape; ValueError names what it cannot do.
    request: Callable[[Mapping[str, Any]], dict[str, Any]]
    # The content type of its successful answers, where it labels them wrongly.
    answer_type: str | None = None


class Adapter(Protocol):
    """One runtime's behaviour, as the supervisor and the orchestrator need it.

    Runtimes disagree on all four points, which is why they are per-runtime at all:

    - readiness: llama-server answers ``/health`` with 503 while it loads the model,
      llama-cpp-python has no health route (it listens only once the model is loaded, so any
      answer from ``/v1/models`` means ready), vLLM and TEI bind their port only when ready.
      A runtime that prints a line once it can serve (llama-server's "model loaded") names
      it as ``ready_line``: the supervisor polls health the moment it sees that line, rather
      than at its next poll, and still lets the health answer decide;
    - metrics: llama.cpp says ``llamacpp:requests_processing``, vLLM says
      ``vllm:num_requests_running``, and each renamed its KV-cache gauge across releases;
    - out of memory: ggml prints ``cudaMalloc failed: out of memory`` and carries on to a
      generic "failed to load model", PyTorch raises ``torch.OutOfMemoryError``, vLLM refuses
      to start with "No available memory for the cache blocks";
    - shutdown: C++ servers exit 0 from their signal handler or die of the signal itself
      (-15 as Python reports it, 143 through a shell), Python servers may re-raise.

    Metrics pages are read with the parser in ``prometheus.py``.
    """

    @property
    def name(self) -> str:
        """The name policies use (``runtime: vllm``) and ``vramd ps`` shows."""
        ...

    @property
    def health_path(self) -> str:
        """The readiness path to poll when the policy does not name one."""
        ...

    @property
    def oom_patterns(self) -> tuple[re.Pattern[str], ...]:
        """Regexes for its out-of-memory lines, in logs and in 5xx bodies alike."""
        ...

    def health_ok(self, status_code: int, body: bytes) -> bool:
        """Whether one answer from ``health_path`` means ready to serve."""
        ...

    @property
    def ready_line(self) -> re.Pattern[str] | None:
        """A log line (stdout or stderr) the runtime prints once it can serve; ``None``
        when it prints none worth waiting for. Seeing it makes the supervisor poll health
        at once: it hastens the check, and replaces it only where ``ready_line_final``."""
        ...

    @property
    def ready_line_final(self) -> bool:
        """Whether the runtime prints ``ready_line`` only after its health says ready, so
        the line alone means ready (no health request to confirm it)."""
        ...

    @property
    def native_routes(self) -> Mapping[str, NativeRoute]:
        """Client routes the runtime serves through an API of its own, by route (applied
        where the route goes to the runtime's default path for it; empty for runtimes
        that speak the routes' APIs)."""
        ...

    @property
    def exit_grace_s(self) -> float | None:
        """The longest a clean exit after SIGTERM takes it, where that is known and
        short: a stop kills the runtime after this (or after ``stop_timeout``, if
        shorter), for it is hung. ``None``: ``stop_timeout`` alone."""
        ...

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        """Prometheus text from the service's ``metrics:`` path → the figures vramd records."""
        ...

    @property
    def slots_path(self) -> str | None:
        """Where the runtime lists its request slots (llama.cpp: ``/slots``), if it does."""
        ...

    def kv_from_slots(self, payload: object) -> float | None:
        """KV-cache use (0..1) from the JSON at ``slots_path``; ``None`` if it does not say."""
        ...


@dataclass(frozen=True)
class BaseAdapter:
    """Defaults shared by the runtimes: ready on any 2xx, metrics read as-is.

    Each runtime module subclasses it and overrides what its runtime does differently.
    """

    name: str
    health_path: str = "/health"
    oom_patterns: tuple[re.Pattern[str], ...] = ()
    slots_path: str | None = None
    ready_line: re.Pattern[str] | None = None
    ready_line_final: bool = False
    exit_grace_s: float | None = None
    native_routes: Mapping[str, NativeRoute] = field(default_factory=lambda: MappingProxyType({}))

    def health_ok(self, status_code: int, body: bytes) -> bool:
        return 200 <= status_code < 300

    def parse_metrics(self, text: str) -> RuntimeMetrics:
        return RuntimeMetrics(raw=MappingProxyType(parse_prometheus(text)))

    def kv_from_slots(self, payload: object) -> float | None:
        return None


def find_oom(adapter: Adapter, text: str) -> str | None:
    """The first line of ``text`` that one of the adapter's OOM patterns matches.

    Returned whole (stripped) so an incident record can quote what the runtime said.
    """
    for line in text.splitlines():
        if any(pattern.search(line) for pattern in adapter.oom_patterns):
            return line.strip()
    return None


# --- out-of-memory patterns shared by runtimes built on the same libraries -------------

# ggml (llama.cpp, whisper.cpp, stable-diffusion.cpp, and llama-cpp-python through it).
# A failed allocation prints one of these before the caller's generic "failed to load".
GGML_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    # ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4480.00 MiB on device 3:
    # cudaMalloc failed: out of memory   (hipMalloc on ROCm, musaMalloc on MUSA)
    re.compile(r"\b(?:cuda|hip|musa)Malloc\w* failed: out of memory"),
    # CUDA error: out of memory  / ROCm error: ... (ggml names the backend it was built for)
    re.compile(r"\b(?:CUDA|ROCm|HIP|MUSA) error: out of memory"),
    # alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624
    # llama_model_load: error loading model: unable to allocate CUDA0 buffer
    # ggml_gallocr_reserve_n: failed to allocate CUDA_Host buffer of size ...
    re.compile(r"\b(?:failed|unable) to allocate [A-Za-z_]+\d* buffer\b"),
    # graph_reserve: failed to allocate compute buffers
    # whisper_sched_graph_init: failed to allocate the compute buffer / vae: (sd.cpp)
    re.compile(r"\bfailed to allocate (?:the )?compute buffers?\b"),
    # llama_kv_cache_init: failed to allocate buffer for kv cache
    # whisper_kv_cache_init: failed to allocate memory for the kv cache
    # whisper_model_load: failed to allocate memory for the model
    re.compile(r"\bfailed to allocate (?:memory|buffer) for (?:the )?(?:kv cache|model)\b", re.I),
    # stable-diffusion.cpp: "unet alloc runtime params backend buffer failed"
    re.compile(r"\balloc (?:\w+ )?params backend buffer failed\b"),
    # The CPU backend (host memory, which vramd also hands out): ggml_aligned_malloc:
    # insufficient memory (attempted to allocate 4096.00 MB)
    re.compile(r"\bggml_aligned_malloc: insufficient memory\b"),
    # C++'s own allocation failure, caught and printed by llama.cpp (seen on a real
    # llama-server out of host memory: "failed to initialize the context: std::bad_alloc")
    re.compile(r"\bstd::bad_alloc\b"),
    # Vulkan and Metal backends
    re.compile(r"\bErrorOutOf(?:Device|Host)Memory\b"),
    re.compile(r"\bkIOGPUCommandBufferCallbackErrorOutOfMemory\b"),
    re.compile(r"\bcudaErrorMemoryAllocation\b|\bCUBLAS_STATUS_ALLOC_FAILED\b"),
)

# PyTorch (vLLM, TEI's Python backend, most Python TTS and diffusion servers).
TORCH_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    # torch.OutOfMemoryError (2.5+), torch.cuda.OutOfMemoryError (older)
    re.compile(r"\b(?:torch\.)?(?:cuda\.)?OutOfMemoryError\b"),
    # "CUDA out of memory. Tried to allocate 2.00 GiB." / ROCm: "HIP out of memory."
    re.compile(r"\b(?:CUDA|HIP) out of memory\b"),
    re.compile(r"\b(?:CUDA|HIP) error: out of memory"),
    re.compile(r"\bCUBLAS_STATUS_ALLOC_FAILED\b"),
    # torch's host allocator: "DefaultCPUAllocator: can't allocate memory: you tried to
    # allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
    re.compile(r"\bDefaultCPUAllocator: can't allocate memory\b"),
)

# onnxruntime (piper, and ONNX servers behind the generic adapter).
ONNX_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    # its BFCArena: "Failed to allocate memory for requested buffer of size 12345"
    re.compile(r"Failed to allocate memory for requested buffer of size"),
    # a session short of memory for its thread pool (seen under a small address space):
    # "... PosixThread(...) pthread_create failed, error code: 12 error msg: Cannot
    # allocate memory"
    re.compile(r"\berror code: 12 error msg: Cannot allocate memory\b"),
)

# Python's own allocation failure: host memory, which vramd also hands out.
PYTHON_HOST_OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^\s*MemoryError\b"),
    # the same, raised where Python could no longer print a traceback (piper importing
    # under a small address space): "object type name: MemoryError"
    re.compile(r"\bobject type name: MemoryError\b"),
)


# --- what parse_metrics makes of a runtime's figures ------------------------------------


def as_ratio(value: float | None) -> float | None:
    """A 0..1 ratio, clamped; ``None`` for missing or non-finite values."""
    if value is None or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, value))


def as_count(value: float | None) -> int | None:
    """A whole, non-negative count; ``None`` for missing or non-finite values."""
    if value is None or not math.isfinite(value):
        return None
    return max(0, round(value))
