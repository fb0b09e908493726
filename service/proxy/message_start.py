"""Anthropic's event stream opens with ``message_start``, and clients rely on it."""

from __future__ import annotations

import json


class MessageStart:
    """Called with each run of whole events of one stream, in order.

    The Anthropic SDKs build the message from that first event (its id, model and usage)
    and fail without it (``get_final_message`` asserts). llama-server sends it only with
    the partial result of the first generated token, and a first token that is not whole
    UTF-8 (a byte of a multi-byte character) yields no partial result: its stream then
    opens with ``content_block_start`` (docs/runtimes.md, llama.cpp). ``MessageStart`` puts
    one in front of such a stream, made from what vramd knows: the request's model and id;
    the input tokens are not known (0), the runtime's ``message_delta`` carries the output.
    """

    def __init__(self, *, model: str | None, request_id: str) -> None:
        self._model = model
        self._id = "msg_" + request_id.removeprefix("req-")
        self._seen = False

    def events(self, data: bytes) -> bytes:
        if self._seen or not data:
            return data
        self._seen = True
        if first_event_type(data) in ("message_start", "error"):
            return data
        return self._opening() + data

    def _opening(self) -> bytes:
        message: dict[str, object] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        data = json.dumps({"type": "message_start", "message": message}, separators=(",", ":"))
        return b"event: message_start\ndata: " + data.encode() + b"\n\n"


def first_event_type(data: bytes) -> str | None:
    """The type of the first event in ``data``: its ``event:`` field, else the ``type``
    of its JSON ``data:``; ``None`` when it says neither."""
    for line in data.splitlines():
        field, _, value = line.partition(b":")
        if field == b"event":
            return value.strip().decode("utf-8", "replace")
        if field == b"data":
            try:
                payload = json.loads(value)
            except ValueError:
                return None
            kind = payload.get("type") if isinstance(payload, dict) else None
            return kind if isinstance(kind, str) else None
    return None  # comments and blank lines only
