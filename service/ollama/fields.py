"""Checking an Ollama request's fields, and mapping the ones every request shares."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from service.errors import InvalidRequest

# Ollama options an OpenAI-compatible server accepts under the same name. llama.cpp reads
# all of them; vLLM reads top_k, min_p and seed and ignores the others with a warning, so
# sending them costs nothing and keeps llama.cpp's behaviour the same as Ollama's.
SAMPLING_SAME_NAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "typical_p",
    "repeat_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)
INTEGER_OPTIONS = frozenset({"top_k", "seed", "repeat_last_n", "mirostat", "num_predict"})

# Options that would change how the runtime is loaded. Ollama reloads the model for them;
# vramd never does, the policy decides (docs/policy.md: request fields never trigger a
# reload).
RUNTIME_OPTIONS = frozenset(
    {
        "num_ctx",
        "num_gpu",
        "main_gpu",
        "num_batch",
        "num_thread",
        "low_vram",
        "use_mmap",
        "use_mlock",
        "numa",
        "num_keep",
        "f16_kv",
        "vocab_only",
        "logits_all",
        "embedding_only",
    }
)

# Go's duration syntax, which Ollama parses keep_alive with, for a zero length.
_ZERO_DURATION = re.compile(r"^0+(\.0*)?(ns|us|µs|ms|s|m|h)?$")


def require_object(body: object, what: str = "request body") -> dict[str, object]:
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what}: must be a JSON object")
    return body


def require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: required, a non-empty string")
    return model


def optional_str(body: Mapping[str, Any], key: str, where: str = "") -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{where}{key}: must be a string")
    return value


def optional_bool(body: Mapping[str, Any], key: str, where: str = "") -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{where}{key}: must be true or false")
    return value


def optional_list(body: Mapping[str, Any], key: str, where: str = "") -> list[Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, list):
        raise InvalidRequest(f"{where}{key}: must be a list")
    return value


def wants_stream(body: Mapping[str, Any]) -> bool:
    """Ollama streams unless told not to: an absent (or null) ``stream`` means true."""
    stream = optional_bool(body, "stream")
    return True if stream is None else stream


def is_unload(keep_alive: object) -> bool:
    """Whether ``keep_alive`` says "unload now": 0, "0" or a zero duration such as "0s"."""
    if isinstance(keep_alive, bool):
        return False
    if isinstance(keep_alive, int | float):
        return keep_alive == 0
    return isinstance(keep_alive, str) and _ZERO_DURATION.match(keep_alive.strip()) is not None


def map_options(options: object, out: dict[str, object], ignored: list[str]) -> None:
    """Add the OpenAI equivalents of Ollama ``options`` to ``out``; note what is dropped.

    Ollama's ``options`` mix two things: sampling parameters, which an OpenAI-compatible
    server takes per request, and load parameters (``num_ctx``, ``num_gpu``, ...), which in
    Ollama silently reload the model with new settings. vramd's policy file owns the runtime's
    command line, so a request never changes it: load parameters are dropped and reported, as
    are options no OpenAI-compatible server knows. ``format`` and ``think`` map to the OpenAI
    fields (or the ``chat_template_kwargs`` that llama.cpp and vLLM both read).

    Every check raises ``InvalidRequest`` with a message that names the field, so a client's
    mistake is a 400 that says where it is, never a 500 from a ``KeyError`` further down.
    """
    if options is None:
        return
    opts = require_object(options, "options")
    for name, value in opts.items():
        if value is None:
            continue
        if name in RUNTIME_OPTIONS:
            ignored.append(f"options.{name}")
        elif name in SAMPLING_SAME_NAME:
            out[name] = _number(name, value)
        elif name == "num_predict":
            # -1 is "no limit" and -2 "fill the context": both are the server's default.
            limit = _number(name, value)
            if limit > 0:
                out["max_tokens"] = limit
        elif name == "repeat_penalty":
            # llama.cpp's name, and vLLM's; each ignores the other's.
            out["repeat_penalty"] = out["repetition_penalty"] = _number(name, value)
        elif name == "stop":
            out["stop"] = _stop(value)
        else:
            ignored.append(f"options.{name}")


def _number(name: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"options.{name}: must be a number")
    if name in INTEGER_OPTIONS:
        if isinstance(value, float) and not value.is_integer():
            raise InvalidRequest(f"options.{name}: must be a whole number")
        return int(value)
    return value


def _stop(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise InvalidRequest("options.stop: must be a string or a list of strings")


def map_format(value: object, out: dict[str, object]) -> None:
    """``format: "json"`` is OpenAI's JSON mode; a schema object is structured output."""
    if value is None or value == "":
        return
    if value == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(value, dict):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "schema", "schema": value},
        }
    else:
        raise InvalidRequest('format: must be "json" or a JSON schema object')


def map_think(value: object, out: dict[str, object]) -> None:
    """``think`` turns a reasoning model's thinking on or off, or sets its effort.

    Thinking models' chat templates (Qwen3, DeepSeek R1 distills) read ``enable_thinking``
    from ``chat_template_kwargs``, which llama.cpp and vLLM pass through; the "low" /
    "medium" / "high" levels are OpenAI's ``reasoning_effort`` (gpt-oss reads it).
    """
    if value is None:
        return
    if isinstance(value, bool):
        out["chat_template_kwargs"] = {"enable_thinking": value}
    elif value in ("low", "medium", "high"):
        out["chat_template_kwargs"] = {"enable_thinking": True}
        out["reasoning_effort"] = value
    else:
        raise InvalidRequest('think: must be true, false, "low", "medium" or "high"')


def stream_fields(stream: bool, out: dict[str, object]) -> None:
    out["stream"] = stream
    if stream:
        # The usage arrives in a last chunk of its own; the final NDJSON line needs it.
        out["stream_options"] = {"include_usage": True}
