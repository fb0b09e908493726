"""Importers: other tools' configurations turned into a vramd policy file.

Each importer reads the other tool's file and writes policy YAML *text* with comments,
because what cannot be carried over has to be said next to where it would go, and
PyYAML cannot write comments. The helpers here write the few YAML forms a policy needs;
every importer validates its own output with ``service.policy.load_policy``.

- ``llamaswap``: llama-swap's ``config.yaml`` (``vramd import llama-swap PATH``).
"""

from __future__ import annotations

import json
import re

import yaml

__all__ = ["ImportFailed", "comment", "flow_list", "scalar"]


class ImportFailed(ValueError):
    """The input cannot be converted (not YAML, not that tool's format, ...)."""


_PLAIN_RE = re.compile(r"^[A-Za-z0-9_./@%+=~^$-][A-Za-z0-9_./@%+=~^$:-]*$")


def scalar(value: object) -> str:
    """One YAML scalar: plain where that reads back as the same string, else quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN_RE.match(text) and _reads_back(text):
        return text
    return json.dumps(text)  # a JSON string is a valid double-quoted YAML scalar


def _reads_back(text: str) -> bool:
    try:
        return bool(yaml.safe_load(f"[{text}]") == [text])
    except yaml.YAMLError:
        return False


def flow_list(items: list[str], *, column: int, width: int = 96) -> str:
    """``[a, b, "${PORT}"]`` with ``[`` at ``column``; wrapped under it past ``width``."""
    parts = [scalar(item) for item in items]
    if not parts:
        return "[]"
    lines: list[str] = []
    line = "["
    for i, part in enumerate(parts):
        piece = part + ("]" if i == len(parts) - 1 else ",")
        used = len(line) + (column if not lines else 0)  # later lines hold their indent
        if line != "[" and used + 1 + len(piece) > width:
            lines.append(line)
            line = " " * (column + 1) + piece
        else:
            line += piece if line == "[" else " " + piece
    lines.append(line)
    return "\n".join(lines)


def comment(text: str, limit: int = 200) -> str:
    """Text safe to put after ``#`` on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
