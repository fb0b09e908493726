"""OpenAI answers turned into Ollama's: whole answers here, streamed ones in ``streams``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from service.errors import RuntimeFailed

# OpenAI's finish reasons in Ollama's words. Ollama says "stop" after tool calls too.
_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


@dataclass(frozen=True)
class Timing:
    """A request's times, in wall-clock nanoseconds (``time.time_ns()``)."""

    start_ns: int  # the request arrived
    end_ns: int  # the answer was complete
    load_ns: int = 0  # of the whole: waiting for the model to load (a cold start)
    queue_ns: int = 0  # of the whole: waiting for a slot behind other requests
    first_token_ns: int | None = None  # the first token arrived (streams only)


def rfc3339(ns: int) -> str:
    """``2024-07-22T20:47:51.147561123Z``: the shape Go's time.RFC3339Nano gives Ollama."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{fraction:09d}Z"


def done_reason(finish_reason: object) -> str:
    return _DONE_REASONS.get(finish_reason, "stop") if isinstance(finish_reason, str) else "stop"


def stats(timing: Timing, usage: object, timings: object = None) -> dict[str, int]:
    """The final line's counts and durations; every value a non-negative int."""
    total = max(0, timing.end_ns - timing.start_ns)
    load = min(total, max(0, timing.load_ns))
    compute = max(0, total - load - max(0, timing.queue_ns))
    prompt_ns, eval_ns = _split(compute, timing, timings)
    u = usage if isinstance(usage, Mapping) else {}
    return {
        "total_duration": total,
        "load_duration": load,
        "prompt_eval_count": _count(u.get("prompt_tokens")),
        "prompt_eval_duration": prompt_ns,
        "eval_count": _count(u.get("completion_tokens")),
        "eval_duration": eval_ns,
    }


def _split(compute: int, timing: Timing, timings: object) -> tuple[int, int]:
    if isinstance(timings, Mapping):
        prompt_ms, predicted_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
        if _is_number(prompt_ms) and _is_number(predicted_ms):
            return max(0, int(prompt_ms * 1e6)), max(0, int(predicted_ms * 1e6))
    if timing.first_token_ns is not None:
        before = timing.first_token_ns - timing.start_ns - timing.load_ns - timing.queue_ns
        prompt = min(compute, max(0, before))
        return prompt, compute - prompt
    return 0, compute


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def error_line(message: str) -> dict[str, object]:
    """Ollama's error shape, for an error answer and for a stream that fails midway."""
    return {"error": message}


def tool_calls_out(calls: Sequence[object]) -> list[dict[str, object]]:
    """OpenAI tool calls (JSON-text arguments) as Ollama's (object arguments)."""
    out: list[dict[str, object]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        name = function.get("name")
        out.append(
            {
                "function": {
                    "name": name if isinstance(name, str) else "",
                    "arguments": _arguments(function.get("arguments")),
                }
            }
        )
    return out


def _arguments(text: object) -> dict[str, object]:
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return parsed if isinstance(parsed, dict) else {"arguments": text}


def thinking_of(message: Mapping[str, Any]) -> str | None:
    """The reasoning text: llama.cpp and older vLLM say reasoning_content, newer vLLM reasoning."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _first_choice(openai: object) -> Mapping[str, Any]:
    if isinstance(openai, Mapping):
        choices = openai.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            return choices[0]
    raise RuntimeFailed("the runtime's answer has no choices")


def chat_answer(openai: Mapping[str, Any], model: str, timing: Timing) -> dict[str, object]:
    """A whole ``/v1/chat/completions`` answer as an ``/api/chat`` one.

    Ollama's answers carry what OpenAI's do not: a ``created_at`` time (RFC 3339 in UTC with
    nanoseconds), ``done`` / ``done_reason``, and durations in nanoseconds that clients use
    to show tokens per second (``eval_count / eval_duration * 1e9``). The listener knows when
    a request arrived, how long it queued and whether it waited for a load; ``Timing``
    carries that in. The split of the rest between reading the prompt and generating is best
    effort, from the most exact source there is:

    1. llama.cpp's ``timings`` (``prompt_ms``, ``predicted_ms``), sent with its answers;
    2. the time the first token arrived (streams): before it is the prompt, after it is eval;
    3. nothing: all the runtime's time is eval, so a speed shown is never an overstatement.

    Tool call arguments come back from OpenAI as JSON text and go out as objects; text that
    is not a JSON object (a model can emit anything) is wrapped as ``{"arguments": text}``
    rather than dropped, because the Ollama client requires an object.
    """
    choice = _first_choice(openai)
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    content = message.get("content")
    out_message: dict[str, object] = {
        "role": "assistant",
        "content": content if isinstance(content, str) else "",
    }
    thinking = thinking_of(message)
    if thinking:
        out_message["thinking"] = thinking
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out_message["tool_calls"] = tool_calls_out(calls)
    return {
        "model": model,
        "created_at": rfc3339(timing.end_ns),
        "message": out_message,
        "done": True,
        "done_reason": done_reason(choice.get("finish_reason")),
        **stats(timing, openai.get("usage"), openai.get("timings")),
    }


def generate_answer(openai: Mapping[str, Any], model: str, timing: Timing) -> dict[str, object]:
    """A whole chat or plain completion answer as an ``/api/generate`` one."""
    choice = _first_choice(openai)
    message = choice.get("message")
    if isinstance(message, Mapping):
        text, thinking = message.get("content"), thinking_of(message)
    else:
        text, thinking = choice.get("text"), None
    out: dict[str, object] = {
        "model": model,
        "created_at": rfc3339(timing.end_ns),
        "response": text if isinstance(text, str) else "",
        "done": True,
        "done_reason": done_reason(choice.get("finish_reason")),
        **stats(timing, openai.get("usage"), openai.get("timings")),
    }
    if thinking:
        out["thinking"] = thinking
    return out


def idle_answer(model: str, at_ns: int, *, mode: str, reason: str) -> dict[str, object]:
    """The answer to a load or unload request (no prompt): ``done_reason`` "load"/"unload"."""
    out: dict[str, object] = {"model": model, "created_at": rfc3339(at_ns)}
    if mode == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason=reason)
    return out


def _embeddings(openai: object) -> list[list[float]]:
    data = openai.get("data") if isinstance(openai, Mapping) else None
    if not isinstance(data, list):
        raise RuntimeFailed("the runtime's embeddings answer has no data")
    items = sorted(
        (item for item in data if isinstance(item, Mapping)),
        key=lambda item: item.get("index", 0) if isinstance(item.get("index"), int) else 0,
    )
    vectors: list[list[float]] = []
    for item in items:
        vector = item.get("embedding")
        # A base64 string would mean the runtime ignored encoding_format "float".
        if not isinstance(vector, list):
            raise RuntimeFailed("the runtime's embeddings are not lists of numbers")
        vectors.append(vector)
    return vectors


def embed_answer(openai: Mapping[str, Any], model: str, timing: Timing) -> dict[str, object]:
    """A ``/v1/embeddings`` answer as an ``/api/embed`` one (one vector per input)."""
    counts = stats(timing, openai.get("usage"))
    return {
        "model": model,
        "embeddings": _embeddings(openai),
        "total_duration": counts["total_duration"],
        "load_duration": counts["load_duration"],
        "prompt_eval_count": counts["prompt_eval_count"],
    }


def embeddings_answer(openai: Mapping[str, Any]) -> dict[str, object]:
    """A ``/v1/embeddings`` answer as a legacy ``/api/embeddings`` one: the first vector."""
    vectors = _embeddings(openai)
    return {"embedding": vectors[0] if vectors else []}
