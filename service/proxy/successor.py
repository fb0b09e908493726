"""Relaying a request to the daemon that took over (``vramd serve --replace``).

Once a new daemon serves, the old one sends each request it has not yet sent to a
runtime (docs/operations.md, "Restarts and upgrades") to the address the client reached
it on, where the new daemon now accepts: the client's own method, path, headers and body,
and the new daemon's answer back as it comes, streams included. The client sees one
answer, from the daemon that now owns the runtimes.
"""

from __future__ import annotations

import httpx
from starlette.types import Scope, Send

# Hop-by-hop headers and the ones each server sets itself.
_NOT_RELAYED = frozenset(
    b"connection keep-alive proxy-connection te trailer transfer-encoding upgrade host "
    b"date server content-length".split()
)
_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=10.0)


async def relay_to_successor(scope: Scope, send: Send, body: bytes) -> None:
    host, port = scope["server"]
    if ":" in host:
        host = f"[{host}]"
    query = scope.get("query_string", b"")
    url = f"http://{host}:{port}{scope['path']}" + (f"?{query.decode()}" if query else "")
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _NOT_RELAYED]
    async with (
        httpx.AsyncClient(timeout=_TIMEOUT) as client,
        client.stream(scope["method"], url, headers=headers, content=body) as answer,
    ):
        kept = [(k, v) for k, v in answer.headers.raw if k.lower() not in _NOT_RELAYED]
        # The client's next request goes straight to the new daemon.
        kept.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": kept})
        async for chunk in answer.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
