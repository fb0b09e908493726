"""The deterministic reply every generation route gives, and the word counts behind usage.

Chat, completions, the Responses API and the Messages API all answer "demo reply 1 2 3"
(for the default five ``--chunks``), so a test can assert on the text whichever API a
client speaks. Token counts are words, which is all the usage figures need. The request
helpers here read the fields those routes share.
"""

from __future__ import annotations

import hashlib
from typing import Any

from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError

VOCABULARY = 32000  # token ids fall in [FIRST_TOKEN, VOCABULARY), as in a Llama vocabulary
FIRST_TOKEN = 3  # 0-2 are llama.cpp's special tokens
# Where each generation route's prompt is; other routes' prompts are all their strings.
PROMPT_FIELDS = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/messages": "messages",
    "/v1/responses": "input",
}


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


def token_id(word: str) -> int:
    """Tokens are words too, each with a fixed id from a hash (``token_id``, what ``/tokenize``
    answers); ``prompt_tokens`` turns a request's prompt into the token list a llama.cpp slot
    caches: a chat's messages in order, each one's role as a marker token (``<|user|>``)
    before its words, so a follow-up that repeats a conversation extends its prefix.
    """
    digest = hashlib.sha256(word.encode()).digest()
    return FIRST_TOKEN + int.from_bytes(digest[:4], "big") % (VOCABULARY - FIRST_TOKEN)


def prompt_words(value: object) -> list[str]:
    """The words of every string in ``value``, in order; a message's role comes first, as
    one marker word. As many words as ``count_words`` finds (roles are single words)."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [word for item in value for word in prompt_words(item)]
    if isinstance(value, dict):
        role = value.get("role")
        head = [f"<|{role}|>"] if isinstance(role, str) and role else []
        rest = (item for key, item in value.items() if not (head and key == "role"))
        return head + [word for item in rest for word in prompt_words(item)]
    return []


def prompt_tokens(path: str, payload: dict[str, object]) -> list[int]:
    """The prompt of a request to ``path`` as token ids, as a slot caches it."""
    field = PROMPT_FIELDS.get(path)
    return [
        token_id(word) for word in prompt_words(payload if field is None else payload.get(field))
    ]


def content_words(value: object) -> int:
    """Words a model would read in messages or input items: their text, not their roles."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return content_words(value.get("content")) + content_words(value.get("text"))
    if isinstance(value, list):
        return sum(content_words(item) for item in value)
    return 0


def model_name(payload: dict[str, object], opts: Options) -> str:
    """The model the request names, or the first one served, as llama.cpp answers."""
    model = payload.get("model")
    return model if isinstance(model, str) and model else opts.models[0]


def require(payload: dict[str, object], key: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise ApiError(400, f"'{key}' is required and must be a {_kind_name(kind)}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names: dict[type, str] = {str: "string", list: "list", bytes: "file", int: "whole number"}
    return " or ".join(names.get(k, k.__name__) for k in _kinds(kind))
