"""One runtime answer turned into Ollama's, as the proxy relays it (``proxy.request.Translator``).

The listener hands an ``OllamaAnswer`` to the proxy with the translated request. The
proxy tells it how long the request waited for its lease (a cold start is Ollama's
``load_duration``), then either gives it the whole answer (JSON, or an error, of any
status) or the SSE stream run by run, and writes back what it returns: one JSON object,
or NDJSON lines ending with the ``done: true`` line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Literal

from service.errors import RequestRejected
from service.ollama.answers import (
    Timing,
    chat_answer,
    embed_answer,
    embeddings_answer,
    error_line,
    generate_answer,
)
from service.ollama.streams import ChatStream

Endpoint = Literal["chat", "generate", "embed", "embeddings"]
NDJSON = b"application/x-ndjson"


def _line(obj: Mapping[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def upstream_message(body: bytes) -> str:
    """The message of a runtime's error answer, whatever API shaped it."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text or "the runtime answered an error with no body"
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if isinstance(error, str) and error:
            return error
    return text


class OllamaAnswer:
    """Translates one answer for one Ollama endpoint; one instance per request.

    Still pure: bytes in, bytes out. A runtime answer that cannot be read becomes Ollama's
    ``{"error": ...}`` (with 502 when the answer had not begun), never an exception, since
    the proxy cannot answer anything else once it has started relaying.
    """

    content_type = NDJSON

    def __init__(
        self, endpoint: Endpoint, model: str, *, clock_ns: Callable[[], int] = time.time_ns
    ) -> None:
        self._endpoint = endpoint
        self._model = model
        self._clock_ns = clock_ns
        self._start_ns = clock_ns()
        self._load_ns = 0
        self._queue_ns = 0
        self._stream: ChatStream | None = None
        self._failed = False

    def leased(self, queue_ms: float, cold_start: bool) -> None:
        waited = max(0, round(queue_ms * 1e6))
        if cold_start:
            self._load_ns = waited
        else:
            self._queue_ns = waited

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status >= 400:
            return status, _line(error_line(upstream_message(body)))
        try:
            data = json.loads(body)
        except ValueError:
            return 502, _line(error_line("the runtime's answer is not JSON"))
        timing = Timing(self._start_ns, self._clock_ns(), self._load_ns, self._queue_ns)
        try:
            if self._endpoint == "chat":
                answer = chat_answer(data, self._model, timing)
            elif self._endpoint == "generate":
                answer = generate_answer(data, self._model, timing)
            elif self._endpoint == "embed":
                answer = embed_answer(data, self._model, timing)
            else:
                answer = embeddings_answer(data)
        except RequestRejected as exc:
            return exc.status, _line(error_line(exc.message))
        return status, _line(answer)

    def events(self, data: bytes) -> bytes:
        out = bytearray()
        for payload in _event_data(data):
            if self._failed:
                break
            if payload.startswith("[DONE]"):
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue  # a comment or keep-alive some runtimes send
            if not isinstance(chunk, dict):
                continue
            stream = self._chat_stream()
            for line in stream.event(chunk):
                out += _line(line)
            self._failed = stream.failed
        return bytes(out)

    def end(self) -> bytes:
        if self._failed:
            return b""
        return _line(self._chat_stream().finish())

    def _chat_stream(self) -> ChatStream:
        if self._stream is None:
            mode: Literal["chat", "generate"] = "chat" if self._endpoint == "chat" else "generate"
            self._stream = ChatStream(
                self._model,
                mode,
                start_ns=self._start_ns,
                load_ns=self._load_ns,
                queue_ns=self._queue_ns,
                clock_ns=self._clock_ns,
            )
        return self._stream


def _event_data(data: bytes) -> list[str]:
    """The ``data`` of each complete SSE event in ``data`` (multi-line data joined)."""
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    payloads = []
    for block in text.split("\n\n"):
        lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line[:5] == "data:"]
        if lines:
            payloads.append("\n".join(lines))
    return payloads
