"""A stand-in OpenAI-compatible model runtime: what the demo policy and the tests run.

vramd supervises runtimes such as llama.cpp's ``llama-server`` or vLLM as child processes.
This module is one it can run anywhere, without a GPU or model weights, while still
behaving like the real thing where vramd can see it: it listens at once but answers
``/health`` with 503 until it has "loaded", it holds real, touched memory (so host memory
probes measure it), it serves the OpenAI routes of every kind, and it exposes llama.cpp's
Prometheus metrics. Flags make it misbehave on cue, so races and failures in tests are
deterministic rather than hoped for.

Run it as ``python -m service.demo_runtime --port P [flags]``. It imports only the
standard library and ``service.units`` so that it starts in a few tens of milliseconds.

Flags (sizes accept ``200MiB``, ``1GiB`` or bytes; see ``service.units``):

    --port N                 port to listen on (required)
    --host H                 address to listen on (default 127.0.0.1)
    --model NAME             model name served; repeatable or comma-separated (default demo)
    --memory SIZE            memory to allocate and touch while loading (default 0)
    --load-seconds S         time from start until /health answers 200 (default 0)
    --never-ready            listen, but /health stays 503 forever
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
    --latency-ms MS          added latency before each inference reply (default 0)
    --chunks N               words per reply, one per streamed chunk (default 5)
    --chunk-delay-ms MS      delay between streamed chunks (default 20)
    --workers N              fork N helper processes, as multi-process runtimes do
    --worker-memory SIZE     memory each helper allocates and touches (default 0)

Inference routes (each counts toward --crash-after and --oom-after): /v1/chat/completions,
/v1/completions, /v1/embeddings, /v1/images/generations, /v1/images/edits,
/v1/audio/transcriptions, /v1/audio/translations, /v1/audio/speech and /v1/rerank. Other
routes: GET /health, GET /v1/models, GET /metrics. It logs a startup line and one line per
request (``METHOD PATH STATUS``) to stdout. SIGTERM or SIGINT stops it with exit code 0.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import math
import mmap
import os
import signal
import socket
import struct
import sys
import threading
import time
import wave
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from email.parser import HeaderParser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, NoReturn, TextIO

from service.units import parse_size

MIB = 1024 * 1024
MAX_BODY = 64 * MIB
CONTEXT_TOKENS = 4096  # the pretend KV cache size behind the llamacpp:kv_cache_* metrics
EMBEDDING_DIMS = 16
CRASH_AFTER_CHUNKS = 2  # a streamed --crash-after request dies after this many events
CRASH_EXIT_CODE = 3
STARTED = int(time.time())
_FILL = memoryview(b"\xa5" * MIB)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only
_LOG_LOCK = threading.Lock()


# --- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    port: int
    host: str = "127.0.0.1"
    models: tuple[str, ...] = ("demo",)
    memory: int = 0
    load_seconds: float = 0.0
    never_ready: bool = False
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


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:  # argparse reports ArgumentTypeError messages verbatim
        raise argparse.ArgumentTypeError(str(exc)) from exc


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
    ns = vars(p.parse_args(argv))
    names = [name.strip() for item in ns.pop("models") for name in item.split(",")]
    ns["models"] = tuple(name for name in names if name) or ("demo",)
    if ns["chunks"] < 1:
        p.error("--chunks must be at least 1")
    return Options(**{f.name: ns[f.name] for f in fields(Options)})


# --- memory and helper processes ----------------------------------------------------------


def touch_memory(size: int) -> mmap.mmap | None:
    """Map ``size`` bytes of anonymous memory and write all of it, so it counts in RSS."""
    if size <= 0:
        return None
    # MAP_POPULATE faults the pages in up front, several times faster than one fault per
    # page during the writes; the writes still matter, as zero pages may be deduplicated.
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
    for offset in range(0, size, MIB):
        block.write(_FILL[: size - offset])
    return block


@dataclass(frozen=True)
class Worker:
    pid: int
    ready_fd: int  # the worker writes one byte here once its memory is touched


def spawn_workers(count: int, size: int, *, ignore_sigterm: bool) -> list[Worker]:
    """Fork helpers that each hold ``size`` bytes for as long as this process lives.

    Called before any thread starts: forking a threaded process can copy a held lock.
    Helpers share the parent's stance on SIGTERM, as a real runtime's workers would.
    """
    workers = []
    parent = os.getpid()
    for _ in range(count):
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()  # or the child's exit could repeat buffered output
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _worker_main(parent, size, write_fd, ignore_sigterm)
        os.close(write_fd)
        workers.append(Worker(pid, read_fd))
    return workers


def _worker_main(parent: int, size: int, ready_fd: int, ignore_sigterm: bool) -> NoReturn:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
        held = touch_memory(size)
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        # Reparenting changes getppid: a SIGKILLed parent must not leave helpers behind.
        while os.getppid() == parent:
            time.sleep(0.1)
        del held
    except BaseException:
        code = 1
    finally:
        os._exit(code)  # never fall back into the parent's code path


def stop_workers(workers: list[Worker]) -> None:
    # SIGKILL: helpers hold nothing worth saving, and may be ignoring SIGTERM.
    for worker in workers:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(worker.pid, signal.SIGKILL)
            os.waitpid(worker.pid, 0)


# --- shared state -------------------------------------------------------------------------


class Runtime:
    """State shared by the handler threads; counters change under one lock."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.ready = threading.Event()
        self.memory: mmap.mmap | None = None
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
        with self._lock:
            block, self.memory = self.memory, None
            self.sleeping = True
        if block is not None:
            block.close()

    def wake(self) -> None:
        block = touch_memory(self.opts.memory)
        with self._lock:
            self.memory = block
            self.sleeping = False

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


