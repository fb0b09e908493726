"""The exception tree of vramd."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class VramdError(Exception):
    """Base of every error vramd raises on purpose."""


class StoreError(VramdError):
    pass


class IllegalTransition(VramdError):
    pass


class ProbeError(VramdError):
    pass


class ErrorCode(StrEnum):
    """Every error code vramd answers with: the one place each is spelled. Its HTTP status
    and OpenAI error type come with it (``status``, ``error_type``)."""

    INVALID_REQUEST = "invalid_request"
    INVALID_POLICY = "invalid_policy"
    UNAUTHORIZED = "unauthorized"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    MODEL_NOT_FOUND = "model_not_found"
    SERVICE_NOT_FOUND = "service_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    QUEUE_FULL = "queue_full"
    INTERNAL_ERROR = "internal_error"
    RUNTIME_FAILED = "runtime_failed"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    QUEUE_TIMEOUT = "queue_timeout"
    WINDOW_CLOSED = "window_closed"
    HANDED_OVER = "handed_over"
    NOT_IMPLEMENTED = "not_implemented"
    RUNTIME_TIMEOUT = "runtime_timeout"
    ERROR = "error"  # any other HTTP error the framework raises

    @property
    def status(self) -> int:
        return _SHAPES[self][0]

    @property
    def error_type(self) -> str:
        return _SHAPES[self][1]

    @classmethod
    def of_status(cls, status: int) -> ErrorCode:
        """The code for an HTTP error the framework raised with only a status."""
        return _BY_STATUS.get(status, cls.ERROR)


_SHAPES: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.INVALID_POLICY: (422, "invalid_request_error"),
    ErrorCode.UNAUTHORIZED: (401, "authentication_error"),
    ErrorCode.MODEL_NOT_ALLOWED: (403, "permission_error"),
    ErrorCode.INSUFFICIENT_SCOPE: (403, "permission_error"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.SERVICE_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorCode.REQUEST_TOO_LARGE: (413, "invalid_request_error"),
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: (415, "invalid_request_error"),
    ErrorCode.QUEUE_FULL: (429, "rate_limit_error"),
    ErrorCode.INTERNAL_ERROR: (500, "server_error"),
    ErrorCode.RUNTIME_FAILED: (502, "server_error"),
    ErrorCode.INSUFFICIENT_CAPACITY: (503, "server_error"),
    ErrorCode.QUEUE_TIMEOUT: (503, "server_error"),
    ErrorCode.WINDOW_CLOSED: (503, "server_error"),
    ErrorCode.HANDED_OVER: (503, "server_error"),
    ErrorCode.NOT_IMPLEMENTED: (501, "invalid_request_error"),
    ErrorCode.RUNTIME_TIMEOUT: (504, "server_error"),
    ErrorCode.ERROR: (500, "invalid_request_error"),
}
# The framework's own HTTP errors (an unknown path, a body too large ...) by status.
_BY_STATUS = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.REQUEST_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.INVALID_REQUEST,
}


class RequestRejected(VramdError):
    """A request vramd answers with an error: its ``code`` gives the status and type."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL_ERROR
    _by_code: ClassVar[dict[ErrorCode, type[RequestRejected]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        RequestRejected._by_code[cls.code] = cls

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return self.code.status

    @property
    def error_type(self) -> str:
        return self.code.error_type

    @staticmethod
    def of(code: ErrorCode, message: str, *, retry_after: float | None = None) -> RequestRejected:
        """The exception a client gets for ``code`` (the scheduler's rejects, for one)."""
        cls = RequestRejected._by_code.get(code, RuntimeFailed)
        return cls(message, retry_after=retry_after)


class HandedOver(RequestRejected):
    """A new daemon has taken over (``--replace``): the request goes to it, not answered
    here; 503 only where a route cannot forward it."""

    code = ErrorCode.HANDED_OVER


class ModelNotFound(RequestRejected):
    code = ErrorCode.MODEL_NOT_FOUND


class InvalidRequest(RequestRejected):
    code = ErrorCode.INVALID_REQUEST


class Unauthorized(RequestRejected):
    code = ErrorCode.UNAUTHORIZED


class ModelNotAllowed(RequestRejected):
    """The client's key may not use the model it named (``server.clients.*.models``)."""

    code = ErrorCode.MODEL_NOT_ALLOWED


class InsufficientScope(RequestRejected):
    """The admin key lacks the scope the route needs (read, operate, apply)."""

    code = ErrorCode.INSUFFICIENT_SCOPE


class UnsupportedMediaType(RequestRejected):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class QueueFull(RequestRejected):
    code = ErrorCode.QUEUE_FULL


class InsufficientCapacity(RequestRejected):
    code = ErrorCode.INSUFFICIENT_CAPACITY


class QueueTimeout(RequestRejected):
    code = ErrorCode.QUEUE_TIMEOUT


class WindowClosed(RequestRejected):
    code = ErrorCode.WINDOW_CLOSED


class RuntimeFailed(RequestRejected):
    code = ErrorCode.RUNTIME_FAILED


class RuntimeTimeout(RequestRejected):
    code = ErrorCode.RUNTIME_TIMEOUT


class ServiceNotFound(RequestRejected):
    """An admin route named a service the active policy does not have."""

    code = ErrorCode.SERVICE_NOT_FOUND


class PolicyError(VramdError):
    """A policy failed validation; ``issues`` lists every problem found, not only the first."""

    def __init__(self, issues: list[PolicyIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(issue) for issue in issues))


class PolicyIssue:
    """One validation problem, located by key path and YAML position (1-based)."""

    __slots__ = ("col", "line", "message", "path")

    def __init__(self, path: str, message: str, line: int | None = None, col: int | None = None):
        self.path = path
        self.message = message
        self.line = line
        self.col = col

    def __str__(self) -> str:
        where = self.path or "(policy)"
        if self.line is not None:
            where += f" (line {self.line}, col {self.col})" if self.col else f" (line {self.line})"
        return f"{where}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "col": self.col, "message": self.message}

    def __repr__(self) -> str:
        return f"PolicyIssue({self!s})"
