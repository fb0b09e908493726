"""What a request gets back: a ``Reply`` (a body or an SSE stream), or an ``ApiError``.

Errors have OpenAI's shape, with the HTTP status as their ``code`` as llama.cpp does, so
vramd's proxy sees the same error bodies as from a real runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: list[dict[str, Any]] | None = None  # set for an SSE stream, sent one by one


class ApiError(Exception):
    """An error answered in OpenAI's shape; ``code`` is the HTTP status, as llama.cpp does."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def reply(self) -> Reply:
        error = {"message": self.message, "type": self.kind, "code": self.status}
        return json_reply({"error": error}, self.status)


def json_reply(value: object, status: int = 200) -> Reply:
    return Reply(status, json.dumps(value).encode())
