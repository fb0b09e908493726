"""Request bodies as the routes read them: a JSON object, or a multipart/form-data form.

Audio and image uploads come as multipart forms; the parser is small because the demo
runtime only needs the fields' names, their text and the files' bytes.
"""

from __future__ import annotations

import json
from email.parser import HeaderParser

from service.demo_runtime.replies import ApiError


def _header_param(header: str, value: str, param: str) -> str | None:
    found = HeaderParser().parsestr(f"{header}: {value}\n\n").get_param(param, header=header)
    return found if isinstance(found, str) else None


def parse_multipart(body: bytes, content_type: str) -> dict[str, object]:
    """Fields of a multipart/form-data body: files as bytes, other fields as text."""
    boundary = _header_param("content-type", content_type, "boundary")
    if not boundary:
        raise ApiError(400, "multipart body without a boundary")
    form: dict[str, object] = {}
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, separator, data = part.partition(b"\r\n\r\n")
        if not separator:
            raise ApiError(400, "malformed multipart body")
        headers = HeaderParser().parsestr(head.decode("utf-8", "replace").strip() + "\n\n")
        name = headers.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        data = data.removesuffix(b"\r\n")  # the CRLF before the next delimiter
        form[name] = data if headers.get_filename() is not None else data.decode("utf-8", "replace")
    return form


def parse_payload(body: bytes, content_type: str) -> dict[str, object]:
    if content_type.lower().startswith("multipart/form-data"):
        return parse_multipart(body, content_type)
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    return value
