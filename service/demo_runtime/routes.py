"""The OpenAI inference routes, one function per endpoint: a payload in, a ``Reply`` out.

Answers are deterministic where a test may compare them (embeddings and rerank scores
come from a hash of the text) and shaped like the real thing where a client parses them
(chat and text completions, streamed as SSE events; images; transcripts; speech).
Token counts are words (``text``). The Responses and Messages APIs live in their own
modules; ``paths`` maps the routes to these functions.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import struct
import time
from collections.abc import Mapping

from service.demo_runtime.media import tiny_png, tiny_wav
from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError, Reply, json_reply
from service.demo_runtime.text import count_words, model_name, reply_pieces, require

EMBEDDING_DIMS = 16


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_completions(payload: dict[str, object], opts: Options) -> Reply:
    prompt = count_words(require(payload, "messages", list))
    return _generation(payload, opts, prompt, chat=True)


def completions(payload: dict[str, object], opts: Options) -> Reply:
    prompt = count_words(require(payload, "prompt", (str, list)))
    return _generation(payload, opts, prompt, chat=False)


def _generation(payload: dict[str, object], opts: Options, prompt: int, *, chat: bool) -> Reply:
    pieces = reply_pieces(opts.chunks)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + os.urandom(6).hex(),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name(payload, opts),
    }
    if payload.get("stream") is True:
        return Reply(events=_chat_events(head, pieces) if chat else _text_events(head, pieces))
    text = "".join(pieces)
    answer = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    choice = {"index": 0, **answer, "logprobs": None, "finish_reason": "stop"}
    return json_reply({**head, "choices": [choice], "usage": _usage(prompt, len(pieces))})


def _chat_events(head: Mapping[str, object], pieces: list[str]) -> list[dict[str, object]]:
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


def _text_events(head: Mapping[str, object], pieces: list[str]) -> list[dict[str, object]]:
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


def embeddings(payload: dict[str, object], opts: Options) -> Reply:
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
        {"object": "list", "data": data, "model": model_name(payload, opts), "usage": usage}
    )


def images(payload: dict[str, object], opts: Options) -> Reply:
    require(payload, "prompt", str)
    try:
        n = payload.get("n", 1)  # a string when it came in a multipart form
        if not isinstance(n, int | str):
            raise ValueError(n)
        count = max(int(n), 1)
    except (TypeError, ValueError):
        raise ApiError(400, "'n' must be a whole number") from None
    png = base64.b64encode(tiny_png()).decode()
    image = {"b64_json": png}
    if payload.get("response_format") == "url":
        image = {"url": f"data:image/png;base64,{png}"}
    return json_reply({"created": int(time.time()), "data": [image] * count})


def image_edits(payload: dict[str, object], opts: Options) -> Reply:
    if not any(isinstance(v, bytes) for k, v in payload.items() if k.startswith("image")):
        raise ApiError(400, "'image' is required and must be a file")
    return images(payload, opts)


def transcriptions(payload: dict[str, object], opts: Options) -> Reply:
    text = transcript(require(payload, "file", bytes))
    if payload.get("response_format") in ("text", "srt", "vtt"):
        return Reply(body=text.encode(), content_type="text/plain; charset=utf-8")
    return json_reply({"text": text})


def transcript(audio: bytes) -> str:
    """What every transcription answers: the same text for the same upload."""
    return f"demo transcript of {len(audio)} bytes"


def speech(payload: dict[str, object], opts: Options) -> Reply:
    require(payload, "input", str)
    return Reply(body=tiny_wav(), content_type="audio/wav")


def rerank(payload: dict[str, object], opts: Options) -> Reply:
    query = require(payload, "query", str)
    documents = require(payload, "documents", list)
    texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in documents]
    query_words = set(query.lower().split())
    scores = [(index, relevance(query_words, str(text))) for index, text in enumerate(texts)]
    scores.sort(key=lambda pair: pair[1], reverse=True)
    top_n = payload.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        scores = scores[:top_n]
    results = [{"index": index, "relevance_score": score} for index, score in scores]
    tokens = count_words(texts) + len(query_words)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_reply({"model": model_name(payload, opts), "results": results, "usage": usage})


def relevance(query_words: set[str], text: str) -> float:
    """A deterministic score in [0, 1): the share of query words the text holds."""
    overlap = len(query_words & set(text.lower().split())) / max(len(query_words), 1)
    # A small hash-derived term breaks ties deterministically, as real scores rarely tie.
    jitter = int.from_bytes(hashlib.sha256(text.encode()).digest()[:2], "big") / 65536
    return round(0.99 * overlap + 0.01 * jitter, 6)
