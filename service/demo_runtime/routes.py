"""The inference routes, one function per OpenAI endpoint: a payload in, a ``Reply`` out.

Answers are deterministic where a test may compare them (embeddings and rerank scores
come from a hash of the text) and shaped like the real thing where a client parses them
(chat and text completions, streamed as SSE events; images; transcripts; speech).
Token counts are words, which is all the usage figures need.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import struct
import time
from collections.abc import Callable
from typing import Any

from service.demo_runtime.media import tiny_png, tiny_wav
from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError, Reply, json_reply

EMBEDDING_DIMS = 16


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
