"""Which client routes a service answers, and where its runtime answers each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from service.domain import ServiceKind

# The routes each kind serves, at the same path on its runtime unless a route map says
# otherwise. A request for a model whose service does not serve the route is a 400.
ROUTES_BY_KIND: Mapping[ServiceKind, tuple[str, ...]] = MappingProxyType(
    {
        ServiceKind.CHAT: (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
        ),
        ServiceKind.EMBEDDING: ("/v1/embeddings",),
        ServiceKind.DIFFUSION: ("/v1/images/generations", "/v1/images/edits"),
        ServiceKind.SPEECH: (
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/audio/speech",
        ),
        ServiceKind.RERANK: ("/v1/rerank",),
    }
)

# Every route a client may call with a model in its body.
CLIENT_ROUTES: tuple[str, ...] = tuple(r for routes in ROUTES_BY_KIND.values() for r in routes)

# Other spellings clients use for the same route: Jina's and Cohere's clients call
# ``/v1/rerank``, TEI's ``/rerank``, llama.cpp's documentation ``/v1/reranking``.
ROUTE_ALIASES: Mapping[str, str] = MappingProxyType(
    {"/rerank": "/v1/rerank", "/v1/reranking": "/v1/rerank"}
)

# Routes on which clients expect Anthropic's error shape rather than OpenAI's.
ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})

# Where runtimes answer a client route at another path, by adapter name
# (``service.policy.runtime_names``); ``None``: a route of the kind the runtime does not
# serve. A policy's ``routes:`` entries override these.
ADAPTER_ROUTES: Mapping[str, Mapping[str, str | None]] = MappingProxyType(
    {
        # TEI's OpenAI-compatible surface is /v1/embeddings only; it reranks at /rerank.
        "tei": MappingProxyType({"/v1/rerank": "/rerank"}),
        # whisper.cpp's server transcribes multipart uploads at /inference.
        "whisper.cpp": MappingProxyType({"/v1/audio/transcriptions": "/inference"}),
        # piper speaks at /synthesize (its adapter reshapes OpenAI's body) and only speaks.
        "piper": MappingProxyType(
            {
                "/v1/audio/speech": "/synthesize",
                "/v1/audio/transcriptions": None,
                "/v1/audio/translations": None,
            }
        ),
    }
)

# Command-line flags that move a runtime's route: whisper-server --inference-path
# /v1/audio/transcriptions answers where OpenAI's clients call (a common setup before
# vramd had route maps), and the default must follow it.
PATH_FLAGS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"whisper.cpp": ("--inference-path", "/v1/audio/transcriptions")}
)


def client_route(path: str) -> str:
    """``path`` as the route it stands for (aliases resolved)."""
    return ROUTE_ALIASES.get(path, path)


def check_route_map(routes: Mapping[str, str | None]) -> dict[str, str | None]:
    """A policy's ``routes:`` with aliases resolved; ``ValueError`` naming a bad entry."""
    checked: dict[str, str | None] = {}
    for key, target in routes.items():
        route = client_route(key)
        if route not in CLIENT_ROUTES:
            raise ValueError(
                f"{key!r} is not a route vramd serves; one of: {', '.join(CLIENT_ROUTES)} "
                "(runtime-native paths are reached through /upstream/{service}/{path})"
            )
        if route in checked:
            raise ValueError(f"{key!r} and another entry both map {route}")
        if target is not None and not target.startswith("/"):
            raise ValueError(f"{key}: must be a runtime path starting with '/', got {target!r}")
        checked[route] = target
    return checked


def adapter_routes(adapter: str, command: Sequence[str]) -> dict[str, str | None]:
    """Where the runtime ``adapter`` names answers routes at its own paths, as started by
    ``command`` (a flag such as ``--inference-path`` moves one)."""
    routes: dict[str, str | None] = dict(ADAPTER_ROUTES.get(adapter, {}))
    if adapter in PATH_FLAGS:
        flag, route = PATH_FLAGS[adapter]
        path = flag_value(command, flag)
        if path is not None and path.startswith("/"):
            routes[route] = path
    return routes


def flag_value(command: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in an argv (``--flag VALUE`` or ``--flag=VALUE``; the last
    one wins, as argument parsers do)."""
    found = None
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            found = command[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


def route_table(
    kind: ServiceKind,
    adapter: str,
    routes: Mapping[str, str | None],
    command: Sequence[str] = (),
) -> Mapping[str, str]:
    """Client route -> runtime path, for every route the service serves.

    A client calls an OpenAI- or Anthropic-style route (``/v1/chat/completions``,
    ``/v1/messages``, ...). Each service kind serves a set of them (``ROUTES_BY_KIND``); a
    runtime may answer one at another path (text-embeddings-inference reranks at
    ``/rerank``, whisper.cpp's server transcribes at ``/inference``), and a service may
    serve routes beyond its kind's (a chat runtime started with ``--embeddings``) or not
    serve some of them. The policy's ``routes:`` key says so per service (docs/policy.md,
    "Route maps"); the adapters' defaults below fill in what it does not say.

    A service's route table maps every client route it serves to the runtime path the
    request goes to. ``route_table`` builds it: the kind's routes to themselves, then the
    runtime's defaults, then the policy's entries (a ``null`` entry removes a route).

    Values only: the policy loader and the proxy both use this module.
    """
    table = {route: route for route in ROUTES_BY_KIND[kind]}
    for route, path in adapter_routes(adapter, command).items():
        if path is None:
            table.pop(route, None)
        elif route in table:  # a default moves a route; it never adds one to the kind's
            table[route] = path
    for route, target in routes.items():
        if target is None:
            table.pop(route, None)
        else:
            table[route] = target
    return table
