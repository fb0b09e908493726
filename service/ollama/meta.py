"""Ollama's model listing and information answers, built from plain values.

``/api/tags`` lists every model name the policy serves, ``/api/ps`` the ones whose
service is loaded, ``/api/show`` one model. The listener fills a ``ModelView`` per model
name from the kernel's service view; nothing here reads live state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

# Paths under which the listener answers 501; /api/blobs/ is a prefix (/api/blobs/:digest).
# Ollama's model-management routes, as (method, path) of its API.
MANAGEMENT_ROUTES = (
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("POST", "/api/create"),
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
    ("HEAD", "/api/blobs/{digest}"),
    ("POST", "/api/blobs/{digest}"),
)
MANAGEMENT_MESSAGE = "models are managed by vramd's policy file; edit it and run vramd apply"

# 0.9.0 is the release that added `think`, which vramd translates. It is above the floors
# clients check before they talk to Ollama (VS Code Copilot refuses anything below 0.6.4)
# and below the releases whose features (model import, cloud models) vramd does not have.
OLLAMA_VERSION = "0.9.0"

# The states in which a service's runtime holds its model in memory ("sleeping" is vLLM's
# sleep mode: the weights are in host memory and the GPU's is freed).
LOADED_STATES = frozenset({"ready", "draining"})

# What Ollama shows for a model kept loaded forever (keep_alive < 0): a time far ahead.
_FOREVER = datetime(2318, 1, 1, tzinfo=UTC)

_CAPABILITIES = {"chat": ("completion",), "embedding": ("embedding",)}


@dataclass(frozen=True)
class ModelView:
    """One model name as the Ollama listener shows it.

    Ollama's answers describe model files (digests, quantisation, Modelfiles); vramd serves
    models through runtimes its policy starts, and has no files to describe. So the digest is
    a stable stand-in (the sha256 of the name: the same name always has the same digest, as
    clients that cache by digest expect), ``modified_at`` is the daemon's start, and the
    Modelfile, parameters and template say where the real settings live.

    Model management (pull, push, create, copy, delete, blobs) is the policy file's job:
    the listener answers those paths 501 with ``MANAGEMENT_MESSAGE``.
    """

    name: str  # the name clients send
    service: str  # the service that serves it
    kind: str  # chat | embedding | diffusion | speech | rerank
    state: str  # the service's state (stopped, starting, ready, ...)
    size_bytes: int  # its footprint when loaded, else its expected peak
    expires_at: datetime | None = None  # when idle_ttl unloads it; None: never
    family: str = ""  # the runtime (adapter name: llama.cpp, vllm, ...)
    context_length: int | None = None
    vram_bytes: int | None = None  # of size_bytes, on the GPU; None: all of it

    @property
    def loaded(self) -> bool:
        return self.state in LOADED_STATES


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


def details(view: ModelView) -> dict[str, object]:
    return {
        "parent_model": "",
        "format": "",
        "family": view.family,
        "families": [view.family] if view.family else None,
        "parameter_size": "",
        "quantization_level": "",
    }


def tags(models: Iterable[ModelView], *, modified_at: datetime) -> dict[str, object]:
    """``/api/tags``: every model name."""
    return {
        "models": [
            {
                "name": view.name,
                "model": view.name,
                "modified_at": _iso(modified_at),
                "size": max(0, view.size_bytes),
                "digest": digest(view.name),
                "details": details(view),
            }
            for view in models
        ]
    }


def ps(models: Iterable[ModelView]) -> dict[str, object]:
    """``/api/ps``: the model names whose service is loaded now."""
    out: list[dict[str, object]] = []
    for view in models:
        if not view.loaded:
            continue
        size = max(0, view.size_bytes)
        entry: dict[str, object] = {
            "name": view.name,
            "model": view.name,
            "size": size,
            "digest": digest(view.name),
            "details": details(view),
            "expires_at": _iso(view.expires_at or _FOREVER),
            "size_vram": size if view.vram_bytes is None else max(0, view.vram_bytes),
        }
        if view.context_length is not None:
            entry["context_length"] = view.context_length
        out.append(entry)
    return {"models": out}


def show(
    view: ModelView,
    *,
    modified_at: datetime,
    capabilities: Iterable[str] | None = None,
) -> dict[str, object]:
    """``/api/show``: what vramd knows of a model; ``capabilities`` overrides the kind's."""
    managed = f"# {view.name} is served by vramd service {view.service!r}; "
    model_info: dict[str, object] = {"general.architecture": view.family}
    if view.context_length is not None:
        # Clients look for "<architecture>.context_length" to size their prompts.
        model_info[f"{view.family}.context_length"] = view.context_length
    return {
        "modelfile": managed + "its runtime and settings are in vramd's policy file.\n",
        "parameters": managed + "sampling parameters are the runtime's defaults.\n",
        "template": managed + "the runtime applies the model's own chat template.\n",
        "details": details(view),
        "model_info": model_info,
        "capabilities": list(
            _CAPABILITIES.get(view.kind, ()) if capabilities is None else capabilities
        ),
        "modified_at": _iso(modified_at),
    }


def _iso(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Ollama writes times; a naive time is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
