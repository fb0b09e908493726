"""One request of each kind, as ``bench.real`` sends it to a runtime or to vramd.

Each is what a client of that kind sends first: a streamed chat completion (its first
byte is the first token's chunk), an embedding of two strings, a rerank of three
documents, a transcription of a one-second generated WAV, one image at the catalog's
``image_size``, a sentence to speak. The path is the client route; ``runtime_path``
gives the runtime's own path for it (whisper-server transcribes at ``/inference``), as
vramd's route table does, and ``runtime_request`` the body in the runtime's own shape
(piper's ``/synthesize``), as vramd reshapes it.
"""

from __future__ import annotations

from typing import Any

from service.adapters import adapter_named
from service.policy.routes import route_table
from service.real_runtimes.catalog import SERVICE_KINDS, RuntimeEntry

ROUTES = {
    "chat": "/v1/chat/completions",
    "vllm": "/v1/chat/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",
    "speech-to-text": "/v1/audio/transcriptions",
    "diffusion": "/v1/images/generations",
    "text-to-speech": "/v1/audio/speech",
}


def runtime_path(kind: str, entry: RuntimeEntry) -> str:
    """Where the runtime itself answers ``kind``'s client route."""
    table = route_table(SERVICE_KINDS[kind], entry.adapter, {}, entry.command)
    return table[ROUTES[kind]]


def request(kind: str, entry: RuntimeEntry, model: str) -> tuple[str, dict[str, Any]]:
    """The client route and the ``httpx`` keyword arguments of ``kind``'s request."""
    route = ROUTES[kind]
    if kind in ("chat", "vllm"):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        return route, {"json": body}
    if kind == "embedding":
        return route, {"json": {"model": model, "input": ["hello", "world"]}}
    if kind == "rerank":
        documents = ["a cat sat", "stocks fell", "the cat slept"]
        return route, {"json": {"model": model, "query": "cat", "documents": documents}}
    if kind == "speech-to-text":
        from service.real_runtimes.whisper_model import wav_bytes

        files = {"file": ("hello.wav", wav_bytes(seconds=1.0), "audio/wav")}
        return route, {"files": files, "data": {"model": model, "response_format": "json"}}
    if kind == "diffusion":
        body = {"model": model, "prompt": "a red square", "n": 1, "size": entry.image_size,
                "response_format": "b64_json"}  # fmt: skip
        return route, {"json": body}
    if kind == "text-to-speech":
        body = {"model": model, "input": "Hello there.", "voice": "alloy", "response_format": "wav"}
        return route, {"json": body}
    raise ValueError(f"no request for kind {kind!r}")


def runtime_request(kind: str, entry: RuntimeEntry, model: str) -> dict[str, Any]:
    """The ``httpx`` keyword arguments of ``kind``'s request sent to the runtime itself."""
    route, kwargs = request(kind, entry, model)
    native = adapter_named(entry.adapter).native_routes.get(route)
    if native is not None and "json" in kwargs:
        kwargs = {**kwargs, "json": native.request(kwargs["json"])}
    return kwargs
