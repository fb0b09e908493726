"""What a router hands the proxy: the client's request, checked, and how to relay it.

``ClientRequest`` carries the runtime's path, the client's bytes and the few headers worth
passing on; ``ProxyConfig`` the body limits and upstream timeouts, built once from the
policy; a ``Translator`` turns a runtime's answer into another API's (the Ollama
listener's) and is absent when the runtime's bytes are relayed as they came.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from service.policy import ServerConfig
from service.policy.clients import ANONYMOUS
from service.proxy.dialects import OPENAI, Dialect
from service.units import MIB

# Request headers worth passing on. Everything else stays here: Authorization holds the
# client's vramd key, Host and Content-Length are recomputed, cookies mean nothing to a
# runtime.
FORWARDED_REQUEST_HEADERS = ("content-type", "accept")


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Body limits and upstream timeouts (seconds), built once from the policy.

    ``first_byte_timeout`` runs from sending the request to the runtime's response
    headers; a non-streaming generation answers only when it is done, so it is long.
    ``read_timeout`` is the longest silence allowed once the answer has begun: a stream
    that stalls this long is ended with a ``runtime_timeout`` error event.
    """

    max_json_body: int = 4 * MIB
    max_upload_body: int = 64 * MIB
    connect_timeout: float = 10.0
    first_byte_timeout: float = 600.0
    read_timeout: float = 300.0
    write_timeout: float = 60.0
    upstream_timeout: httpx.Timeout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # httpx's own read timeout is only a backstop: the two above are enforced with
        # asyncio.timeout, since httpx applies one read timeout to every socket read.
        backstop = max(self.first_byte_timeout, self.read_timeout)
        timeout = httpx.Timeout(
            connect=self.connect_timeout,
            read=backstop,
            write=self.write_timeout,
            pool=self.connect_timeout,
        )
        object.__setattr__(self, "upstream_timeout", timeout)

    @classmethod
    def from_server(cls, server: ServerConfig, **timeouts: float) -> ProxyConfig:
        """The policy's ``server.max_json_body`` / ``max_upload_body``, plus timeouts."""
        settings: dict[str, float] = {
            "first_byte_timeout": server.request_timeout,
            "read_timeout": server.stream_idle_timeout,
            **timeouts,
        }
        return cls(
            max_json_body=server.max_json_body,
            max_upload_body=server.max_upload_body,
            **settings,
        )


class Translator(Protocol):
    """Turns a runtime's answer into another API's (the Ollama listener's).

    ``leased`` hears how long the request waited for its lease; ``whole`` gets every
    answer read whole (JSON, and every error), ``events`` each run of complete SSE events
    as it arrives, ``end`` is called once after the last event.
    """

    content_type: bytes  # of a translated stream

    def leased(self, queue_ms: float, cold_start: bool) -> None: ...

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]: ...

    def events(self, data: bytes) -> bytes: ...

    def end(self) -> bytes: ...


def _same_body(name: str) -> bytes:
    raise AssertionError(f"this request has no model to rewrite (asked for {name!r})")


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A client's request as the router hands it over: checked, its service found."""

    path: str  # the runtime's path, query string included
    body: bytes  # the client's bytes, forwarded untouched unless the model is rewritten
    headers: tuple[tuple[str, str], ...]  # the subset in FORWARDED_REQUEST_HEADERS
    model: str | None = None  # None: passed through whatever it names (/upstream)
    with_model: Callable[[str], bytes] = _same_body  # the body with its model replaced
    # Size, max_tokens, prompt length, image size: kept by the orchestrator for incidents.
    shape: Mapping[str, Any] = field(default_factory=dict)
    method: str = "POST"
    dialect: Dialect = OPENAI  # how vramd's own errors are worded for this client
    translator: Translator | None = None
    reply_headers: tuple[tuple[bytes, bytes], ...] = ()  # added to the client's answer
    # The content type of a successful answer, where the runtime labels it wrongly.
    answer_type: str | None = None
    # The client's own bytes where ``body`` differs (set_params, a native route, the
    # Ollama translation): what a hand-over relays to the new daemon (``successor.py``).
    client_body: bytes | None = None
    # Who asked (docs/policy.md, "Clients and keys"): its fair share of the queue, usage.
    client: str = ANONYMOUS
    # What the answer is counted in, besides requests (``proxy.usage``): "tokens",
    # "images" or "audio".
    meter: str = "tokens"

    def body_for(self, upstream_model: str | None) -> bytes:
        if upstream_model is None or self.model is None or upstream_model == self.model:
            return self.body
        return self.with_model(upstream_model)


def forwarded_headers(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    # identity: compressing on loopback only costs the runtime and the proxy CPU.
    kept = [(name, value) for name in FORWARDED_REQUEST_HEADERS if (value := headers.get(name))]
    return (*kept, ("accept-encoding", "identity"))


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)
