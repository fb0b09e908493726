"""The demo runtime's flags: a stand-in OpenAI-compatible runtime that misbehaves on cue.

Run it as ``python -m service.demo_runtime --port P [flags]``. It runs anywhere, without
a GPU or model weights; ``parse_args`` turns the flags below into one frozen ``Options``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

from service.units import parse_size

RESTORE_MODES = ("works", "noop", "error", "hang")  # --slot-restore


@dataclass(frozen=True)
class Options:
    """Flags (sizes accept ``200MiB``, ``1GiB`` or bytes; see ``service.units``):

        --port N                 port to listen on (required)
        --host H                 address to listen on (default 127.0.0.1)
        --model NAME             model name served; repeatable or comma-separated (default demo)
        --memory SIZE            memory to allocate and touch while loading (default 0)
        --load-seconds S         time from start until /health answers 200 (default 0)
        --never-ready            listen, but /health stays 503 forever
        --ok-while-loading       /health answers 200 {"status": "loading model"} until loaded,
                                 as early llama.cpp servers did (inference still 503s)
        --fail-start             print a CUDA out-of-memory error to stderr and exit 1
        --ignore-sigterm         ignore SIGTERM; only SIGKILL ends the process
        --crash-after N          os._exit(3) part-way through inference request N (1-based)
        --oom-after N            answer inference requests N and later with a CUDA OOM 500
        --hang                   /health is fine but inference requests never answer
        --leak-per-request SIZE  each inference request allocates SIZE that is never freed
        --leak-limit SIZE        stop leaking once this much has leaked (a plateau)
        --sleep-mode             vLLM's dev-mode sleep routes: POST /sleep?level=1 frees
                                 --memory (the "weights" leave the device), POST /wake_up
                                 takes it back, GET /is_sleeping says which
        --sleep-keeps-memory     with --sleep-mode: /sleep answers success and frees
                                 nothing, as vLLM's CPU build does
        --latency-ms MS          added latency before each inference reply (default 0)
        --chunks N               words per reply, one per streamed chunk (default 5)
        --chunk-delay-ms MS      delay between streamed events (default 20), the framing
                                 events of Responses and Messages streams included
        --workers N              fork N helper processes, as multi-process runtimes do
        --worker-memory SIZE     memory each helper allocates and touches (default 0)
        --parallel N             llama.cpp's slots: GET /slots lists N, /props says N
                                 (default 1); requests are not limited to N, only reported.
                                 Each slot caches the prompt it last processed; a request
                                 takes the idle slot sharing the longest prefix with its
                                 prompt (over a tenth of it; else the least recently used
                                 idle slot) and re-uses that prefix: ``timings.cache_n`` in
                                 chat and completions answers (see ``slots``)
        --prompt-ms-per-token F  prompt processing time: sleep F ms per prompt token the
                                 slot's cache did not hold (default 0), so a benchmark sees
                                 the prefill a cached or restored prompt saves
        --slot-save-path DIR     enable llama.cpp's POST /slots/{id}?action=save|restore|erase
                                 with {"filename": NAME} inside DIR, an existing directory
                                 (without it, slot actions answer 501)
        --state-bytes-per-token SIZE  size of a saved slot per token (default 4096), so state
                                 files grow with their prompts as KV-cache dumps do
        --slot-restore MODE      works (default); noop: restore answers success but leaves
                                 the slot's cache as it was; error: restore answers 500;
                                 hang: restore never answers (other requests still do)
        --native-routes          also answer at runtimes' own paths, as a route map sends
                                 requests there: POST /rerank (text-embeddings-inference)
                                 and POST /inference (whisper.cpp's server); /v1/rerank and
                                 /v1/audio/transcriptions then answer 404

    Simulated GPUs (``service.simgpu``; the state named by VRAMD_SIMULATED_GPUS):

        --gpu-memory SIZE        device memory to allocate at the end of loading, on the
                                 devices CUDA_VISIBLE_DEVICES shows (cuda:0 alone when it is
                                 unset), numbered as CUDA numbers them: fastest first unless
                                 CUDA_DEVICE_ORDER=PCI_BUS_ID. Out of memory (free memory or
                                 the largest free block): CUDA's lines on stderr, exit 1
        --gpu-split W,W          shares of --gpu-memory per device, e.g. 0.6,0.4 (default
                                 even over the devices used)
        --gpu-leak-per-request SIZE  device memory each inference request adds for good
                                 (split the same way); once it no longer fits, requests
                                 answer 500 with CUDA's out-of-memory message

    Inference routes (each counts toward --crash-after and --oom-after): /v1/chat/completions,
    /v1/completions, /v1/responses (OpenAI), /v1/messages (Anthropic), /v1/embeddings,
    /v1/images/generations, /v1/images/edits, /v1/audio/transcriptions,
    /v1/audio/translations, /v1/audio/speech and /v1/rerank (with --native-routes: /rerank and
    /inference instead of /v1/rerank and /v1/audio/transcriptions). llama.cpp's own routes,
    answered once loaded: GET /slots, GET /props, POST /tokenize, POST
    /v1/messages/count_tokens, and POST /slots/{id}?action=save|restore|erase (with
    --slot-save-path). Other routes: GET /health, GET /v1/models, GET /metrics, and
    /debug/echo (any method: answers the method, path, query, body and content-type it got)
    and, with simulated GPU memory, GET /debug/gpu (the devices it allocated on, and bytes).
    It logs a startup line and one line per request (``METHOD PATH STATUS``) to stdout.
    SIGTERM or SIGINT stops it with exit code 0.
    """

    port: int
    host: str = "127.0.0.1"
    models: tuple[str, ...] = ("demo",)
    memory: int = 0
    load_seconds: float = 0.0
    never_ready: bool = False
    ok_while_loading: bool = False
    fail_start: bool = False
    ignore_sigterm: bool = False
    crash_after: int | None = None
    oom_after: int | None = None
    hang: bool = False
    leak_per_request: int = 0
    leak_limit: int | None = None
    latency_ms: float = 0.0
    chunks: int = 5
    chunk_delay_ms: float = 20.0
    workers: int = 0
    worker_memory: int = 0
    sleep_mode: bool = False
    sleep_keeps_memory: bool = False
    parallel: int = 1
    native_routes: bool = False
    gpu_memory: int = 0
    gpu_split: tuple[float, ...] | None = None
    gpu_leak_per_request: int = 0
    prompt_ms_per_token: float = 0.0
    slot_save_path: str | None = None
    state_bytes_per_token: int = 4096
    slot_restore: str = "works"

    @property
    def simulated_gpu(self) -> bool:
        """Whether this runtime holds device memory on simulated GPUs."""
        return self.gpu_memory > 0 or self.gpu_leak_per_request > 0


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:  # argparse reports ArgumentTypeError messages verbatim
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _split(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        shares = ()
    if not shares or any(not share > 0 for share in shares):
        raise argparse.ArgumentTypeError(f"{text!r}: positive shares, e.g. 0.6,0.4")
    return shares


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m service.demo_runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", dest="models", action="append", default=[])
    p.add_argument("--memory", type=_size, default=0)
    p.add_argument("--load-seconds", type=float, default=0.0)
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--ok-while-loading", action="store_true")
    p.add_argument("--fail-start", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--crash-after", type=int)
    p.add_argument("--oom-after", type=int)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--leak-per-request", type=_size, default=0)
    p.add_argument("--leak-limit", type=_size)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--chunks", type=int, default=5)
    p.add_argument("--chunk-delay-ms", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--worker-memory", type=_size, default=0)
    p.add_argument("--sleep-mode", action="store_true")
    p.add_argument("--sleep-keeps-memory", action="store_true")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--native-routes", action="store_true")
    p.add_argument("--gpu-memory", type=_size, default=0)
    p.add_argument("--gpu-split", type=_split)
    p.add_argument("--gpu-leak-per-request", type=_size, default=0)
    p.add_argument("--prompt-ms-per-token", type=float, default=0.0)
    p.add_argument("--slot-save-path")
    p.add_argument("--state-bytes-per-token", type=_size, default=4096)
    p.add_argument("--slot-restore", choices=RESTORE_MODES, default="works")
    ns = vars(p.parse_args(argv))
    names = [name.strip() for item in ns.pop("models") for name in item.split(",")]
    ns["models"] = tuple(name for name in names if name) or ("demo",)
    if ns["chunks"] < 1:
        p.error("--chunks must be at least 1")
    if ns["parallel"] < 1:
        p.error("--parallel must be at least 1")
    if ns["prompt_ms_per_token"] < 0:
        p.error("--prompt-ms-per-token must not be negative")
    if ns["state_bytes_per_token"] < 1:
        p.error("--state-bytes-per-token must be at least 1")
    if ns["slot_save_path"] is not None and not os.path.isdir(ns["slot_save_path"]):
        p.error(f"--slot-save-path: not a directory: {ns['slot_save_path']}")  # as llama.cpp
    return Options(**{f.name: ns[f.name] for f in fields(Options)})
