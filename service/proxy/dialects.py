"""How vramd's own errors are worded for each client API (docs/api.md, "Errors")."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from fastapi.responses import JSONResponse

from service.errors import ErrorCode, RequestRejected
from service.policy.routes import ANTHROPIC_ROUTES

# Anthropic's error types by HTTP status (its SDK raises the class for the status).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One error as vramd states it, before any API's wording."""

    code: ErrorCode
    message: str
    retry_after: float | None = None
    extra: dict[str, object] | None = None
    # Only for the framework's errors whose status has no code of its own (``ERROR``).
    http_status: int | None = None

    @property
    def status(self) -> int:
        return self.http_status or self.code.status

    @property
    def error_type(self) -> str:
        return self.code.error_type

    @classmethod
    def of(cls, exc: RequestRejected) -> Problem:
        return cls(exc.code, exc.message, exc.retry_after)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class Dialect:
    """OpenAI's wording; the other APIs override the two bodies.

    Clients parse errors in their API's shape, and the statuses stay the same whatever the
    shape (a full queue is a 429 for every client):

    - OpenAI (``/v1`` and the admin API): ``{"error": {"message", "type", "code"}}``;
    - Anthropic (``/v1/messages*``): ``{"type": "error", "error": {"type", "message"}}``,
      the type named by the status as Anthropic's API names it;
    - Ollama (the Ollama listener): ``{"error": "..."}``.

    A ``Dialect`` answers an error before the answer has begun (``reply``) and ends an event
    stream that failed mid-way (``stream_error``), so a client library raises it as the
    API's own error instead of hanging or choking on a foreign shape. Errors that runtimes
    answer are relayed as they came: the runtime already speaks the route's API.
    """

    name = "openai"

    def body(self, problem: Problem) -> dict[str, object]:
        error = {"message": problem.message, "type": problem.error_type, "code": problem.code}
        return {"error": {**error, **(problem.extra or {})}}

    def event(self, problem: Problem) -> bytes:
        """The last event of a stream that failed (the openai client raises it)."""
        return b"data: " + json.dumps(self.body(problem)).encode() + b"\n\n"

    def reply(self, problem: Problem | RequestRejected) -> JSONResponse:
        if isinstance(problem, RequestRejected):
            problem = Problem.of(problem)
        return JSONResponse(
            self.body(problem), status_code=problem.status, headers=problem.headers()
        )

    def stream_error(self, failure: RequestRejected) -> bytes:
        return self.event(Problem.of(failure))


class ResponsesDialect(Dialect):
    """The Responses API: OpenAI's error body, and its typed ``error`` stream event.

    The event carries both the Responses fields (``type``, ``code``, ``message``) that a
    raw SSE reader looks for and the ``error`` object on which the openai client raises.
    """

    name = "openai-responses"

    def event(self, problem: Problem) -> bytes:
        data = {
            "type": "error",
            "code": problem.code,
            "message": problem.message,
            "param": None,
            **self.body(problem),
        }
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


class AnthropicDialect(Dialect):
    name = "anthropic"

    def body(self, problem: Problem) -> dict[str, object]:
        fallback = "invalid_request_error" if problem.status < 500 else "api_error"
        kind = _ANTHROPIC_TYPES.get(problem.status, fallback)
        return {"type": "error", "error": {"type": kind, "message": problem.message}}

    def event(self, problem: Problem) -> bytes:
        # The anthropic client raises on an ``error`` event with this body.
        return b"event: error\ndata: " + json.dumps(self.body(problem)).encode() + b"\n\n"


class OllamaDialect(Dialect):
    name = "ollama"

    def body(self, problem: Problem) -> dict[str, object]:
        return {"error": problem.message}

    def event(self, problem: Problem) -> bytes:
        # Ollama streams NDJSON; the client raises on a line with "error".
        return json.dumps(self.body(problem)).encode() + b"\n"


OPENAI = Dialect()
RESPONSES = ResponsesDialect()
ANTHROPIC = AnthropicDialect()
OLLAMA = OllamaDialect()


def dialect_for(path: str) -> Dialect:
    """The dialect of a ``/v1`` (or admin) path's clients."""
    if path in ANTHROPIC_ROUTES:
        return ANTHROPIC
    if path == "/v1/responses":
        return RESPONSES
    return OPENAI
