"""The Ollama listener: Ollama's API on its own port, on the same scheduler (docs/api.md)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.responses import Response

from service import __version__
from service.api.auth import Caller, install_auth, require_api_key
from service.api.deps import get_orchestrator
from service.api.errors import error_response, install_error_handlers
from service.api.openai import get_leases, get_proxy_config, read_body
from service.errors import ErrorCode, InvalidRequest, ModelNotFound
from service.live.leases import LeaseProvider, Outcome, Routed
from service.ollama import (
    MANAGEMENT_MESSAGE,
    MANAGEMENT_ROUTES,
    ModelView,
    Translated,
    chat_request,
    embed_request,
    embeddings_request,
    generate_request,
    idle_answer,
    ps,
    show,
    tags,
    version,
)
from service.ollama.relay import Endpoint, OllamaAnswer
from service.proxy.body import request_shape
from service.proxy.dialects import OLLAMA, Dialect
from service.proxy.forward import ProxyResponse
from service.proxy.request import ClientRequest, new_request_id

log = logging.getLogger("vramd.ollama")

STARTED = datetime.now(UTC)  # every model's modified_at: when this daemon started
# The kinds Ollama's clients know: they would offer anything listed as a chat model.
LISTED_KINDS = frozenset({"chat", "embedding"})


def _ollama(_: str) -> Dialect:
    return OLLAMA


def create_ollama_app(main: FastAPI) -> FastAPI:
    """The listener's app, sharing ``main``'s state (daemon, keys, proxy settings).

    With ``server.ollama: {port: 11434}`` the daemon runs this app beside the main one
    (``service.server``); it shares the main app's state, so the keys, body limits and
    orchestrator are the same objects. Each inference route translates the request into the
    service's OpenAI route (``service.ollama``), leases and relays it through the same
    ``ProxyResponse`` as ``/v1`` (queueing, loading, cancellation on disconnect), and
    translates the answer back: one JSON object, or NDJSON lines when the client streams.

    Requests never change the runtime: options such as ``num_ctx`` or ``num_gpu`` and
    ``keep_alive`` would mean a reload or another residency in Ollama, and here the policy
    decides those. They are ignored, named in an ``X-Vramd-Ignored`` header and logged.
    Model-management calls (pull, push, create, copy, delete, blobs) answer 501: the policy
    file manages models. Other paths answer 404. Errors have Ollama's shape,
    ``{"error": "..."}``, with vramd's statuses.

    Model names are the policy's. Ollama's clients may add the implicit ``:latest`` tag, so
    a name that is not served is looked up again without it.
    """
    app = FastAPI(
        title="vramd: Ollama API",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state = main.state
    install_error_handlers(app, _ollama)
    install_auth(app, dialect_of=_ollama)
    app.include_router(open_router)
    app.include_router(router)
    return app


open_router = APIRouter()
router = APIRouter(dependencies=[Depends(require_api_key)])
CallerDep = Annotated[Caller, Depends(require_api_key)]


@open_router.get("/")
@open_router.head("/")
async def running() -> PlainTextResponse:
    """Ollama's liveness answer, which clients probe before anything else."""
    return PlainTextResponse("Ollama is running")


@router.get("/api/version")
async def api_version() -> dict[str, str]:
    return version()


@router.get("/api/tags")
async def api_tags(request: Request, caller: CallerDep) -> dict[str, Any]:
    return tags(model_views(request, caller), modified_at=STARTED)


@router.get("/api/ps")
async def api_ps(request: Request, caller: CallerDep) -> dict[str, Any]:
    return ps(model_views(request, caller))


@router.post("/api/show")
async def api_show(request: Request, caller: CallerDep) -> dict[str, Any]:
    config = await get_proxy_config(request)
    payload = _json(await read_body(request, config.max_json_body, "server.max_json_body"))
    name = payload.get("model", payload.get("name"))
    if not isinstance(name, str) or not name:
        raise InvalidRequest("'model' is required and must be a non-empty string")
    _check(caller, name)
    views = {view.name: view for view in model_views(request, caller)}
    view = views.get(name) or views.get(name.removesuffix(":latest"))
    if view is None:
        raise ModelNotFound(f"model {name!r} not found")
    return show(view, modified_at=STARTED)


@router.post("/api/chat")
async def api_chat(request: Request, caller: CallerDep) -> Response:
    return await _proxied(request, caller, chat_request, "chat")


@router.post("/api/generate")
async def api_generate(request: Request, caller: CallerDep) -> Response:
    return await _proxied(request, caller, generate_request, "generate")


@router.post("/api/embed")
async def api_embed(request: Request, caller: CallerDep) -> Response:
    return await _proxied(request, caller, embed_request, "embed")


@router.post("/api/embeddings")
async def api_embeddings(request: Request, caller: CallerDep) -> Response:
    return await _proxied(request, caller, embeddings_request, "embeddings")


def _managed_by_policy() -> JSONResponse:
    return error_response(ErrorCode.NOT_IMPLEMENTED, MANAGEMENT_MESSAGE, dialect=OLLAMA)


