"""Reference servers for ``bench.proxy``: what vramd's request path is measured against.

    python -m bench.relay --upstream URL --port N [--app relay|router]

``relay`` is the leanest reasonable relay written with the same libraries as vramd:
FastAPI, one ``httpx.AsyncClient`` (with vramd's pool limits), the client's body passed
on untouched and the runtime's answer streamed back as it comes (Starlette's
``StreamingResponse`` over ``aiter_raw``). It routes nothing, parses nothing, checks no
key and queues nothing: the floor for a Python relay on this stack.

``router`` is vramd's own ``/v1`` router and proxy (``service.api.openai`` and
``service.proxy.forward.ProxyResponse``) with a lease provider that grants every request at once
to the one runtime: vramd's request path without its orchestrator. Its figures, beside
the daemon's and the relay's, split what vramd adds into the HTTP side and the kernel's.

Both run under uvicorn configured as ``vramd serve`` configures it (``service.cli``):
the same log level (so the same access log), loop and HTTP implementation (uvicorn's
``auto``: uvloop and httptools where installed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from service.live.runtimes import POOL_LIMITS

# Response headers a relay must not copy: hop-by-hop ones and those the server sets.
# Content-Length stays: the raw bytes are relayed, so the runtime's length holds.
_HOP = frozenset(
    ["connection", "keep-alive", "transfer-encoding", "date", "server", "te", "trailer", "upgrade"]
)


def relay_app(upstream: str) -> FastAPI:
    """POST /v1/chat/completions passed through to ``upstream``."""
    clients: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(
            base_url=upstream, limits=POOL_LIMITS, timeout=httpx.Timeout(600.0)
        ) as client:
            clients.append(client)
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def relay(request: Request) -> Response:
        client = clients[0]
        upstream_request = client.build_request(
            "POST",
            "/v1/chat/completions",
            content=await request.body(),
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        answer = await client.send(upstream_request, stream=True)
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers=headers,
            background=BackgroundTask(answer.aclose),
        )

    return app


class StaticLeases:
    """A LeaseProvider with one always-ready runtime behind every model name."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client: httpx.AsyncClient | None = None

    def resolve(self, model: str, route: str) -> Any:
        from service.live.leases import Routed

        return Routed("bench", route)

    def service_named(self, name: str) -> str:
        return name

    async def acquire(
        self,
        service: str,
        *,
        request_id: str,
        request_info: dict[str, Any] | None = None,
        client: str = "anonymous",
    ) -> Any:
        from service.live.leases import Lease

        assert self.client is not None
        return Lease(request_id, service, self.upstream, self.client)

    def release(
        self,
        lease: Any,
        *,
        outcome: str,
        error: str | None = None,
        status: int | None = None,
        usage: Any = None,
    ) -> None:
        pass

    def models(self) -> list[Any]:
        from service.live.leases import ServedModel

        return [ServedModel("bench", "bench", "chat", "ready")]


def router_app(upstream: str) -> FastAPI:
    """vramd's /v1 router in front of ``upstream``, wired as ``create_app`` wires it."""
    from service.api import openai
    from service.api.auth import AuthConfig, install_auth
    from service.api.errors import install_error_handlers
    from service.proxy.request import ProxyConfig

    leases = StaticLeases(upstream)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(
            base_url=upstream, limits=POOL_LIMITS, timeout=httpx.Timeout(600.0)
        ) as client:
            leases.client = client
            yield

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app)
    install_auth(app, AuthConfig())
    app.state.proxy = ProxyConfig()
    app.state.daemon = SimpleNamespace(orchestrator=leases)
    app.include_router(openai.router)
    return app


APPS = {"relay": relay_app, "router": router_app}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the runtime, e.g. http://127.0.0.1:N")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--app", choices=sorted(APPS), default="relay")
    parser.add_argument("--log-level", default="info", help="as vramd's (VRAMD_LOG_LEVEL)")
    args = parser.parse_args(argv)
    app = APPS[args.app](args.upstream)
    # As service.cli.serve configures uvicorn for vramd.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
