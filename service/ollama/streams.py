"""An OpenAI SSE stream turned into Ollama's NDJSON lines, one chunk at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from service.ollama.answers import (
    Timing,
    done_reason,
    error_line,
    rfc3339,
    stats,
    thinking_of,
    tool_calls_out,
)


class ChatStream:
    """The listener feeds each decoded ``data:`` chunk to ``ChatStream.event`` and writes the
    lines it returns; after ``[DONE]`` it writes ``finish()``, the ``done: true`` line with
    the reason, the counts and the durations. Chat chunks (``choices[0].delta``) and plain
    completion chunks (``choices[0].text``, the raw ``/api/generate``) are both understood,
    so the same class serves ``/api/chat`` (``mode="chat"``: a ``message`` per line) and
    ``/api/generate`` (``mode="generate"``: a ``response`` per line).

    Tool calls stream in OpenAI as fragments of JSON text keyed by index; Ollama sends each
    call whole, with object arguments. The fragments are gathered here and the calls emitted
    in one line when the runtime says it has finished (or, if it never says, with the final
    line). The usage arrives in a chunk of its own with no choices (``include_usage``).

    A chunk that carries an ``error`` (llama.cpp sends one when generation fails midway)
    becomes Ollama's ``{"error": ...}`` line and marks the stream failed: the listener ends
    the response there, as Ollama does.

    The clock is injected so the tests give every line a known ``created_at``.
    """

    def __init__(
        self,
        model: str,
        mode: Literal["chat", "generate"] = "chat",
        *,
        start_ns: int,
        load_ns: int = 0,
        queue_ns: int = 0,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.model = model
        self.mode = mode
        self.failed = False
        self._start_ns = start_ns
        self._load_ns = load_ns
        self._queue_ns = queue_ns
        self._clock_ns = clock_ns
        self._first_token_ns: int | None = None
        self._usage: Mapping[str, Any] | None = None
        self._timings: Mapping[str, Any] | None = None
        self._finish_reason: object = None
        # Tool calls being assembled, by their index in the stream.
        self._calls: dict[int, dict[str, object]] = {}

    def event(self, data: Mapping[str, Any]) -> list[dict[str, object]]:
        """The NDJSON lines (none, one or two) that one OpenAI chunk turns into."""
        error = data.get("error")
        if error is not None:
            self.failed = True
            return [error_line(_error_message(error))]
        if isinstance(data.get("usage"), Mapping):
            self._usage = data["usage"]
        if isinstance(data.get("timings"), Mapping):
            self._timings = data["timings"]
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            return []
        choice = choices[0]
        lines: list[dict[str, object]] = []
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            text, thinking = delta.get("content"), thinking_of(delta)
            self._gather_calls(delta.get("tool_calls"))
        else:
            text, thinking = choice.get("text"), None
        text = text if isinstance(text, str) else ""
        if text or thinking:
            self._mark_first_token()
            lines.append(self._line(text, thinking))
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
            calls = self._take_calls()
            if calls:
                lines.append(self._line("", None, calls))
        return lines

    def finish(self) -> dict[str, object]:
        """The last line: ``done: true`` with the reason, the counts and the durations."""
        end_ns = self._clock_ns()
        timing = Timing(
            start_ns=self._start_ns,
            end_ns=end_ns,
            load_ns=self._load_ns,
            queue_ns=self._queue_ns,
            first_token_ns=self._first_token_ns,
        )
        line = self._line("", None, self._take_calls(), at_ns=end_ns)
        line["done"] = True
        line["done_reason"] = done_reason(self._finish_reason)
        line.update(stats(timing, self._usage, self._timings))
        return line

    def _line(
        self,
        text: str,
        thinking: str | None,
        calls: list[dict[str, object]] | None = None,
        *,
        at_ns: int | None = None,
    ) -> dict[str, object]:
        line: dict[str, object] = {
            "model": self.model,
            "created_at": rfc3339(self._clock_ns() if at_ns is None else at_ns),
        }
        if self.mode == "chat":
            message: dict[str, object] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            line["message"] = message
        else:
            line["response"] = text
            if thinking:
                line["thinking"] = thinking
        line["done"] = False
        return line

    def _mark_first_token(self) -> None:
        if self._first_token_ns is None:
            self._first_token_ns = self._clock_ns()

    def _gather_calls(self, fragments: object) -> None:
        if not isinstance(fragments, list):
            return
        for fragment in fragments:
            if not isinstance(fragment, Mapping):
                continue
            self._mark_first_token()
            index = fragment.get("index")
            index = index if isinstance(index, int) else len(self._calls)
            call = self._calls.setdefault(index, {"name": "", "arguments": ""})
            function = fragment.get("function")
            if isinstance(function, Mapping):
                if isinstance(function.get("name"), str):
                    call["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"] += function["arguments"]

    def _take_calls(self) -> list[dict[str, object]]:
        calls = [
            {"function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(self._calls.items())
        ]
        self._calls.clear()
        return tool_calls_out(calls)


def _error_message(error: object) -> str:
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return str(error["message"])
    return str(error)
