"""Did a restore take? Read from the first answer that extends a restored prefix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# How much of a saved slot's text is kept (its start and its end) to recognise it.
TEXT_KEPT = 4096
PROBE_CHARS = 200
# Answers read for a restore's verdict before giving up on finding one.
ANSWERS_TO_WAIT = 20


@dataclass(frozen=True)
class Restored:
    """One restored slot, as the check needs it."""

    slot: int
    tokens: int
    head: str
    tail: str


def keep_text(text: str) -> tuple[str, str]:
    """The start and end of a slot's text that ``continues`` compares against."""
    return text[:TEXT_KEPT], text[-TEXT_KEPT:]


def timings_of(answer: bytes) -> Mapping[str, Any] | None:
    """llama-server's ``timings`` from a JSON answer or the events of a stream."""
    if b'"timings"' not in answer:
        return None
    try:
        return _timings(json.loads(answer))
    except ValueError:
        pass
    for line in reversed(answer.splitlines()):
        if line.startswith(b"data:") and b'"timings"' in line:
            try:
                return _timings(json.loads(line[5:]))
            except ValueError:
                return None
    return None


def _timings(payload: Any) -> Mapping[str, Any] | None:
    timings = payload.get("timings") if isinstance(payload, dict) else None
    if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
        return timings
    return None


def turns_of(request: bytes) -> list[str]:
    """The text of each message (or the prompt) of a chat or completions request."""
    try:
        body = json.loads(request)
    except ValueError:
        return []
    if not isinstance(body, dict):
        return []
    messages = body.get("messages")
    if isinstance(messages, list):
        return [_content(m.get("content")) for m in messages if isinstance(m, dict)]
    prompt = body.get("prompt")
    return [prompt] if isinstance(prompt, str) else []


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def continues(slot: Restored, turns: list[str], prompt_tokens: int) -> bool:
    """Whether a request with these turns and this prompt length continues ``slot``."""
    if len(turns) < 2 or prompt_tokens < 0.9 * slot.tokens:
        return False
    if not slot.head and not slot.tail:
        return True  # the runtime said nothing of its text: the length must do
    first = turns[0].strip()[:PROBE_CHARS]
    before_last = turns[-2].strip()[-PROBE_CHARS:]
    return bool(first) and first in slot.head and before_last in slot.tail


def verdict(restored: list[Restored], request: bytes, answer: bytes) -> tuple[bool, int] | None:
    """(took, tokens not re-processed) if this exchange says whether the restore took.

    A restore can answer success and do nothing (hybrid and sliding-window models, a loaded
    mmproj, build quirks), so vramd checks what the runtime then does: llama-server's answers
    carry ``timings`` with ``prompt_n`` (prompt tokens processed) and ``cache_n`` (prompt
    tokens taken from the slot's cache). The first request that continues a restored
    conversation should re-process only its new tokens: ``cache_n`` > 0. One that shows
    ``cache_n`` = 0 means the restore did nothing.

    Which request continues a restored conversation is judged conservatively, since a wrong
    "ineffective" turns saving off: its prompt is at least 90 % as long as the restored
    tokens, it has earlier turns, and -- where the runtime told vramd the slot's text when it
    was saved -- its first message begins the same way as that text, and its last earlier
    turn ends as the text did. Anything else is not evidence either way.
    """
    timings = timings_of(answer)
    if timings is None:
        return None
    cache_n = timings.get("cache_n")
    cached = cache_n if isinstance(cache_n, int) else 0
    prompt_tokens = int(timings["prompt_n"]) + cached
    turns = turns_of(request)
    if not any(continues(slot, turns, prompt_tokens) for slot in restored):
        return None
    return cached > 0, cached
