"""Every error vramd answers has the OpenAI shape (DESIGN section 6).

``{"error": {"message": ..., "type": ..., "code": ...}}``, with ``Retry-After`` when the
client can usefully try again later. One function builds it so no route invents its own.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import RequestRejected

log = logging.getLogger("vramd.api")


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    retry_after: float | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"error": {"message": message, "type": error_type, "code": code}}
    if extra:
        body["error"].update(extra)
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return JSONResponse(body, status_code=status, headers=headers)


def rejection_response(exc: RequestRejected) -> JSONResponse:
    return error_response(
        exc.status,
        exc.code,
        exc.message,
        error_type=exc.error_type,
        retry_after=exc.retry_after,
    )


_STATUS_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def install_error_handlers(app: FastAPI) -> None:
    async def on_rejected(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestRejected)
        return rejection_response(exc)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail))

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        )
        return error_response(400, "invalid_request", problems or "invalid request")

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug in vramd: still an OpenAI-shaped answer; the traceback goes to the log.
        log.error("unhandled error answering a request", exc_info=exc)
        return error_response(
            500,
            "internal_error",
            f"internal error in vramd ({type(exc).__name__}); see the daemon log",
            error_type="server_error",
        )

    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestRejected, on_rejected)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