# --- replies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: list[dict[str, Any]] | None = None  # set for an SSE stream, sent one by one


class ApiError(Exception):
    """An error answered in OpenAI's shape; ``code`` is the HTTP status, as llama.cpp does."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def reply(self) -> Reply:
        error = {"message": self.message, "type": self.kind, "code": self.status}
        return json_reply({"error": error}, self.status)


def json_reply(value: object, status: int = 200) -> Reply:
    return Reply(status, json.dumps(value).encode())


def reply_pieces(count: int) -> list[str]:
    """'demo reply 1 2 3' for five chunks, as the pieces a stream sends."""
    words = ["demo", "reply", *(str(i) for i in range(1, count - 1))][:count]
    return [words[0], *(" " + word for word in words[1:])]


def count_words(value: object) -> int:
    """A token count good enough for usage figures: words in every string of a payload."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(count_words(item) for item in value.values())
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    return 0


def _model(payload: dict[str, Any], opts: Options) -> str:
    model = payload.get("model")
    return model if isinstance(model, str) and model else opts.models[0]


def _require(payload: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, kind):
        raise ApiError(400, f"'{key}' is required and must be a {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names: dict[type, str] = {str: "string", list: "list", bytes: "file"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_completions(payload: dict[str, Any], opts: Options) -> Reply:
    prompt = count_words(_require(payload, "messages", list))
    return _generation(payload, opts, prompt, chat=True)


def completions(payload: dict[str, Any], opts: Options) -> Reply:
    prompt = count_words(_require(payload, "prompt", (str, list)))
    return _generation(payload, opts, prompt, chat=False)


def _generation(payload: dict[str, Any], opts: Options, prompt: int, *, chat: bool) -> Reply:
    pieces = reply_pieces(opts.chunks)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + os.urandom(6).hex(),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": _model(payload, opts),
    }
    if payload.get("stream") is True:
        return Reply(events=_chat_events(head, pieces) if chat else _text_events(head, pieces))
    text = "".join(pieces)
    answer = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    choice = {"index": 0, **answer, "logprobs": None, "finish_reason": "stop"}
    return json_reply({**head, "choices": [choice], "usage": _usage(prompt, len(pieces))})


