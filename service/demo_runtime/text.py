"""The deterministic reply every generation route gives, and the word counts behind usage.

Chat, completions, the Responses API and the Messages API all answer "demo reply 1 2 3"
(for the default five ``--chunks``), so a test can assert on the text whichever API a
client speaks. Token counts are words, which is all the usage figures need. The request
helpers here read the fields those routes share.
"""

from __future__ import annotations

from typing import Any

from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError


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


def content_words(value: object) -> int:
    """Words a model would read in messages or input items: their text, not their roles."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return content_words(value.get("content")) + content_words(value.get("text"))
    if isinstance(value, list):
        return sum(content_words(item) for item in value)
    return 0


def model_name(payload: dict[str, Any], opts: Options) -> str:
    """The model the request names, or the first one served, as llama.cpp answers."""
    model = payload.get("model")
    return model if isinstance(model, str) and model else opts.models[0]


def require(payload: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise ApiError(400, f"'{key}' is required and must be a {_kind_name(kind)}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names: dict[type, str] = {str: "string", list: "list", bytes: "file", int: "whole number"}
    return " or ".join(names.get(k, k.__name__) for k in _kinds(kind))
