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

from service.errors import ErrorCode, RequestRejected
from service.proxy.dialects import OPENAI, Dialect, Problem, dialect_for

log = logging.getLogger("vramd.api")


def error_response(
    code: ErrorCode,
    message: str,
    *,
    extra: dict[str, Any] | None = None,
    dialect: Dialect = OPENAI,
    http_status: int | None = None,
) -> JSONResponse:
    return dialect.reply(Problem(code, message, extra=extra, http_status=http_status))


def rejection_response(exc: RequestRejected, dialect: Dialect = OPENAI) -> JSONResponse:
    return dialect.reply(exc)


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
        code = ErrorCode.of_status(exc.status_code)
        return error_response(
            code, str(exc.detail), dialect=dialect(request), http_status=exc.status_code
        )

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        )
        return error_response(
            ErrorCode.INVALID_REQUEST, problems or "invalid request", dialect=dialect(request)
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug in vramd: still an answer in the client's shape; the traceback is logged.
        log.error("unhandled error answering a request", exc_info=exc)
        return error_response(
            ErrorCode.INTERNAL_ERROR,
            f"internal error in vramd ({type(exc).__name__}); see the daemon log",
            dialect=dialect(request),
        )

    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestRejected, on_rejected)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
