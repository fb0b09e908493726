"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError, Reply, json_reply
from service.demo_runtime.text import content_words, model_name, reply_pieces, require


def create(payload: dict[str, object], opts: Options) -> Reply:
    """Answered as Anthropic's API answers (llama.cpp's server speaks it too): one text block
    holding the demo text, ``stop_reason`` ``end_turn``, or ``max_tokens`` when
    ``max_tokens`` is below the reply's words (the text is then cut to that many words).
    ``max_tokens`` is required, as Anthropic requires it. Streamed, it is Anthropic's event
    sequence, each event named by its ``type``::

        message_start, content_block_start, ping, content_block_delta (one text_delta per
        chunk), content_block_stop, message_delta (stop_reason, usage.output_tokens),
        message_stop

    Errors on these routes have Anthropic's shape (``ApiError.reply(anthropic=True)``).
    """
    prompt = prompt_words(payload)
    max_tokens = require(payload, "max_tokens", int)
    if max_tokens < 1:
        raise ApiError(400, "max_tokens: must be at least 1")
    pieces = reply_pieces(opts.chunks)
    stop_reason = "max_tokens" if max_tokens < len(pieces) else "end_turn"
    pieces = pieces[:max_tokens]
    message = {
        "id": "msg_" + os.urandom(12).hex(),
        "type": "message",
        "role": "assistant",
        "model": model_name(payload, opts),
        "content": [{"type": "text", "text": "".join(pieces)}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": len(pieces)},
    }
    if payload.get("stream") is not True:
        return json_reply(message)
    usage = {"input_tokens": prompt, "output_tokens": len(pieces)}
    return Reply(events=_events(message, pieces, usage, stop_reason), named_events=True)


def count_tokens(payload: dict[str, object], opts: Options) -> Reply:
    return json_reply({"input_tokens": prompt_words(payload)})


def prompt_words(payload: dict[str, object]) -> int:
    """Words of ``system`` and ``messages``, checking their shapes as Anthropic does."""
    messages = require(payload, "messages", list)
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), (str, list)):
            raise ApiError(400, "messages: each message needs a role and a content")
    system = payload.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise ApiError(400, "system: must be a string or a list of text blocks")
    return content_words(system) + content_words(messages)


def _events(
    message: Mapping[str, object], pieces: list[str], usage: Mapping[str, int], stop_reason: str
) -> list[dict[str, object]]:
    # The opening message carries no content and the usage known so far, as Anthropic's does.
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 1}
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
