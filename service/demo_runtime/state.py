"""What the handler threads share: readiness, request counters, leaked memory, sleep.

llama.cpp's slots and the prompt each one caches are ``slots`` (a ``SlotCache``).

Device memory on simulated GPUs (``--gpu-memory``) is ``gpu``, set once loading has
allocated it; sleep gives its weights back and waking takes them again.
"""

from __future__ import annotations

import mmap
import threading
import time
from typing import TYPE_CHECKING

from service.demo_runtime.memory import touch_memory
from service.demo_runtime.options import Options
from service.demo_runtime.slots import SlotCache

if TYPE_CHECKING:
    from service.demo_runtime.gpu import GpuMemory

CONTEXT_TOKENS = 4096  # the pretend KV cache size behind the llamacpp:kv_cache_* metrics


class Runtime:
    """State shared by the handler threads; counters change under one lock.

    One ``Runtime`` per process. Its counters feed the ``/metrics`` page, under the names
    llama.cpp's server publishes (``llamacpp:kv_cache_usage_ratio`` and the rest).
    """

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.ready = threading.Event()
        self.memory: mmap.mmap | None = None
        self.gpu: GpuMemory | None = None
        # llama.cpp splits its context across the slots
        self.slots = SlotCache(opts.parallel, CONTEXT_TOKENS // opts.parallel)
        self._lock = threading.Lock()
        self._requests = 0
        self._in_flight = 0
        self._kv_tokens = 0  # held by requests in flight
        self._kv_cached = 0  # kept after a request ends, as llama.cpp keeps a slot's prompt
        self._prompt_tokens = 0
        self._predicted_tokens = 0
        self._leaked: list[mmap.mmap] = []
        self._leaked_bytes = 0
        self.sleeping = False

    def sleep(self) -> None:
        """vLLM level-1 sleep, as far as memory goes: the --memory block is given back."""
        if self.opts.sleep_keeps_memory:
            self.sleeping = True
            return
        with self._lock:
            block, self.memory = self.memory, None
            self.sleeping = True
        if block is not None:
            block.close()
        if self.gpu is not None:
            self.gpu.release()

    def wake(self) -> str | None:
        """Memory back; CUDA's out-of-memory message when the device has no room now."""
        if self.opts.sleep_keeps_memory:
            self.sleeping = False
            return None
        if self.gpu is not None and (error := self.gpu.reload()) is not None:
            return error
        block = touch_memory(self.opts.memory)
        with self._lock:
            self.memory = block
            self.sleeping = False
        return None

    @property
    def in_flight(self) -> int:
        """Inference requests being answered now (llama.cpp's busy slots)."""
        with self._lock:
            return self._in_flight

    def busy_tokens(self) -> tuple[int, int]:
        """Requests in flight and the KV tokens they hold (prompt and reply)."""
        with self._lock:
            return self._in_flight, self._kv_tokens

    def prefill(self, tokens: int) -> float:
        """Process ``tokens`` prompt tokens (--prompt-ms-per-token each); the ms it took."""
        started = time.perf_counter()
        if tokens > 0 and self.opts.prompt_ms_per_token > 0:
            time.sleep(tokens * self.opts.prompt_ms_per_token / 1000)
        return (time.perf_counter() - started) * 1000

    def begin(self, tokens: int) -> int:
        """Account for an inference request; returns its 1-based number."""
        with self._lock:
            self._requests += 1
            self._in_flight += 1
            self._kv_tokens += tokens + self.opts.chunks
            self._prompt_tokens += tokens
            self._predicted_tokens += self.opts.chunks
            return self._requests

    def end(self, tokens: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self._kv_tokens -= tokens + self.opts.chunks
            self._kv_cached = tokens + self.opts.chunks

    def leak(self) -> None:
        """Allocate --leak-per-request bytes for good, up to --leak-limit."""
        with self._lock:
            size = self.opts.leak_per_request
            if self.opts.leak_limit is not None:
                size = min(size, self.opts.leak_limit - self._leaked_bytes)
            if size <= 0:
                return
            self._leaked_bytes += size  # reserve now; touch outside the lock
        block = touch_memory(size)
        with self._lock:
            if block is not None:
                self._leaked.append(block)

    def gpu_leak(self) -> str | None:
        """--gpu-leak-per-request on the device; CUDA's message once it does not fit."""
        return self.gpu.leak() if self.gpu is not None else None

    def metrics(self) -> str:
        """Prometheus text with the names llama.cpp's server uses."""
        with self._lock:
            kv_tokens = min(self._kv_tokens + self._kv_cached, CONTEXT_TOKENS)
            rows = [
                ("prompt_tokens_total", "counter", "prompt tokens processed", self._prompt_tokens),
                ("tokens_predicted_total", "counter", "tokens generated", self._predicted_tokens),
                (
                    "kv_cache_usage_ratio",
                    "gauge",
                    "KV-cache usage, 1 = full",
                    kv_tokens / CONTEXT_TOKENS,
                ),
                ("kv_cache_tokens", "gauge", "KV-cache tokens", kv_tokens),
                ("requests_processing", "gauge", "requests processing", self._in_flight),
                ("requests_deferred", "gauge", "requests deferred", 0),
            ]
        lines = []
        for name, kind, description, value in rows:
            metric = f"llamacpp:{name}"
            lines += [f"# HELP {metric} {description}", f"# TYPE {metric} {kind}"]
            lines.append(f"{metric} {value}")
        return "\n".join(lines) + "\n"
