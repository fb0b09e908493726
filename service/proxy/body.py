"""What a client's request body says, read just enough to route it: the model it names,
its shape for an incident record, and the body again with another model or fields.

The client's bytes are forwarded as they came; a body is re-encoded only when a service
sets ``upstream_model`` or ``set_params``, or its runtime has an API of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

from service.adapters.base import NativeRoute
from service.errors import InvalidRequest, UnsupportedMediaType

ModelRewrite = Callable[[str], bytes]


def find_model(body: bytes, content_type: str) -> tuple[str, ModelRewrite, dict[str, object]]:
    """The model a request names, a function giving its body with another model, and
    the request's shape (size, max_tokens, prompt length, image size) for incidents."""
    media = content_type.partition(";")[0].strip().lower()
    if media == "multipart/form-data":
        model, rewrite = _form_model(body, content_type)
        return model, rewrite, {"body_bytes": len(body), "multipart": True}
    if media in ("", "application/json") or media.endswith("+json"):
        return _json_model(body)
    raise UnsupportedMediaType(
        f"unsupported content type {media!r}: send application/json, "
        "or multipart/form-data for file uploads"
    )


def _json_model(body: bytes) -> tuple[str, ModelRewrite, dict[str, object]]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string")

    def with_model(name: str) -> bytes:
        # ASCII output: a lone surrogate escaped in the client's JSON cannot become UTF-8.
        return json.dumps({**payload, "model": name}, separators=(",", ":")).encode()

    return model, with_model, request_shape(payload, len(body))


def with_params(body: bytes, params: Mapping[str, object]) -> tuple[bytes, ModelRewrite]:
    """A JSON body with a service's ``set_params`` fields set over the client's.

    The client's bytes are forwarded as they came. A body is re-encoded only when the
    service sets ``upstream_model`` or ``set_params`` for the model, or its runtime has an
    API of its own for the route (piper's ``/synthesize``, reshaped by its adapter): JSON is
    then dumped again with the new model and fields, and a multipart body gets the model
    field's value replaced in place (files are never parsed or copied twice; a find over the
    already-read body locates the field; ``set_params`` applies to JSON bodies only).
    """
    payload = {**json.loads(body), **params}

    def with_model(name: str) -> bytes:
        return json.dumps({**payload, "model": name}, separators=(",", ":")).encode()

    return json.dumps(payload, separators=(",", ":")).encode(), with_model


def reshaped(body: bytes, native: NativeRoute, service: str) -> tuple[bytes, ModelRewrite]:
    """A JSON body in the shape the service's runtime wants (piper's own API); 400 naming
    what that runtime cannot do. Its shape has no model field to rewrite."""
    try:
        runtime_body = json.dumps(native.request(json.loads(body)), separators=(",", ":")).encode()
    except ValueError as exc:
        raise InvalidRequest(f"service {service!r}: {exc}") from None
    return runtime_body, lambda _model: runtime_body


def request_shape(payload: dict[str, object], body_bytes: int) -> dict[str, object]:
    """What an operator needs to know of a request that preceded an out-of-memory."""
    shape: dict[str, object] = {"body_bytes": body_bytes}
    for key in ("max_tokens", "max_completion_tokens", "n", "size", "stream", "user"):
        value = payload.get(key)
        if isinstance(value, int | str | bool):
            shape[key] = value
    prompt = payload.get("messages") or payload.get("prompt") or payload.get("input")
    if prompt is not None:
        shape["prompt_chars"] = text_chars(prompt)
    return shape


def text_chars(value: object, depth: int = 0) -> int:
    """Characters of text in a prompt (strings in nested lists and objects).

    Counted rather than re-encoded: this runs on every request, and serialising the
    whole prompt again cost more than the rest of reading the request."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:  # a prompt is a few levels deep; deeper structure is not text
        return 0
    if isinstance(value, list):
        return sum(text_chars(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return sum(text_chars(item, depth + 1) for item in value.values())
    return 0


_BOUNDARY = re.compile(r';\s*boundary\s*=\s*(?:"([^"]+)"|([^\s;]+))', re.IGNORECASE)
_FIELD_NAME = re.compile(rb';\s*name\s*=\s*(?:"([^"]*)"|([^\s;]*))', re.IGNORECASE)


def _form_model(body: bytes, content_type: str) -> tuple[str, ModelRewrite]:
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise InvalidRequest("multipart/form-data without a boundary")
    boundary = (found.group(1) or found.group(2)).encode("latin-1")
    span = form_field(body, boundary, b"model")
    if span is None:
        raise InvalidRequest("the multipart form field 'model' is required")
    start, end = span
    try:
        model = body[start:end].decode()
    except UnicodeDecodeError:
        raise InvalidRequest("the multipart form field 'model' is not UTF-8 text") from None
    if not model:
        raise InvalidRequest("the multipart form field 'model' must not be empty")

    def with_model(name: str) -> bytes:
        return b"".join((body[:start], name.encode(), body[end:]))

    return model, with_model


def form_field(body: bytes, boundary: bytes, name: bytes) -> tuple[int, int] | None:
    """Where the value of form field ``name`` lies in a multipart body (RFC 7578).

    Only part headers are looked at; each part's content is skipped with one ``find``
    for the next delimiter, so a large file costs a scan, not a copy.
    """
    delimiter = b"--" + boundary
    separator = b"\r\n" + delimiter
    if body.startswith(delimiter):
        pos = 0
    else:  # a preamble before the first delimiter
        pos = body.find(separator)
        if pos < 0:
            raise InvalidRequest("malformed multipart body: no boundary delimiter")
        pos += 2
    while True:
        pos += len(delimiter)
        if body.startswith(b"--", pos):
            return None  # the closing delimiter
        line_end = body.find(b"\r\n", pos)
        head_end = body.find(b"\r\n\r\n", line_end) if line_end >= 0 else -1
        if head_end < 0:
            raise InvalidRequest("malformed multipart body: a part without headers")
        start = head_end + 4
        end = body.find(separator, start)
        if end < 0:
            raise InvalidRequest("malformed multipart body: a part is not closed")
        if _part_name(body[line_end + 2 : head_end]) == name:
            return start, end
        pos = end + 2


def _part_name(head: bytes) -> bytes | None:
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            found = _FIELD_NAME.search(value)
            return None if found is None else (found.group(1) or found.group(2))
    return None
