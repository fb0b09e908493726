"""Ollama requests turned into the OpenAI requests vramd already routes.

Each function takes the JSON body an Ollama client sent and returns a ``Translated``: the
OpenAI client route vramd resolves the model on, the OpenAI body (``model`` is the Ollama
name as given; the proxy rewrites it like any other request), whether the client wants
NDJSON streaming, and the names of the fields vramd ignored, so the listener can log them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidRequest
from service.ollama import fields as f

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
EMBEDDINGS_ROUTE = "/v1/embeddings"

# Top-level fields Ollama documents that have no OpenAI meaning. keep_alive: the policy
# decides residency. template, context: the runtime's own template applies.
_IGNORED_TOP_LEVEL = ("keep_alive", "template", "context", "logprobs", "top_logprobs")


@dataclass(frozen=True)
class Translated:
    route: str
    body: dict[str, object]
    stream: bool
    ignored: tuple[str, ...] = ()
    load_only: bool = False
    unload_only: bool = False

    @property
    def model(self) -> str:
        """The model the client named (every translation checks it is a string)."""
        return str(self.body["model"])


def chat_request(body: object) -> Translated:
    """``/api/chat`` → ``/v1/chat/completions``.

    The choices Ollama's API leaves open:

    - ``/api/generate`` is a chat completion with a system and a user message, because
      Ollama applies the model's template to the prompt and so does a chat route. ``raw``
      (the prompt is already templated) and ``suffix`` (fill-in-the-middle) have no chat
      form: they go to ``/v1/completions`` with ``prompt`` (and OpenAI's ``suffix``). A
      runtime without fill-in-the-middle answers that itself.
    - An empty prompt (or no messages, or no input) is Ollama's idiom for "load the model";
      with ``keep_alive: 0`` it means "unload it". ``load_only`` / ``unload_only`` say so,
      and the listener answers with ``done_reason`` "load" or "unload" without a completion.
      Residency stays the policy's: an unload request unloads nothing.
    - Ollama tool calls carry no ids and tool results name the tool; OpenAI links a result
      to its call by id. Calls get ids here and each tool message takes the id of the
      earliest unanswered call of the same name.
    """
    req = f.require_object(body)
    model = f.require_model(req)
    messages = f.optional_list(req, "messages") or []
    stream = f.wants_stream(req)
    out: dict[str, object] = {"model": model, "messages": _messages(messages)}
    tools = f.optional_list(req, "tools")
    if tools:
        # Ollama's tool definitions are OpenAI's already.
        out["tools"] = [f.require_object(tool, f"tools[{k}]") for k, tool in enumerate(tools)]
    ignored = _ignored_top_level(req)
    f.map_format(req.get("format"), out)
    f.map_think(req.get("think"), out)
    f.map_options(req.get("options"), out, ignored)
    f.stream_fields(stream, out)
    empty = not messages
    return _translated(CHAT_ROUTE, out, stream, ignored, empty, req)


def generate_request(body: object) -> Translated:
    """``/api/generate`` → a chat completion, or a plain completion for raw/suffix."""
    req = f.require_object(body)
    model = f.require_model(req)
    prompt = f.optional_str(req, "prompt") or ""
    system = f.optional_str(req, "system")
    suffix = f.optional_str(req, "suffix")
    images = _images(f.optional_list(req, "images") or [], "images")
    raw = bool(f.optional_bool(req, "raw"))
    stream = f.wants_stream(req)
    ignored = _ignored_top_level(req)
    out: dict[str, object] = {"model": model}
    if raw or suffix:
        route = COMPLETIONS_ROUTE
        out["prompt"] = prompt
        if suffix:
            out["suffix"] = suffix
        # Without a template there is nowhere to put a system prompt or images, and no
        # thinking switch: Ollama drops them in raw mode too.
        ignored += [name for name in ("system", "images", "think") if req.get(name)]
    else:
        route = CHAT_ROUTE
        messages: list[dict[str, object]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": _content(prompt, images)})
        out["messages"] = messages
        f.map_think(req.get("think"), out)
    f.map_format(req.get("format"), out)
    f.map_options(req.get("options"), out, ignored)
    f.stream_fields(stream, out)
    empty = not prompt and not images and not suffix
    return _translated(route, out, stream, ignored, empty, req)


def embed_request(body: object) -> Translated:
    """``/api/embed`` (a string or a list of strings) → ``/v1/embeddings``."""
    req = f.require_object(body)
    model = f.require_model(req)
    raw_input = req.get("input")
    if raw_input is None:
        inputs: list[str] = []
    elif isinstance(raw_input, str):
        inputs = [raw_input] if raw_input else []
    elif isinstance(raw_input, list) and all(isinstance(item, str) for item in raw_input):
        inputs = raw_input
    else:
        raise InvalidRequest("input: must be a string or a list of strings")
    out: dict[str, object] = {"model": model, "input": inputs, "encoding_format": "float"}
    dimensions = req.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise InvalidRequest("dimensions: must be a positive whole number")
        out["dimensions"] = dimensions
    ignored = _ignored_top_level(req)
    # OpenAI has no switch for truncation: the runtime truncates or refuses as it is set up.
    if f.optional_bool(req, "truncate") is not None:
        ignored.append("truncate")
    _ignore_all_options(req, ignored)
    return _translated(EMBEDDINGS_ROUTE, out, False, ignored, not inputs, req)


def embeddings_request(body: object) -> Translated:
    """The legacy ``/api/embeddings`` (one ``prompt``) → ``/v1/embeddings``."""
    req = f.require_object(body)
    model = f.require_model(req)
    prompt = f.optional_str(req, "prompt") or ""
    out: dict[str, object] = {"model": model, "input": [prompt], "encoding_format": "float"}
    ignored = _ignored_top_level(req)
    _ignore_all_options(req, ignored)
    return _translated(EMBEDDINGS_ROUTE, out, False, ignored, not prompt, req)


def _translated(
    route: str,
    out: dict[str, object],
    stream: bool,
    ignored: list[str],
    empty: bool,
    req: dict[str, object],
) -> Translated:
    unload = empty and f.is_unload(req.get("keep_alive"))
    return Translated(
        route=route,
        body=out,
        stream=stream,
        ignored=tuple(ignored),
        load_only=empty and not unload,
        unload_only=unload,
    )


def _ignored_top_level(req: dict[str, object]) -> list[str]:
    return [name for name in _IGNORED_TOP_LEVEL if req.get(name) is not None]


def _ignore_all_options(req: dict[str, object], ignored: list[str]) -> None:
    # An embedding has no sampling: every option is either a load option or meaningless.
    options = req.get("options")
    if options is not None:
        ignored.extend(f"options.{name}" for name in f.require_object(options, "options"))


def _messages(messages: list[Any]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    # Tool calls not yet answered, oldest first, as (id, function name).
    pending: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]."
        msg = f.require_object(message, f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"{where}role: required, a string")
        content = f.optional_str(msg, "content", where) or ""
        images = _images(f.optional_list(msg, "images", where) or [], f"{where}images")
        item: dict[str, object] = {"role": role, "content": _content(content, images)}
        calls = f.optional_list(msg, "tool_calls", where)
        if calls:
            made = [
                _tool_call(call, f"{where}tool_calls[{k}]", i, k) for k, call in enumerate(calls)
            ]
            item["tool_calls"] = [call for call, _ in made]
            pending.extend(key for _, key in made)
        if role == "tool":
            item.update(_tool_result(msg, where, pending, i))
        out.append(item)
    return out


def _tool_call(
    call: object, where: str, i: int, k: int
) -> tuple[dict[str, object], tuple[str, str]]:
    """OpenAI's tool call, and the (id, name) a later tool message answers."""
    c = f.require_object(call, where)
    function = f.require_object(c.get("function"), f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.function.name: required, a string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, dict):
        # OpenAI carries arguments as JSON text, Ollama as an object.
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.function.arguments: must be an object")
    call_id = c.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{i}_{k}"
    function_call = {"name": name, "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function_call}, (call_id, name)


def _tool_result(
    msg: dict[str, object], where: str, pending: list[tuple[str, str]], i: int
) -> dict[str, object]:
    tool_name = f.optional_str(msg, "tool_name", where)
    call_id = f.optional_str(msg, "tool_call_id", where)
    if call_id is None:
        match = next((p for p in pending if p[1] == tool_name), pending[0] if pending else None)
        if match is not None:
            pending.remove(match)
            call_id = match[0]
        else:
            call_id = f"call_{i}"
    else:
        pending[:] = [p for p in pending if p[0] != call_id]
    result: dict[str, object] = {"tool_call_id": call_id}
    if tool_name:
        result["name"] = tool_name
    return result


def _images(images: list[Any], where: str) -> list[str]:
    for k, image in enumerate(images):
        if not isinstance(image, str) or not image:
            raise InvalidRequest(f"{where}[{k}]: must be a base64 string")
    return images


def _content(text: str, images: list[str]) -> str | list[dict[str, object]]:
    """A plain string, or OpenAI content parts when there are images to carry."""
    if not images:
        return text
    parts: list[dict[str, object]] = [{"type": "text", "text": text}] if text else []
    parts.extend({"type": "image_url", "image_url": {"url": _data_uri(img)}} for img in images)
    return parts


# The first base64 characters of each image format's magic bytes.
_IMAGE_PREFIXES = (("/9j/", "image/jpeg"), ("R0lGOD", "image/gif"), ("UklGR", "image/webp"))


def _data_uri(image: str) -> str:
    if image.startswith("data:"):
        return image
    mime = next((m for prefix, m in _IMAGE_PREFIXES if image.startswith(prefix)), "image/png")
    return f"data:{mime};base64,{image}"
