"""The HTTP side: a threading server and the handler that reads, misbehaves and replies."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

from service.demo_runtime import native, slot_actions
from service.demo_runtime.bodies import parse_payload
from service.demo_runtime.log import log
from service.demo_runtime.paths import UTILITY_ROUTES, Route, inference_routes, is_anthropic
from service.demo_runtime.replies import ApiError, Reply, json_reply
from service.demo_runtime.slots import TIMED_PATHS, timings, with_timings
from service.demo_runtime.state import Runtime
from service.demo_runtime.text import prompt_tokens
from service.units import MIB

MAX_BODY = 64 * MIB
CRASH_AFTER_CHUNKS = 2  # a streamed --crash-after request dies after this many events
CRASH_EXIT_CODE = 3
STARTED = int(time.time())
ECHO_PATH = "/debug/echo"
GPU_PATH = "/debug/gpu"  # answered only with simulated GPU memory (--gpu-memory)


class DemoServer(ThreadingHTTPServer):
    """The handler is where the misbehaviour flags act on a request: ``--hang`` never answers,
    ``--latency-ms`` waits, ``--leak-per-request`` leaks (``--gpu-leak-per-request`` on the
    simulated GPU, answering CUDA's out-of-memory error once it does not fit), ``--oom-after``
    answers with a CUDA out-of-memory error and ``--crash-after`` exits part-way through the
    reply. Each inference request takes a llama.cpp slot (``slots``) for its prompt, sleeps
    ``--prompt-ms-per-token`` for the part the slot had not cached, and chat and completions
    answers carry llama-server's ``timings``; ``POST /slots/{id}`` runs slot actions
    (``slot_actions``). Bodies
    arrive with a Content-Length or chunked, as proxies send them; streamed replies go out
    as chunked SSE. Errors take the shape of the API the path belongs to (``paths``), and
    ``/debug/echo`` takes any method, so pass-through tests can send PUT or DELETE.
    """

    daemon_threads = True  # a hung or streaming handler must not hold up exit

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.routes = inference_routes(runtime.opts)
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
        try:
            if path == ECHO_PATH:
                self._echo()
            elif path == "/health":
                ready = self.runtime.ready.is_set()
                if ready:
                    self._send(json_reply({"status": "ok"}))
                elif self.runtime.opts.ok_while_loading:
                    self._send(json_reply({"status": "loading model"}))
                else:
                    self._send(json_reply({"status": "loading"}, 503))
            elif path in ("/v1/models", "/models"):
                data = [
                    {"id": name, "object": "model", "created": STARTED, "owned_by": "demo"}
                    for name in self.runtime.opts.models
                ]
                self._send(json_reply({"object": "list", "data": data}))
            elif path == GPU_PATH and self.runtime.gpu is not None:
                self._send(json_reply(self.runtime.gpu.describe()))
            elif path == "/is_sleeping" and self.runtime.opts.sleep_mode:
                self._send(json_reply({"is_sleeping": self.runtime.sleeping}))
            elif path == "/metrics":
                text = self.runtime.metrics().encode()
                self._send(Reply(body=text, content_type="text/plain; version=0.0.4"))
            elif path in ("/slots", "/props"):
                self._check_loaded()
                self._send((native.slots if path == "/slots" else native.props)(self.runtime))
            else:
                self._no_route(path)
        except ApiError as err:
            self._send(err.reply(anthropic=is_anthropic(path)))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == ECHO_PATH:
                self._echo()
                return
            if path.startswith(slot_actions.PREFIX):
                self._slot_action()
                return
            body = self._read_body()
            if self.runtime.opts.sleep_mode and path in ("/sleep", "/wake_up"):
                if path == "/sleep":
                    self.runtime.sleep()
                elif (error := self.runtime.wake()) is not None:
                    log(f"torch.OutOfMemoryError: {error}", sys.stderr)
                    raise ApiError(500, error, "server_error")
                log(f"{path.lstrip('/')} done")
                self._send(Reply(status=200, body=b""))
                return
            route = self.server.routes.get(path)
            utility = UTILITY_ROUTES.get(path)
            if route is None and utility is None:
                raise ApiError(404, f"no route {path}", "not_found_error")
            payload = parse_payload(body, self.headers.get("Content-Type", ""))
            self._check_loaded()
            if utility is not None:
                self._send(utility(payload, self.runtime.opts))
            elif route is not None:
                self._infer(path, route, payload)
        except ApiError as err:
            self._send(err.reply(anthropic=is_anthropic(path)))

    def do_OTHER(self) -> None:
        """PUT, PATCH, DELETE and OPTIONS: only /debug/echo takes them."""
        path = self.path.split("?", 1)[0]
        try:
            if path != ECHO_PATH:
                self._no_route(path)
                return
            self._echo()
        except ApiError as err:
            self._send(err.reply(anthropic=is_anthropic(path)))

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_OTHER

    def _no_route(self, path: str) -> None:
        if path in self.server.routes or path in UTILITY_ROUTES:
            raise ApiError(405, f"use POST for {path}")
        raise ApiError(404, f"no route {path}", "not_found_error")

    def _check_loaded(self) -> None:
        if not self.runtime.ready.is_set():
            raise ApiError(503, "Loading model", "unavailable_error")
        if self.runtime.sleeping:
            raise ApiError(503, "the engine is sleeping; POST /wake_up", "unavailable_error")

    def _echo(self) -> None:
        body = self._read_body() if self._has_body() else b""
        content_type = self.headers.get("Content-Type")
        self._send(native.echo(self.command, self.path, content_type, body))

    def _slot_action(self) -> None:
        """llama.cpp's slot save, restore and erase; erase needs no body."""
        body = self._read_body() if self._has_body() else b""
        self._check_loaded()
        self._send(slot_actions.handle(self.runtime, self.path, body))

    def _infer(self, path: str, route: Route, payload: dict[str, object]) -> None:
        runtime, opts = self.runtime, self.runtime.opts
        tokens = prompt_tokens(path, payload)
        number = runtime.begin(len(tokens))
        claim = runtime.slots.claim(tokens, len(tokens) + opts.chunks)
        answered = False  # an error answer leaves the slot's cached prompt as it was
        try:
            if opts.hang:
                threading.Event().wait()  # never set: a runtime wedged inside a kernel
            prompt_ms = runtime.prefill(claim.prompt_n)
            started = time.perf_counter()
            if opts.latency_ms > 0:
                time.sleep(opts.latency_ms / 1000)
            runtime.leak()
            message = runtime.gpu_leak()
            if message is None and opts.oom_after is not None and number >= opts.oom_after:
                message = "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; demo runtime)"
            if message is not None:
                log(f"torch.OutOfMemoryError: {message}", sys.stderr)
                raise ApiError(500, message, "server_error")
            reply = route(payload, opts)
            answered = reply.status < 400
            if path in TIMED_PATHS:
                predicted_ms = (time.perf_counter() - started) * 1000
                if reply.events is not None:  # the stream's pace, still to come
                    predicted_ms += (len(reply.events) - 1) * opts.chunk_delay_ms
                stats = timings(claim.cache_n, claim.prompt_n, prompt_ms, opts.chunks, predicted_ms)
                reply = with_timings(reply, stats)
            self._send(reply, crash=opts.crash_after == number)
        finally:
            runtime.slots.release(claim, keep=answered)
            runtime.end(len(tokens))

    def _has_body(self) -> bool:
        return "Content-Length" in self.headers or "Transfer-Encoding" in self.headers

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
            self._send_stream(reply, crash=crash)
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

    def _send_stream(self, reply: Reply, *, crash: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, event in enumerate(reply.events or []):
            if index:
                time.sleep(self.runtime.opts.chunk_delay_ms / 1000)
            if crash and index == CRASH_AFTER_CHUNKS:
                self._crash()
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            if reply.named_events:
                data = b"event: " + str(event["type"]).encode() + b"\n" + data
            self._write_chunk(data)
        if crash:
            self._crash()
        if not reply.named_events:
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
