"""Small pure helpers of the llama-swap importer: names, command lines, comment text.

Kept apart from the converter so that its classes read as the mapping itself; nothing
here knows which llama-swap key it is looking at.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any, TypeGuard

import yaml

from service.importers import ImportFailed
from service.units import format_duration


def no_equivalent(key: str, value: Any, why: str, *, limit: int = 60) -> str:
    return f"llama-swap: {key}: {show(value, limit)} has no vramd equivalent ({why})"


def show(value: Any, limit: int = 60) -> str:
    """A value on one comment line: YAML flow style, cut at ``limit`` characters."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict | list):
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    else:
        text = json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def slug(model_id: str) -> str:
    """A service name (``[a-z0-9][a-z0-9_.-]{0,62}``) for a llama-swap model id."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", model_id.lower())
    name = re.sub(r"-{2,}", "-", name).lstrip("_.-")[:63].rstrip("-")
    return name or "model"


def guess_kind(argv: list[str]) -> tuple[str, str | None]:
    """What a runtime serves, from its command line; the reason when not plain chat."""
    program = os.path.basename(argv[0]).lower() if argv else ""
    flags = {arg.split("=")[0].lower() for arg in argv}
    if flags & {"--embedding", "--embeddings"}:
        return "embedding", "guessed from --embedding"
    if flags & {"--reranking", "--rerank"}:
        return "rerank", "guessed from --reranking"
    for word in ("whisper", "kokoro", "piper", "tts"):
        if word in program:
            return "speech", f"guessed from {program}"
    if program in ("sd", "sd-server") or "stable-diffusion" in program:
        return "diffusion", f"guessed from {program}"
    return "chat", None


def split_command(cmd: str) -> list[str]:
    """llama-swap's reading of ``cmd``: drop ``#`` lines, join ``\\`` continuations, split."""
    lines = []
    for line in cmd.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        lines.append(stripped[:-1] + " " if stripped.endswith("\\") else line)
    try:
        return shlex.split("\n".join(lines))
    except ValueError as exc:
        raise ImportFailed(f"cannot split the command {cmd.strip()!r}: {exc}") from None


def seconds(value: float) -> int | str:
    return 0 if value == 0 else format_duration(value)


def with_port(arg: str, port: str) -> str:
    """``8999``, ``--port=8999``, ``host:8999`` and docker's ``8999:8080`` -> ``${PORT}``."""
    if arg == port:
        return "${PORT}"
    if re.search(rf"[=:]{port}$", arg):
        return arg[: -len(port)] + "${PORT}"
    if re.match(rf"^{port}:\d+$", arg):
        return "${PORT}" + arg[len(port) :]
    return arg