for _method, _path in MANAGEMENT_ROUTES:
    router.add_api_route(
        _path,
        _managed_by_policy,
        methods=[_method],
        summary="Refused (501): models are managed by vramd's policy file",
    )


# --- inference ------------------------------------------------------------------------


async def _proxied(
    request: Request,
    caller: Caller,
    translate: Callable[[object], Translated],
    endpoint: Endpoint,
) -> Response:
    leases = await get_leases(request)
    config = await get_proxy_config(request)
    raw = await read_body(request, config.max_json_body, "server.max_json_body")
    translated = translate(_json(raw))
    asked = translated.model
    _check(caller, asked)
    caller = caller.named(request.headers.get("x-vramd-client"))
    routed = _resolve(leases, asked, translated.route)
    served = routed.service
    headers: tuple[tuple[bytes, bytes], ...] = ((b"x-vramd-service", served.encode()),)
    if translated.ignored:
        names = ", ".join(translated.ignored)
        log.info("ollama %s for %s: ignored %s (the policy decides these)", endpoint, asked, names)
        headers += ((b"x-vramd-ignored", names.encode()),)
    if translated.load_only or translated.unload_only:
        return await _load_or_unload(
            leases, routed, translated, asked, endpoint, headers, caller.name
        )

    model = _served_name(leases, asked, routed)
    fields = {**translated.body, **(routed.params or {})}

    def with_model(name: str) -> bytes:
        return json.dumps({**fields, "model": name}, separators=(",", ":")).encode()

    body = with_model(model)
    accept = "text/event-stream" if translated.stream else "application/json"
    client_request = ClientRequest(
        path=routed.path,
        body=body,
        headers=(
            ("content-type", "application/json"),
            ("accept", accept),
            ("accept-encoding", "identity"),
        ),
        model=model,
        with_model=with_model,
        shape=request_shape(fields, len(body)),
        dialect=OLLAMA,
        translator=OllamaAnswer(endpoint, asked),
        reply_headers=headers,
        client_body=raw,
        client=caller.name,
    )
    return ProxyResponse(leases=leases, service=served, request=client_request, config=config)


async def _load_or_unload(
    leases: LeaseProvider,
    routed: Routed,
    translated: Translated,
    model: str,
    endpoint: Endpoint,
    headers: tuple[tuple[bytes, bytes], ...],
    client: str,
) -> Response:
    """Ollama's empty request: load the model (a lease, given back at once), or ask to
    unload it, which the policy decides: the answer says so and nothing is stopped."""
    mode = "chat" if endpoint == "chat" else "generate"
    if translated.load_only:
        lease = await leases.acquire(routed.service, request_id=new_request_id(), client=client)
        leases.release(lease, outcome=Outcome.OK)
        reason = "load"
    else:
        log.info("ollama: keep_alive 0 for %s ignored; its residency is the policy's", model)
        reason = "unload"
    answer = idle_answer(model, time.time_ns(), mode=mode, reason=reason)
    reply = JSONResponse(answer)
    reply.raw_headers.extend(headers)
    return reply


def _check(caller: Caller, model: str) -> None:
    """ModelNotAllowed unless the caller may use the model, named with or without the
    ``:latest`` Ollama's clients add."""
    if not caller.may_use(model.removesuffix(":latest")):
        caller.check(model)


def _resolve(leases: LeaseProvider, model: str, route: str) -> Routed:
    try:
        return leases.resolve(model, route)
    except ModelNotFound:
        if not model.endswith(":latest"):
            raise
        return leases.resolve(model.removesuffix(":latest"), route)


def _served_name(leases: LeaseProvider, asked: str, routed: Routed) -> str:
    """The policy's spelling of the model (without an added ``:latest``)."""
    bare = asked.removesuffix(":latest")
    if bare != asked:
        for entry in leases.models():
            if entry.id == bare and entry.service == routed.service:
                return bare
    return asked


def _json(raw: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return payload


# --- what the meta routes show ----------------------------------------------------------


def model_views(request: Request, caller: Caller) -> list[ModelView]:
    """Every chat and embedding model name the caller may use, with its service's state
    and memory."""
    orchestrator = get_orchestrator(request)
    policy = orchestrator.policy
    now = datetime.now(UTC)
    views = []
    for service in orchestrator.services_view():
        spec = policy.services.get(service.name)
        if spec is None or service.kind not in LISTED_KINDS:
            continue
        size = service.footprint_bytes or service.expected_peak_bytes or 0
        views += [
            ModelView(
                name=model,
                service=service.name,
                kind=service.kind,
                state=service.state,
                size_bytes=size,
                expires_at=_expires_at(now, spec.idle_ttl, service.idle_for_s),
                family=spec.adapter_name,
            )
            for model in service.models
            if caller.may_use(model)
        ]
    return views


def _expires_at(now: datetime, idle_ttl: float | None, idle_for: float | None) -> datetime | None:
    if not idle_ttl:
        return None  # never unloaded for idleness
    return now + timedelta(seconds=max(0.0, idle_ttl - (idle_for or 0.0)))
