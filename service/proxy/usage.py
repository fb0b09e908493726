"""What a runtime's answer says it used: tokens, images, audio seconds (usage per client)."""

from __future__ import annotations

import json
import struct
from typing import Any

from service.live.usage import AnswerUsage

_DECODER = json.JSONDecoder()
_USAGE = b'"usage"'


def tokens_in(data: bytes) -> AnswerUsage | None:
    """The last ``"usage": {...}`` object in ``data`` (a JSON answer or SSE events)."""
    at = data.rfind(_USAGE)
    while at >= 0:
        start = data.find(b"{", at + len(_USAGE))
        if start >= 0 and not data[at + len(_USAGE) : start].strip(b" \t\r\n:"):
            try:
                usage, _ = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
            except ValueError:
                usage = None
            if isinstance(usage, dict):
                return _from_usage(usage)
        at = data.rfind(_USAGE, 0, at)
    return None


def _from_usage(usage: dict[str, Any]) -> AnswerUsage | None:
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return AnswerUsage(tokens_in=max(0, prompt), tokens_out=max(0, completion))


def images_in(body: bytes) -> AnswerUsage | None:
    """An image answer: one image per item of its ``data`` list."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return None
    data = answer.get("data") if isinstance(answer, dict) else None
    return AnswerUsage(images=len(data)) if isinstance(data, list) else None


def audio_in(body: bytes, content_type: str) -> AnswerUsage | None:
    """A transcription's ``duration``, or the seconds of a WAV answer."""
    if content_type.startswith("application/json"):
        found = tokens_in(body)
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            return found
        duration = answer.get("duration") if isinstance(answer, dict) else None
        if isinstance(duration, int | float) and duration >= 0:
            tokens = found or AnswerUsage()
            return AnswerUsage(tokens.tokens_in, tokens.tokens_out, audio_s=float(duration))
        return found
    seconds = wav_seconds(body)
    return AnswerUsage(audio_s=seconds) if seconds is not None else None


def wav_seconds(body: bytes) -> float | None:
    """The length of a RIFF/WAVE body: its data chunk's bytes over the byte rate."""
    if len(body) < 12 or body[:4] != b"RIFF" or body[8:12] != b"WAVE":
        return None
    at, byte_rate = 12, 0
    while at + 8 <= len(body):
        chunk, size = body[at : at + 4], struct.unpack_from("<I", body, at + 4)[0]
        if chunk == b"fmt " and at + 16 <= len(body):
            byte_rate = struct.unpack_from("<I", body, at + 16)[0]
        elif chunk == b"data":
            if not byte_rate:
                return None
            # Streaming writers leave the size unset (0 or 0xFFFFFFFF): count what came.
            size = len(body) - at - 8 if size in (0, 0xFFFFFFFF) else size
            return min(size, len(body) - at - 8) / byte_rate
        at += 8 + size + (size & 1)
    return None


# How each kind of answer is read, by the meter the router names (``ClientRequest.meter``).
def answer_usage(meter: str, body: bytes, content_type: str) -> AnswerUsage | None:
    """Read from bytes the proxy holds anyway (a whole answer, or a stream's last events),
    never by holding more: a chat answer's ``usage`` object (OpenAI's ``prompt_tokens`` /
    ``completion_tokens``, or ``input_tokens`` / ``output_tokens`` of the Responses and
    Anthropic APIs), the number of images in an image answer's ``data``, a transcription's
    ``duration`` (verbose_json), and the length of a WAV a speech runtime made. What an
    answer does not report counts as zero.
    """
    if meter == "images":
        return images_in(body)
    if meter == "audio":
        return audio_in(body, content_type)
    return tokens_in(body)


__all__ = ["answer_usage", "audio_in", "images_in", "tokens_in", "wav_seconds"]
