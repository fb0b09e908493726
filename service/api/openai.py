"""The OpenAI-compatible routes (``/v1``; docs/api.md, "OpenAI routes").

A route reads just enough of a request to route it: the body (size-limited), and the
``model`` named in it, from the JSON object or from the multipart form field. It asks the
orchestrator which service serves that model on this route and hands the rest to
``service.proxy.forward.ProxyResponse``, which queues, forwards and relays.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from service.api.auth import Caller, require_api_key
from service.api.deps import get_orchestrator
from service.contract import ModelEntry, ModelList
from service.domain import ServiceKind
from service.errors import InvalidRequest, ModelNotFound
from service.live.leases import LeaseProvider, ServedModel
from service.policy.routes import CLIENT_ROUTES, ROUTE_ALIASES, ROUTES_BY_KIND
from service.proxy.body import find_model, reshaped, with_params
from service.proxy.dialects import dialect_for
from service.proxy.forward import ProxyResponse
from service.proxy.request import ClientRequest, ProxyConfig, forwarded_headers
from service.units import format_size

STARTED = int(time.time())  # the "created" of every model: when this daemon started

# Routes that carry files (or make them), held to server.max_upload_body rather than
# server.max_json_body.
UPLOAD_ROUTES = frozenset(
    ROUTES_BY_KIND[ServiceKind.DIFFUSION] + ROUTES_BY_KIND[ServiceKind.SPEECH]
)

# What each kind's answers are counted in, besides requests (``proxy.usage``).
METERS = {ServiceKind.DIFFUSION: "images", ServiceKind.SPEECH: "audio"}


# Async so that FastAPI resolves them on the event loop, not in its thread pool.
async def get_leases(request: Request) -> LeaseProvider:
    # Typed through get_orchestrator, so mypy proves the orchestrator is a LeaseProvider.
    leases: LeaseProvider = get_orchestrator(request)
    return leases


async def get_proxy_config(request: Request) -> ProxyConfig:
    config = getattr(request.app.state, "proxy", None)
    if not isinstance(config, ProxyConfig):
        raise RuntimeError("app.state.proxy is not set: the app factory must set a ProxyConfig")
    return config


LeasesDep = Annotated[LeaseProvider, Depends(get_leases)]
CallerDep = Annotated[Caller, Depends(require_api_key)]

# ``router`` holds both: the model list behind the API-key dependency, and the proxied
# routes, which check the key themselves (``proxy`` below) -- on the hot path, FastAPI's
# dependency resolution cost more than everything else the route does before the proxy.
router = APIRouter(prefix="/v1", tags=["openai"])
models_router = APIRouter()


@models_router.get("/models")
async def list_models(leases: LeasesDep, caller: CallerDep) -> ModelList:
    """Every model name this client may send, with the state of the service behind it."""
    entries = [entry for entry in leases.models() if caller.may_use(entry.id)]
    return ModelList(data=[_model_entry(entry) for entry in entries])


@models_router.get("/models/{model:path}")  # names such as "org/model" hold slashes
async def get_model(model: str, leases: LeasesDep, caller: CallerDep) -> ModelEntry:
    caller.check(model)
    for entry in leases.models():
        if entry.id == model:
            return _model_entry(entry)
    raise ModelNotFound(f"model {model!r} is not served here")


def _model_entry(entry: ServedModel) -> ModelEntry:
    return ModelEntry(
        created=STARTED, id=entry.id, service=entry.service, kind=entry.kind, state=entry.state
    )


def _proxy_route(route: str) -> Callable[..., Awaitable[Response]]:
    upload = route in UPLOAD_ROUTES
    meter = METERS.get(next(k for k, rs in ROUTES_BY_KIND.items() if route in rs), "tokens")
    dialect = dialect_for(route)

    async def proxy(request: Request) -> Response:
        caller = await require_api_key(request)
        leases = await get_leases(request)
        config = await get_proxy_config(request)
        limit, setting = (
            (config.max_upload_body, "server.max_upload_body")
            if upload
            else (config.max_json_body, "server.max_json_body")
        )
        body = client_body = await read_body(request, limit, setting)
        content_type = request.headers.get("content-type", "")
        model, with_model, shape = find_model(body, content_type)
        caller.check(model)  # before resolving: a refused key learns nothing of the rest
        caller = caller.named(request.headers.get("x-vramd-client"), shape.get("user"))
        routed = leases.resolve(model, route)
        if routed.params and not shape.get("multipart"):
            body, with_model = with_params(body, routed.params)
        native = routed.native if not shape.get("multipart") else None
        if native is not None:
            body, with_model = reshaped(body, native, routed.service)
        query = request.url.query
        client_request = ClientRequest(
            path=f"{routed.path}?{query}" if query else routed.path,
            body=body,
            client_body=client_body if client_body is not body else None,
            headers=forwarded_headers(request.headers),
            model=model,
            with_model=with_model,
            shape=shape,
            dialect=dialect,
            answer_type=native.answer_type if native is not None else None,
            client=caller.name,
            meter=meter,
        )
        return ProxyResponse(
            leases=leases, service=routed.service, request=client_request, config=config
        )

    proxy.__name__ = "proxy_" + route.removeprefix("/v1/").replace("/", "_")
    return proxy


router.include_router(models_router)
for _route in CLIENT_ROUTES:
    router.add_api_route(
        _route.removeprefix("/v1"),
        _proxy_route(_route),
        methods=["POST"],
        summary=f"Proxied to the runtime serving the request's model ({_route})",
    )
# Other spellings of a route (``/v1/reranking``); ``/rerank`` lies outside ``/v1`` and
# is added by the app factory from ``alias_router``.
alias_router = APIRouter(tags=["openai"])
for _alias, _route in ROUTE_ALIASES.items():
    target = router if _alias.startswith("/v1/") else alias_router
    target.add_api_route(
        _alias.removeprefix("/v1") if target is router else _alias,
        _proxy_route(_route),
        methods=["POST"],
        summary=f"The same as {_route}",
    )


# --- the request body ---------------------------------------------------------------------


async def read_body(request: Request, limit: int, setting: str) -> bytes:
    """The whole body, refused (413) as soon as it is known to exceed ``limit``: from
    Content-Length before reading, and while reading when the body is chunked."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, setting)
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, setting)
            chunks.append(chunk)
    except ClientDisconnect:
        # Nobody will read the answer; this only ends the request quietly.
        raise InvalidRequest("the client went away before sending the whole body") from None
    return b"".join(chunks)


def _too_large(limit: int, setting: str) -> HTTPException:
    return HTTPException(413, f"request body larger than {format_size(limit)} ({setting})")
