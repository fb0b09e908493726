"""``runtimes.json``: the real runtimes ``make real-runtimes`` installed, by kind."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, ValidationError

from service.domain import ServiceKind

DEFAULT_DIR = Path("~/.cache/vramd/real-runtimes")
CATALOG_FILE = "runtimes.json"

# The catalog's kinds, and the service kind a policy gives each (vLLM serves chat).
SERVICE_KINDS: Mapping[str, ServiceKind] = MappingProxyType(
    {
        "chat": ServiceKind.CHAT,
        "embedding": ServiceKind.EMBEDDING,
        "rerank": ServiceKind.RERANK,
        "speech-to-text": ServiceKind.SPEECH,
        "diffusion": ServiceKind.DIFFUSION,
        "vllm": ServiceKind.CHAT,
        "text-to-speech": ServiceKind.SPEECH,
    }
)
REQUIRED_KINDS = ("chat", "embedding", "rerank", "speech-to-text", "diffusion", "vllm")


class RuntimeEntry(BaseModel):
    """One kind's runtime, as ``runtimes.json`` records it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    adapter: str
    command: tuple[str, ...]
    env: dict[str, str] = {}
    model: str
    version: str
    routes: tuple[str, ...]
    # Where it publishes Prometheus metrics (a policy's ``metrics:``), when it does.
    metrics: str | None = None
    # Diffusion only: an image size its generated model serves in seconds.
    image_size: str | None = None

    def argv(self, *, port: int, model: str = "model") -> list[str]:
        """The command with ``${PORT}`` and ``${MODEL}`` filled in, to run by hand."""
        values = {"${PORT}": str(port), "${MODEL}": model}
        argv = []
        for arg in self.command:
            for placeholder, value in values.items():
                arg = arg.replace(placeholder, value)
            argv.append(arg)
        return argv


class CatalogError(Exception):
    """``runtimes.json`` is missing or not what ``make real-runtimes`` writes."""


def catalog_dir() -> Path:
    """``$VRAMD_REAL_RUNTIMES``, else ``~/.cache/vramd/real-runtimes``."""
    return Path(os.environ.get("VRAMD_REAL_RUNTIMES") or DEFAULT_DIR).expanduser().resolve()


def load_catalog(directory: Path | None = None) -> dict[str, RuntimeEntry]:
    """The entries of ``directory/runtimes.json`` by kind; ``CatalogError`` naming the
    file and what is wrong with it.

    One entry per kind of runtime (``chat``, ``embedding``, ``rerank``, ``speech-to-text``,
    ``diffusion``, ``vllm``, ``text-to-speech``): the adapter that knows it, the command that
    serves its generated model (with ``${PORT}`` and ``${MODEL}`` as in a policy's command),
    its environment, the model file, the version built, and the client routes it answers.
    Tests, benchmarks and ``config/real.yaml`` start runtimes from this file only
    (docs/runtimes.md).
    """
    path = (directory or catalog_dir()) / CATALOG_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path} does not exist: run `make real-runtimes`") from None
    except (OSError, ValueError) as exc:
        raise CatalogError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: expected an object keyed by kind")
    entries = {}
    for kind, value in raw.items():
        if kind not in SERVICE_KINDS:
            raise CatalogError(f"{path}: unknown kind {kind!r}; known: {', '.join(SERVICE_KINDS)}")
        try:
            entries[kind] = RuntimeEntry.model_validate(value)
        except ValidationError as exc:
            faults = "; ".join(
                f"{kind}.{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                for error in exc.errors()
            )
            raise CatalogError(f"{path}: {faults}") from None
    return entries


def write_catalog(directory: Path, entries: Mapping[str, RuntimeEntry]) -> Path:
    """Write ``runtimes.json`` atomically (a reader never sees half a file)."""
    path = directory / CATALOG_FILE
    text = json.dumps(
        {kind: entry.model_dump(exclude_none=True) for kind, entry in entries.items()}, indent=2
    )
    partial = path.with_suffix(".json.partial")
    partial.write_text(text + "\n")
    partial.replace(path)
    return path
