"""The exception tree of vramd.

    VramdError
    ├── PolicyError            a policy file failed validation (carries every issue)
    ├── StoreError             the SQLite database cannot be opened or migrated
    ├── IllegalTransition      an instance state change not in domain.TRANSITIONS
    ├── ProbeError             a device probe cannot be created or read
    └── RequestRejected        a request vramd answers with an OpenAI-shaped error
        ├── ModelNotFound          404 model_not_found
        ├── ServiceNotFound        404 service_not_found (admin API)
        ├── InvalidRequest         400 invalid_request
        ├── Unauthorized           401 unauthorized
        ├── ModelNotAllowed        403 model_not_allowed (the key's client may not use it)
        ├── InsufficientScope      403 insufficient_scope (admin key without the scope)
        ├── QueueFull              429 queue_full
        ├── InsufficientCapacity   503 insufficient_capacity
        ├── QueueTimeout           503 queue_timeout
        ├── WindowClosed           503 window_closed
        ├── RuntimeFailed          502 runtime_failed
        └── RuntimeTimeout         504 runtime_timeout

``RequestRejected`` subclasses carry the HTTP status and the error ``code`` of the API
contract (docs/api.md, "Errors"), so one handler turns any of them into a response.
"""

from __future__ import annotations

from typing import ClassVar


class VramdError(Exception):
    """Base of every error vramd raises on purpose."""


class StoreError(VramdError):
    pass


class IllegalTransition(VramdError):
    pass


class ProbeError(VramdError):
    pass


class RequestRejected(VramdError):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    error_type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class HandedOver(RequestRejected):
    """A new daemon has taken over (``--replace``): the request goes to it, not answered
    here; 503 only where a route cannot forward it."""

    status = 503
    code = "handed_over"
    error_type = "server_error"


class ModelNotFound(RequestRejected):
    status = 404
    code = "model_not_found"
    error_type = "invalid_request_error"


class InvalidRequest(RequestRejected):
    status = 400
    code = "invalid_request"
    error_type = "invalid_request_error"


class Unauthorized(RequestRejected):
    status = 401
    code = "unauthorized"
    error_type = "authentication_error"


class ModelNotAllowed(RequestRejected):
    """The client's key may not use the model it named (``server.clients.*.models``)."""

    status = 403
    code = "model_not_allowed"
    error_type = "permission_error"


class InsufficientScope(RequestRejected):
    """The admin key lacks the scope the route needs (read, operate, apply)."""

    status = 403
    code = "insufficient_scope"
    error_type = "permission_error"


class QueueFull(RequestRejected):
    status = 429
    code = "queue_full"
    error_type = "rate_limit_error"


class InsufficientCapacity(RequestRejected):
    status = 503
    code = "insufficient_capacity"
    error_type = "server_error"


class QueueTimeout(RequestRejected):
    status = 503
    code = "queue_timeout"
    error_type = "server_error"


class WindowClosed(RequestRejected):
    status = 503
    code = "window_closed"
    error_type = "server_error"


class RuntimeFailed(RequestRejected):
    status = 502
    code = "runtime_failed"
    error_type = "server_error"


class RuntimeTimeout(RequestRejected):
    status = 504
    code = "runtime_timeout"
    error_type = "server_error"


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


class ServiceNotFound(RequestRejected):
    """An admin route named a service the active policy does not have."""

    status = 404
    code = "service_not_found"
    error_type = "invalid_request_error"
