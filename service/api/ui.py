"""The routes that stay open without a key: the dashboard's files and ``/metrics``.

``GET /`` serves the dashboard page and ``GET /ui/{file}`` its script and stylesheet,
straight from the ``service.ui`` package (no build step, nothing from a CDN). They hold
no data: the page's script reads ``/api`` and sends the admin key when the policy sets
``server.admin_keys`` (the page asks for it once and keeps it in ``sessionStorage``).
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from service import __version__
from service.api.deps import get_metrics

router = APIRouter(include_in_schema=False)

ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files; always revalidate so a new vramd's page never runs an old script.
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> str:
    return resources.files("service.ui").joinpath(name).read_text(encoding="utf-8")


@router.api_route("/", methods=["GET", "HEAD"])
async def dashboard() -> HTMLResponse:
    page = _read("index.html").replace("{{version}}", html.escape(__version__))
    return HTMLResponse(page, headers=SECURITY_HEADERS)


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:  # a fixed list: no path ever reaches the file system
        raise HTTPException(404, f"no dashboard file {name!r}")
    return Response(_read(name), media_type=media_type, headers=SECURITY_HEADERS)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition (open: see the module docstring).

    A plain Starlette route: a cluster router asks 20 times a second, and FastAPI's
    dependency solving and validation would add a third to the time of each answer.

    ``GET /metrics`` is the Prometheus exposition (``service.api.metrics``). It is not behind the
    admin key, because Prometheus scrapers usually cannot send one; it shows names, states
    and memory figures, and changes nothing.

    Every response here carries a strict Content-Security-Policy: scripts, styles and
    connections only from this origin, so a service name or event message that slipped
    past the page's escaping still could not run script.
    """
    body, content_type = get_metrics(request).render()
    return Response(body, media_type=content_type)
