"""Every error vramd answers has the shape its client's API expects (docs/api.md, "Errors").

OpenAI's ``{"error": {"message": ..., "type": ..., "code": ...}}`` on ``/v1`` and the
admin API, Anthropic's on ``/v1/messages*``, Ollama's on the Ollama listener
(``service.proxy.dialects``), with ``Retry-After`` when the client can usefully try again later.
The handlers installed here pick the dialect by path, so no route invents its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import RequestRejected
from service.proxy.dialects import OPENAI, Dialect, Problem, dialect_for

log = logging.getLogger("vramd.api")


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    retry_after: float | None = None,
    extra: dict[str, Any] | None = None,
    dialect: Dialect = OPENAI,
) -> JSONResponse:
    return dialect.reply(Problem(status, code, message, error_type, retry_after, extra))


def rejection_response(exc: RequestRejected, dialect: Dialect = OPENAI) -> JSONResponse:
    return dialect.reply(exc)


_STATUS_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def install_error_handlers(
    app: FastAPI, dialect_of: Callable[[str], Dialect] = dialect_for
) -> None:
    """Answer every error in the dialect ``dialect_of`` names for the request's path."""

    def dialect(request: Request) -> Dialect:
        return dialect_of(request.url.path)

    async def on_rejected(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestRejected)
        return rejection_response(exc, dialect(request))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), dialect=dialect(request))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        )
        return error_response(
            400, "invalid_request", problems or "invalid request", dialect=dialect(request)
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug in vramd: still an answer in the client's shape; the traceback is logged.
        log.error("unhandled error answering a request", exc_info=exc)
        return error_response(
            500,
            "internal_error",
            f"internal error in vramd ({type(exc).__name__}); see the daemon log",
            error_type="server_error",
            dialect=dialect(request),
        )

    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestRejected, on_rejected)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
