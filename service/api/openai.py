"""The OpenAI-compatible routes (``/v1``; docs/api.md, "OpenAI routes").

A route reads just enough of a request to route it: the body (size-limited), and the
``model`` named in it, from the JSON object or from the multipart form field. It asks the
orchestrator which service serves that model on this route and hands the rest to
``service.proxy.forward.ProxyResponse``, which queues, forwards and relays.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from service.adapters.base import NativeRoute
from service.api.auth import Caller, require_api_key
from service.api.deps import get_orchestrator
from service.domain import ServiceKind
from service.errors import InvalidRequest, ModelNotFound
from service.live.leases import LeaseProvider
from service.policy.routes import CLIENT_ROUTES, ROUTE_ALIASES, ROUTES_BY_KIND
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
async def list_models(leases: LeasesDep, caller: CallerDep) -> dict[str, Any]:
    """Every model name this client may send, with the state of the service behind it."""
    entries = [entry for entry in leases.models() if caller.may_use(entry["id"])]
    return {"object": "list", "data": [_model_entry(entry) for entry in entries]}


@models_router.get("/models/{model:path}")  # names such as "org/model" hold slashes
async def get_model(model: str, leases: LeasesDep, caller: CallerDep) -> dict[str, Any]:
    caller.check(model)
    for entry in leases.models():
        if entry["id"] == model:
            return _model_entry(entry)
    raise ModelNotFound(f"model {model!r} is not served here")


def _model_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {"object": "model", "created": STARTED, **entry, "owned_by": "vramd"}


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


ModelRewrite = Callable[[str], bytes]


def find_model(body: bytes, content_type: str) -> tuple[str, ModelRewrite, dict[str, Any]]:
    """The model a request names, a function giving its body with another model, and
    the request's shape (size, max_tokens, prompt length, image size) for incidents."""
    media = content_type.partition(";")[0].strip().lower()
    if media == "multipart/form-data":
        model, rewrite = _form_model(body, content_type)
        return model, rewrite, {"body_bytes": len(body), "multipart": True}
    if media in ("", "application/json") or media.endswith("+json"):
        return _json_model(body)
    raise HTTPException(
        415,
        f"unsupported content type {media!r}: send application/json, "
        "or multipart/form-data for file uploads",
    )


def _json_model(body: bytes) -> tuple[str, ModelRewrite, dict[str, Any]]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string")

    def with_model(name: str) -> bytes:
        # ASCII output: a lone surrogate escaped in the client's JSON cannot become UTF-8.
        return json.dumps({**payload, "model": name}, separators=(",", ":")).encode()

    return model, with_model, request_shape(payload, len(body))


def with_params(body: bytes, params: Mapping[str, Any]) -> tuple[bytes, ModelRewrite]:
    """A JSON body with a service's ``set_params`` fields set over the client's.

    The client's bytes are forwarded as they came. A body is re-encoded only when the
    service sets ``upstream_model`` or ``set_params`` for the model, or its runtime has an
    API of its own for the route (piper's ``/synthesize``, reshaped by its adapter): JSON is
    then dumped again with the new model and fields, and a multipart body gets the model
    field's value replaced in place (files are never parsed or copied twice; a find over the
    already-read body locates the field; ``set_params`` applies to JSON bodies only).
    """
    payload = {**json.loads(body), **params}

    def with_model(name: str) -> bytes:
        return json.dumps({**payload, "model": name}, separators=(",", ":")).encode()

    return json.dumps(payload, separators=(",", ":")).encode(), with_model


def reshaped(body: bytes, native: NativeRoute, service: str) -> tuple[bytes, ModelRewrite]:
    """A JSON body in the shape the service's runtime wants (piper's own API); 400 naming
    what that runtime cannot do. Its shape has no model field to rewrite."""
    try:
        runtime_body = json.dumps(native.request(json.loads(body)), separators=(",", ":")).encode()
    except ValueError as exc:
        raise InvalidRequest(f"service {service!r}: {exc}") from None
    return runtime_body, lambda _model: runtime_body


def request_shape(payload: dict[str, Any], body_bytes: int) -> dict[str, Any]:
    """What an operator needs to know of a request that preceded an out-of-memory."""
    shape: dict[str, Any] = {"body_bytes": body_bytes}
    for key in ("max_tokens", "max_completion_tokens", "n", "size", "stream", "user"):
        value = payload.get(key)
        if isinstance(value, int | str | bool):
            shape[key] = value
    prompt = payload.get("messages") or payload.get("prompt") or payload.get("input")
    if prompt is not None:
        shape["prompt_chars"] = text_chars(prompt)
    return shape


def text_chars(value: object, depth: int = 0) -> int:
    """Characters of text in a prompt (strings in nested lists and objects).

    Counted rather than re-encoded: this runs on every request, and serialising the
    whole prompt again cost more than the rest of reading the request."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:  # a prompt is a few levels deep; deeper structure is not text
        return 0
    if isinstance(value, list):
        return sum(text_chars(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return sum(text_chars(item, depth + 1) for item in value.values())
    return 0


_BOUNDARY = re.compile(r';\s*boundary\s*=\s*(?:"([^"]+)"|([^\s;]+))', re.IGNORECASE)
_FIELD_NAME = re.compile(rb';\s*name\s*=\s*(?:"([^"]*)"|([^\s;]*))', re.IGNORECASE)


def _form_model(body: bytes, content_type: str) -> tuple[str, ModelRewrite]:
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise InvalidRequest("multipart/form-data without a boundary")
    boundary = (found.group(1) or found.group(2)).encode("latin-1")
    span = form_field(body, boundary, b"model")
    if span is None:
        raise InvalidRequest("the multipart form field 'model' is required")
    start, end = span
    try:
        model = body[start:end].decode()
    except UnicodeDecodeError:
        raise InvalidRequest("the multipart form field 'model' is not UTF-8 text") from None
    if not model:
        raise InvalidRequest("the multipart form field 'model' must not be empty")

    def with_model(name: str) -> bytes:
        return b"".join((body[:start], name.encode(), body[end:]))

    return model, with_model


def form_field(body: bytes, boundary: bytes, name: bytes) -> tuple[int, int] | None:
    """Where the value of form field ``name`` lies in a multipart body (RFC 7578).

    Only part headers are looked at; each part's content is skipped with one ``find``
    for the next delimiter, so a large file costs a scan, not a copy.
    """
    delimiter = b"--" + boundary
    separator = b"\r\n" + delimiter
    if body.startswith(delimiter):
        pos = 0
    else:  # a preamble before the first delimiter
        pos = body.find(separator)
        if pos < 0:
            raise InvalidRequest("malformed multipart body: no boundary delimiter")
        pos += 2
    while True:
        pos += len(delimiter)
        if body.startswith(b"--", pos):
            return None  # the closing delimiter
        line_end = body.find(b"\r\n", pos)
        head_end = body.find(b"\r\n\r\n", line_end) if line_end >= 0 else -1
        if head_end < 0:
            raise InvalidRequest("malformed multipart body: a part without headers")
        start = head_end + 4
        end = body.find(separator, start)
        if end < 0:
            raise InvalidRequest("malformed multipart body: a part is not closed")
        if _part_name(body[line_end + 2 : head_end]) == name:
            return start, end
        pos = end + 2


def _part_name(head: bytes) -> bytes | None:
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            found = _FIELD_NAME.search(value)
            return None if found is None else (found.group(1) or found.group(2))
    return None
