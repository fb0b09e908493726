"""``/upstream/{service}/{path}``: a runtime's own API, through vramd (docs/api.md)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.auth import require_api_key
from service.api.openai import get_leases, get_proxy_config, read_body
from service.proxy.forward import ProxyResponse
from service.proxy.request import ClientRequest

PREFIX = "/upstream"
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

# Request headers not passed to the runtime: hop-by-hop ones (RFC 9110 section 7.6.1),
# the ones httpx recomputes, and vramd's own credentials and cookies.
_KEPT_BACK = frozenset(
    [
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "authorization",
        "x-api-key",
        "cookie",
    ]
)

router = APIRouter(prefix=PREFIX, tags=["upstream"])


@router.api_route("/{service}", methods=METHODS, include_in_schema=False)
async def service_root(service: str, request: Request) -> Response:
    """``/upstream/chat`` -> ``/upstream/chat/``, so a web UI's relative links resolve."""
    await require_api_key(request)
    query = request.url.query
    return RedirectResponse(f"{PREFIX}/{service}/" + (f"?{query}" if query else ""), 307)


async def upstream(service: str, path: str, request: Request) -> Response:
    """Passed to the runtime of ``service`` at ``/{path}``, as it came.

    Runtimes answer more than the OpenAI routes: llama.cpp's ``/slots``, ``/props`` and
    ``/tokenize``, a web UI and its API. A request here goes to the named service's runtime
    with its method, path, query and body unchanged, on a lease like any other request: it
    loads the service if it is not running, waits its turn behind ``max_concurrency``, and
    counts as use, so the service does not idle out under it. An ``api_keys`` key is needed
    when keys are set; the key itself is not passed on (it is vramd's, not the runtime's).
    """
    caller = await require_api_key(request)
    leases = await get_leases(request)
    config = await get_proxy_config(request)
    name = leases.service_named(service)
    caller.check_service(name, [e.id for e in leases.models() if e.service == name])
    caller = caller.named(request.headers.get("x-vramd-client"))
    body = await read_body(request, config.max_upload_body, "server.max_upload_body")
    runtime_path = _runtime_path(request, service, path)
    query = request.url.query
    client_request = ClientRequest(
        path=f"{runtime_path}?{query}" if query else runtime_path,
        body=body,
        headers=_passed_headers(request),
        method=request.method,
        shape={"body_bytes": len(body), "upstream": runtime_path},
        client=caller.name,
    )
    return ProxyResponse(leases=leases, service=name, request=client_request, config=config)


# One route per method: the OpenAPI schema needs a distinct operation id for each.
for _method in METHODS:
    router.add_api_route(
        "/{service}/{path:path}", upstream, methods=[_method], name=f"upstream_{_method.lower()}"
    )


def _runtime_path(request: Request, service: str, path: str) -> str:
    """The path after ``/upstream/{service}``, still percent-encoded as the client sent
    it when the server kept the raw path (``%2F`` stays ``%2F``)."""
    raw = request.scope.get("raw_path")
    prefix = f"{PREFIX}/{service}".encode()
    if isinstance(raw, bytes) and raw.startswith(prefix + b"/"):
        return raw[len(prefix) :].decode("latin-1")
    # The service name itself was percent-encoded (``chat%2F``): only the decoded path is
    # left, so encode it again; a control character would not make a valid URL.
    return "/" + quote(path, safe="/:@!$&'()*+,;=-._~")


def _passed_headers(request: Request) -> tuple[tuple[str, str], ...]:
    kept = [(name, value) for name, value in request.headers.items() if name not in _KEPT_BACK]
    # identity, as for every proxied request: compressing on loopback only costs CPU.
    return (*kept, ("accept-encoding", "identity"))
