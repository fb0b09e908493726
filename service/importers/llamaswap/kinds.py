"""What a model serves: llama-swap's ``capabilities`` where they say it, else its command.

``capabilities`` is listing metadata in llama-swap (what ``/v1/models`` reports), but a
few of its fields name what a runtime is for, which is what vramd's ``kind`` decides:
the routes a model answers. The rest stay comments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.importers.llamaswap.text import guess_kind, no_equivalent, show

# capabilities that say what a runtime serves, and the vramd kind that serves it
CAPABILITY_KINDS = {"reranker": "rerank", "embeddings": "embedding", "embedding": "embedding"}


def kind_of(argv: list[str], capabilities: Any, notes: list[str]) -> tuple[str, str | None]:
    """The kind from llama-swap's ``capabilities`` where one says it, else from the command."""
    guessed, guess_note = guess_kind(argv)
    if capabilities is None:
        return guessed, guess_note
    if not isinstance(capabilities, dict):
        notes.append(no_equivalent("capabilities", capabilities, "not a mapping"))
        return guessed, guess_note
    chosen: tuple[str, str] | None = None
    for key, value in capabilities.items():
        at = f"capabilities.{key}"
        kind = _capability_kind(str(key), value, capabilities)
        if kind is not None and chosen is None:
            chosen = (kind, f"llama-swap: {at}: {show(value)}")
        elif kind is not None:
            notes.append(f"llama-swap: {at}: {show(value)} also names a kind; ignored")
        else:
            notes.append(
                no_equivalent(at, value, "llama-swap's /v1/models metadata; vramd routes by kind")
            )
    if chosen is None:
        return guessed, guess_note
    kind, why = chosen
    if kind != guessed and guess_note:
        why += f" (the command suggested {guessed})"
    return kind, why


def _capability_kind(key: str, value: Any, capabilities: Mapping[str, Any]) -> str | None:
    """The vramd kind one llama-swap capability implies, or None if it implies none."""
    if key in CAPABILITY_KINDS:
        return CAPABILITY_KINDS[key] if value is True else None
    produced = capabilities.get("out")
    if key == "out" and isinstance(value, list):
        if "image" in value:
            return "diffusion"
        if "audio" in value:
            return "speech"
    # audio in, text out and nothing else: a transcription model
    if key == "in" and value == ["audio"] and produced in (None, ["text"]):
        return "speech"
    return None
