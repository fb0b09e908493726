"""llama-server's slot API, as vramd uses it to save and restore a prompt cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


class SlotActionFailed(Exception):
    pass


@dataclass(frozen=True)
class SlotInfo:
    slot: int
    tokens: int | None  # None: the runtime did not say (a slot that served nothing yet)
    text: str  # the prompt and generated text the slot holds, as far as it says


@dataclass(frozen=True)
class SlotAction:
    slot: int
    tokens: int
    bytes: int
    ms: float


async def list_slots(client: httpx.AsyncClient, *, timeout_s: float) -> list[SlotInfo]:
    payload = await _call(client, "GET", "/slots", None, timeout_s)
    if not isinstance(payload, list):
        raise SlotActionFailed("GET /slots did not answer a list of slots")
    slots = []
    for entry in payload:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int):
            tokens = entry.get("n_prompt_tokens", entry.get("n_past"))
            text = "".join(
                value for key in ("prompt", "generated") if isinstance(value := entry.get(key), str)
            )
            slots.append(SlotInfo(entry["id"], tokens if isinstance(tokens, int) else None, text))
    return slots


async def save_slot(
    client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
) -> SlotAction:
    """``GET /slots`` lists the slots (``id``; ``n_prompt_tokens`` and the ``prompt`` and
    ``generated`` text once a slot has served a task). ``POST /slots/{id}?action=save`` with
    ``{"filename": NAME}`` writes the slot's tokens and KV cache to ``--slot-save-path``/NAME
    and answers ``n_saved`` (tokens), ``n_written`` (bytes) and ``timings.save_ms``;
    ``action=restore`` reads it back into the slot and answers ``n_restored``, ``n_read``
    and ``timings.restore_ms``. A slot that is busy defers the action until it is idle.

    Everything here raises ``SlotActionFailed`` with a sentence for the event log: an HTTP
    error, a timeout, an answer without the figures.
    """
    answer = await _call(client, "POST", f"/slots/{slot}?action=save", filename, timeout_s)
    return _action(answer, slot, "n_saved", "n_written", "save_ms")


async def restore_slot(
    client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
) -> SlotAction:
    answer = await _call(client, "POST", f"/slots/{slot}?action=restore", filename, timeout_s)
    return _action(answer, slot, "n_restored", "n_read", "restore_ms")


async def _call(
    client: httpx.AsyncClient, method: str, path: str, filename: str | None, timeout_s: float
) -> Any:
    body = {"filename": filename} if filename is not None else None
    try:
        response = await client.request(method, path, json=body, timeout=timeout_s)
    except httpx.TimeoutException:
        raise SlotActionFailed(f"{method} {path}: no answer within {timeout_s:g}s") from None
    except httpx.HTTPError as exc:
        raise SlotActionFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        text = response.text[:300].strip()
        raise SlotActionFailed(f"{method} {path}: HTTP {response.status_code}: {text}")
    try:
        return response.json()
    except ValueError:
        raise SlotActionFailed(f"{method} {path}: the answer is not JSON") from None


def _action(answer: Any, slot: int, tokens_key: str, bytes_key: str, ms_key: str) -> SlotAction:
    if not isinstance(answer, dict):
        raise SlotActionFailed(f"slot {slot}: the answer is not a JSON object")
    tokens, size = answer.get(tokens_key), answer.get(bytes_key)
    if not isinstance(tokens, int) or not isinstance(size, int):
        raise SlotActionFailed(f"slot {slot}: the answer has no {tokens_key} or {bytes_key}")
    timings = answer.get("timings")
    ms = timings.get(ms_key) if isinstance(timings, dict) else None
    return SlotAction(slot, tokens, size, float(ms) if isinstance(ms, int | float) else 0.0)
