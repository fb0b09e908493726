"""OpenAI's Responses API (``POST /v1/responses``), answered as OpenAI and llama.cpp do."""

from __future__ import annotations

import os
import time

from service.demo_runtime.options import Options
from service.demo_runtime.replies import ApiError, Reply, json_reply
from service.demo_runtime.text import content_words, model_name, reply_pieces


def create(payload: dict[str, object], opts: Options) -> Reply:
    """The reply is one assistant message with one ``output_text`` part holding the demo text.
    Streamed (``"stream": true``), it is OpenAI's event sequence, each event named by its
    ``type`` and numbered by ``sequence_number`` from 0::

        response.created, response.in_progress, response.output_item.added,
        response.content_part.added, response.output_text.delta (one per chunk),
        response.output_text.done, response.content_part.done, response.output_item.done,
        response.completed

    The demo keeps no state: ``previous_response_id`` and ``store`` are accepted and ignored.
    """
    prompt = payload.get("input")
    if not isinstance(prompt, (str, list)):
        raise ApiError(400, "'input' is required and must be a string or a list of items")
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, (str, list)):
        raise ApiError(400, "'instructions' must be a string or a list of items")
    pieces = reply_pieces(opts.chunks)
    text = "".join(pieces)
    item_id = "msg_" + os.urandom(12).hex()
    response = _response(payload, opts)
    usage = _usage(content_words(prompt) + content_words(instructions), len(pieces))
    output = _message(item_id, text)
    done = {**response, "status": "completed", "output": [output]}
    done |= {"completed_at": int(time.time()), "usage": usage}
    if payload.get("stream") is not True:
        return json_reply(done)
    return Reply(events=_events(response, done, output, item_id, pieces), named_events=True)


def _response(payload: dict[str, object], opts: Options) -> dict[str, object]:
    """The response object as first announced: in progress, no output yet."""
    return {
        "id": "resp_" + os.urandom(12).hex(),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "metadata": payload.get("metadata") or {},
        "model": model_name(payload, opts),
        "output": [],
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "previous_response_id": payload.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": payload.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice", "auto"),
        "tools": payload.get("tools") or [],
        "top_p": payload.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": None,
    }


def _part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    content = [_part(text)] if status == "completed" else []
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _usage(prompt: int, completion: int) -> dict[str, object]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _events(
    response: dict[str, object],
    done: dict[str, object],
    output: dict[str, object],
    item_id: str,
    pieces: list[str],
) -> list[dict[str, object]]:
    text = "".join(pieces)
    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": _message(item_id, "", "in_progress"),
        },
        {"type": "response.content_part.added", **at, "part": _part("")},
        *({"type": "response.output_text.delta", **at, "delta": p, "logprobs": []} for p in pieces),
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": _part(text)},
        {"type": "response.output_item.done", "output_index": 0, "item": output},
        {"type": "response.completed", "response": done},
    ]
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]
