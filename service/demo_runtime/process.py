"""The process: fail at start on cue, or listen, "load", and serve until a signal.

``main`` forks the helpers before any thread starts, listens at once, loads (touches its
memory, waits out ``--load-seconds``, allocates ``--gpu-memory`` on simulated GPUs, and
exits 1 with CUDA's lines when that does not fit) and only then turns ``/health`` to 200. SIGTERM or
SIGINT stops it with exit code 0; with ``--ignore-sigterm`` only SIGINT or SIGKILL does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType

from service.demo_runtime.log import log
from service.demo_runtime.memory import Worker, spawn_workers, stop_workers, touch_memory
from service.demo_runtime.options import Options, parse_args
from service.demo_runtime.server import DemoServer
from service.demo_runtime.state import Runtime
from service.units import MIB


def fail_start(opts: Options) -> int:
    """Fail the way llama.cpp does when the weights do not fit on the device."""
    mib = max(opts.memory, 4096 * MIB) / MIB
    for line in (
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {mib:.2f} MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "CUDA error: out of memory",
    ):
        log(line, sys.stderr)
    return 1


def install_signals(opts: Options, stop: threading.Event) -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if opts.ignore_sigterm else on_signal)
    signal.signal(signal.SIGINT, on_signal)


def load(runtime: Runtime, workers: list[Worker], stop: threading.Event) -> bool:
    """What a real runtime does before /health turns 200: map weights, start helpers.

    False when the weights did not fit on the (simulated) GPU: the runtime exits 1.
    """
    opts = runtime.opts
    started = time.monotonic()
    deadline = started + opts.load_seconds
    runtime.memory = touch_memory(opts.memory)
    for worker in workers:
        os.read(worker.ready_fd, 1)  # b"" if the worker died; either way it is settled
        os.close(worker.ready_fd)
    if stop.wait(max(0.0, deadline - time.monotonic())):
        return True
    if opts.simulated_gpu:
        from service.demo_runtime import gpu  # imports service.simgpu: only when asked

        runtime.gpu = gpu.start(opts)
        if runtime.gpu is None:
            return False
    if opts.never_ready:
        return True
    runtime.ready.set()
    log(f"demo_runtime: ready after {time.monotonic() - started:.2f}s")
    return True


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.fail_start:
        return fail_start(opts)
    workers = spawn_workers(opts.workers, opts.worker_memory, ignore_sigterm=opts.ignore_sigterm)
    stop = threading.Event()
    install_signals(opts, stop)
    runtime = Runtime(opts)
    try:
        server = DemoServer(runtime)
    except OSError as exc:
        log(f"demo_runtime: cannot listen on {opts.host}:{opts.port}: {exc}", sys.stderr)
        stop_workers(workers)
        return 1
    threading.Thread(target=server.serve_forever, args=(0.1,), name="http", daemon=True).start()
    models = ",".join(opts.models)
    log(f"demo_runtime: pid {os.getpid()} listening on {opts.host}:{opts.port} models={models}")
    try:
        if not load(runtime, workers, stop):
            return 1
        # A timeout keeps the main thread waking, so the signal handler always gets to run.
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        stop_workers(workers)
    log("demo_runtime: stopped")
    return 0
