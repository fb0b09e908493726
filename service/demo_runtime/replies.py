"""What a request gets back: a ``Reply`` (a body or an SSE stream), or an ``ApiError``.

Errors have OpenAI's shape, with the HTTP status as their ``code`` as llama.cpp does, so
vramd's proxy sees the same error bodies as from a real runtime; on the Anthropic
Messages routes they have Anthropic's shape instead (``reply(anthropic=True)``), which
the ``anthropic`` client turns into its typed exceptions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Anthropic's error types by HTTP status (its docs' table); other 4xx are request errors,
# other 5xx its generic api_error.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: list[dict[str, object]] | None = None  # set for an SSE stream, sent one by one
    # Responses and Messages streams name each event (``event: <type>``) and end without
    # chat's ``data: [DONE]``.
    named_events: bool = False


class ApiError(Exception):
    """An error answered in OpenAI's shape; ``code`` is the HTTP status, as llama.cpp does."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def reply(self, *, anthropic: bool = False) -> Reply:
        if anthropic:
            fallback = "api_error" if self.status >= 500 else "invalid_request_error"
            kind = ANTHROPIC_ERROR_TYPES.get(self.status, fallback)
            error = {"type": kind, "message": self.message}
            return json_reply({"type": "error", "error": error}, self.status)
        shaped: dict[str, object] = {"message": self.message, "type": self.kind}
        return json_reply({"error": {**shaped, "code": self.status}}, self.status)


def json_reply(value: object, status: int = 200) -> Reply:
    return Reply(status, json.dumps(value).encode())