def _chat_events(head: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` events: the role with the first piece, then an empty stop."""
    head = {**head, "object": "chat.completion.chunk"}
    first = {"role": "assistant", "content": pieces[0]}
    deltas = [first, *({"content": piece} for piece in pieces[1:]), {}]
    return [
        {
            **head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None if delta else "stop"}],
        }
        for delta in deltas
    ]


def _text_events(head: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    """``text_completion`` events, one per piece, then an empty one that says stop."""
    finishes = [None] * len(pieces) + ["stop"]
    return [
        {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
        for text, finish in zip([*pieces, ""], finishes, strict=True)
    ]


def embed(text: str) -> list[float]:
    """A deterministic unit vector derived from a hash of the text."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [
        int.from_bytes(digest[2 * i : 2 * i + 2], "big") / 32767.5 - 1.0
        for i in range(EMBEDDING_DIMS)
    ]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def embeddings(payload: dict[str, Any], opts: Options) -> Reply:
    value = payload.get("input")
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        texts = [json.dumps(value)]  # one input given as token ids
    elif isinstance(value, list) and value:
        texts = [v if isinstance(v, str) else json.dumps(v) for v in value]
    else:
        raise ApiError(400, "'input' must be a string or a non-empty list")
    # The openai client asks for base64 (packed little-endian float32) unless told otherwise.
    as_base64 = payload.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        floats = embed(text)
        vector: object = floats
        if as_base64:
            vector = base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = count_words(texts)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_reply(
        {"object": "list", "data": data, "model": _model(payload, opts), "usage": usage}
    )


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def tiny_png() -> bytes:
    """A valid 1x1 RGB PNG, built rather than pasted so that it is plainly well-formed."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x20\x80\xff")  # filter byte, then one RGB pixel
    chunks = _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def images(payload: dict[str, Any], opts: Options) -> Reply:
    _require(payload, "prompt", str)
    try:
        count = max(int(payload.get("n", 1)), 1)  # a string when it came in a multipart form
    except (TypeError, ValueError):
        raise ApiError(400, "'n' must be a whole number") from None
    png = base64.b64encode(tiny_png()).decode()
    image = {"b64_json": png}
    if payload.get("response_format") == "url":
        image = {"url": f"data:image/png;base64,{png}"}
    return json_reply({"created": int(time.time()), "data": [image] * count})


def image_edits(payload: dict[str, Any], opts: Options) -> Reply:
    if not any(isinstance(v, bytes) for k, v in payload.items() if k.startswith("image")):
        raise ApiError(400, "'image' is required and must be a file")
    return images(payload, opts)


def transcriptions(payload: dict[str, Any], opts: Options) -> Reply:
    audio = _require(payload, "file", bytes)
    text = f"demo transcript of {len(audio)} bytes"
    if payload.get("response_format") in ("text", "srt", "vtt"):
        return Reply(body=text.encode(), content_type="text/plain; charset=utf-8")
    return json_reply({"text": text})


def tiny_wav(seconds: float = 0.1, rate: int = 16000) -> bytes:
    """A short 440 Hz tone as a valid 16-bit mono WAV file."""
    frames = (
        int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(int(rate * seconds))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"".join(struct.pack("<h", frame) for frame in frames))
    return buffer.getvalue()


def speech(payload: dict[str, Any], opts: Options) -> Reply:
    _require(payload, "input", str)
    return Reply(body=tiny_wav(), content_type="audio/wav")


def rerank(payload: dict[str, Any], opts: Options) -> Reply:
    query = _require(payload, "query", str)
    documents = _require(payload, "documents", list)
    texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in documents]
    query_words = set(query.lower().split())
    scores = [(index, _relevance(query_words, str(text))) for index, text in enumerate(texts)]
    scores.sort(key=lambda pair: pair[1], reverse=True)
    top_n = payload.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        scores = scores[:top_n]
    results = [{"index": index, "relevance_score": score} for index, score in scores]
    tokens = count_words(texts) + len(query_words)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_reply({"model": _model(payload, opts), "results": results, "usage": usage})


def _relevance(query_words: set[str], text: str) -> float:
    overlap = len(query_words & set(text.lower().split())) / max(len(query_words), 1)
    # A small hash-derived term breaks ties deterministically, as real scores rarely tie.
    jitter = int.from_bytes(hashlib.sha256(text.encode()).digest()[:2], "big") / 65536
    return round(0.99 * overlap + 0.01 * jitter, 6)


Route = Callable[[dict[str, Any], Options], Reply]
ROUTES: dict[str, Route] = {
    "/v1/chat/completions": chat_completions,
    "/v1/completions": completions,
    "/v1/embeddings": embeddings,
    "/v1/images/generations": images,
    "/v1/images/edits": image_edits,
    "/v1/audio/transcriptions": transcriptions,
    "/v1/audio/translations": transcriptions,
    "/v1/audio/speech": speech,
    "/v1/rerank": rerank,
}


# --- request bodies -----------------------------------------------------------------------


def _header_param(header: str, value: str, param: str) -> str | None:
    found = HeaderParser().parsestr(f"{header}: {value}\n\n").get_param(param, header=header)
    return found if isinstance(found, str) else None


def parse_multipart(body: bytes, content_type: str) -> dict[str, Any]:
    """Fields of a multipart/form-data body: files as bytes, other fields as text."""
    boundary = _header_param("content-type", content_type, "boundary")
    if not boundary:
        raise ApiError(400, "multipart body without a boundary")
    form: dict[str, Any] = {}
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, separator, data = part.partition(b"\r\n\r\n")
        if not separator:
            raise ApiError(400, "malformed multipart body")
        headers = HeaderParser().parsestr(head.decode("utf-8", "replace").strip() + "\n\n")
        name = headers.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        data = data.removesuffix(b"\r\n")  # the CRLF before the next delimiter
        form[name] = data if headers.get_filename() is not None else data.decode("utf-8", "replace")
    return form


def parse_payload(body: bytes, content_type: str) -> dict[str, Any]:
    if content_type.lower().startswith("multipart/form-data"):
        return parse_multipart(body, content_type)
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    return value


# --- HTTP ---------------------------------------------------------------------------------


def log(line: str, stream: TextIO | None = None) -> None:
    """One whole line to stdout (or ``stream``), flushed: a supervisor may be tailing it."""
    out = stream or sys.stdout
    with _LOG_LOCK:
        out.write(line + "\n")
        out.flush()


class DemoServer(ThreadingHTTPServer):
    daemon_threads = True  # a hung or streaming handler must not hold up exit

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        if ":" in runtime.opts.host:
            self.address_family = socket.AF_INET6
        super().__init__((runtime.opts.host, runtime.opts.port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client hanging up mid-reply is routine, not worth a traceback
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so pooled clients can reuse connections; every reply sets Content-Length
    # or uses chunked encoding.
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; without TCP_NODELAY a client that
    # delays its ACK stalls ~40 ms per response (Nagle), which no real server does.
    disable_nagle_algorithm = True
    server_version = "demo-runtime/1"
    server: DemoServer

    @property
    def runtime(self) -> Runtime:
        return self.server.runtime

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            ready = self.runtime.ready.is_set()
            self._send(json_reply({"status": "ok" if ready else "loading"}, 200 if ready else 503))
        elif path in ("/v1/models", "/models"):
            data = [
                {"id": name, "object": "model", "created": STARTED, "owned_by": "demo"}
                for name in self.runtime.opts.models
            ]
            self._send(json_reply({"object": "list", "data": data}))
        elif path == "/is_sleeping" and self.runtime.opts.sleep_mode:
            self._send(json_reply({"is_sleeping": self.runtime.sleeping}))
        elif path == "/metrics":
            text = self.runtime.metrics().encode()
            self._send(Reply(body=text, content_type="text/plain; version=0.0.4"))
        elif path in ROUTES:
            self._send(ApiError(405, f"use POST for {path}").reply())
        else:
            self._send(ApiError(404, f"no route {path}", "not_found_error").reply())

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body()
            if self.runtime.opts.sleep_mode and path in ("/sleep", "/wake_up"):
                (self.runtime.sleep if path == "/sleep" else self.runtime.wake)()
                log(f"{path.lstrip('/')} done")
                self._send(Reply(status=200, body=b""))
                return
            route = ROUTES.get(path)
            if route is None:
                raise ApiError(404, f"no route {path}", "not_found_error")
            payload = parse_payload(body, self.headers.get("Content-Type", ""))
            if not self.runtime.ready.is_set():
                raise ApiError(503, "Loading model", "unavailable_error")
            if self.runtime.sleeping:
                raise ApiError(503, "the engine is sleeping; POST /wake_up", "unavailable_error")
            self._infer(route, payload)
        except ApiError as err:
            self._send(err.reply())

    def _infer(self, route: Route, payload: dict[str, Any]) -> None:
        runtime, opts = self.runtime, self.runtime.opts
        tokens = count_words(payload)
        number = runtime.begin(tokens)
        try:
            if opts.hang:
                threading.Event().wait()  # never set: a runtime wedged inside a kernel
            if opts.latency_ms > 0:
                time.sleep(opts.latency_ms / 1000)
            runtime.leak()
            if opts.oom_after is not None and number >= opts.oom_after:
                message = "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; demo runtime)"
                log(f"torch.OutOfMemoryError: {message}", sys.stderr)
                raise ApiError(500, message, "server_error")
            self._send(route(payload, opts), crash=opts.crash_after == number)
        finally:
            runtime.end(tokens)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True  # the body's end is unknown, so the stream is lost
            raise ApiError(411 if length is None else 400, "a valid Content-Length is required")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"body over {MAX_BODY} bytes")
        return self.rfile.read(int(length))

    def _read_chunked(self) -> bytes:
        # Proxies forward streamed bodies this way; llama.cpp's server accepts them too.
        parts, total = [], 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                size = -1
            if size < 0:  # int() also accepts a sign
                self.close_connection = True
                raise ApiError(400, "malformed chunked body")
            total += size
            if total > MAX_BODY:
                self.close_connection = True
                raise ApiError(413, f"body over {MAX_BODY} bytes")
            if size == 0:
                break
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(parts)

    def _send(self, reply: Reply, *, crash: bool = False) -> None:
        if reply.events is not None:
            self._send_stream(reply.events, crash=crash)
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if crash:
            self.wfile.write(reply.body[: len(reply.body) // 2])
            self._crash()
        self.wfile.write(reply.body)

    def _send_stream(self, events: list[dict[str, Any]], *, crash: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, event in enumerate(events):
            if index:
                time.sleep(self.runtime.opts.chunk_delay_ms / 1000)
            if crash and index == CRASH_AFTER_CHUNKS:
                self._crash()
            self._write_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        if crash:
            self._crash()
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")  # the zero-length chunk that ends the body

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _crash(self) -> NoReturn:
        log(f"demo_runtime: crashing mid-response (--crash-after {self.runtime.opts.crash_after})")
        log("Segmentation fault (simulated)", sys.stderr)
        os._exit(CRASH_EXIT_CODE)  # no cleanup, no flushing of sockets: like a real crash

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server calls this for malformed requests and unknown methods; keep it JSON.
        self.close_connection = True
        self._send(ApiError(code, message or HTTPStatus(code).phrase).reply())

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log(f"{self.command or '-'} {getattr(self, 'path', '-')} {int(code)}")

    def log_message(self, format: str, *args: Any) -> None:
        log(f"demo_runtime: {format % args}", sys.stderr)


# --- process ------------------------------------------------------------------------------


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


def load(runtime: Runtime, workers: list[Worker], stop: threading.Event) -> None:
    """What a real runtime does before /health turns 200: map weights, start helpers."""
    opts = runtime.opts
    started = time.monotonic()
    deadline = started + opts.load_seconds
    runtime.memory = touch_memory(opts.memory)
    for worker in workers:
        os.read(worker.ready_fd, 1)  # b"" if the worker died; either way it is settled
        os.close(worker.ready_fd)
    if stop.wait(max(0.0, deadline - time.monotonic())) or opts.never_ready:
        return
    runtime.ready.set()
    log(f"demo_runtime: ready after {time.monotonic() - started:.2f}s")


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
        load(runtime, workers, stop)
        # A timeout keeps the main thread waking, so the signal handler always gets to run.
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        stop_workers(workers)
    log("demo_runtime: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
