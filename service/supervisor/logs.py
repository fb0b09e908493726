"""A bounded ring of a runtime's output lines.

Runtimes can be chatty (llama.cpp logs every request) and run for weeks, so their output
is kept in a fixed-size ring per instance (docs/operations.md, "Security defaults"):
enough to show an operator the recent past through ``/api/services/{name}/logs`` and to
explain a failed start, never enough to grow the daemon's memory. One overlong line (a
progress bar redrawn with ``\r`` for minutes, a dumped tensor) is cut, not kept whole.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("vramd.supervisor")

Stream = Literal["stdout", "stderr"]

TRUNCATION_MARK = " …[truncated]"


@dataclass(frozen=True, slots=True)
class LogLine:
    seq: int
    ts: float
    stream: Stream
    text: str


class LogRing:
    """The last ``max_lines`` lines, each at most ``max_line_bytes`` bytes of UTF-8.

    Only ever touched from the event loop (the process protocol appends from loop
    callbacks), so no lock is needed.
    """

    def __init__(self, max_lines: int = 2000, max_line_bytes: int = 8192) -> None:
        if max_lines < 1 or max_line_bytes < 64:
            raise ValueError("a log ring needs max_lines >= 1 and max_line_bytes >= 64")
        self.max_lines = max_lines
        self.max_line_bytes = max_line_bytes
        self._lines: deque[LogLine] = deque(maxlen=max_lines)
        self._next_seq = 0
        self._listeners: list[Callable[[LogLine], None]] = []

    def __len__(self) -> int:
        return len(self._lines)

    def mark(self) -> int:
        """The sequence number the next appended line will get."""
        return self._next_seq

    def append(self, stream: Stream, text: str, *, ts: float) -> None:
        line = LogLine(self._next_seq, ts, stream, self._fit(text))
        self._lines.append(line)
        self._next_seq += 1
        for listener in tuple(self._listeners):
            try:
                listener(line)
            except Exception:
                # A listener's bug must not break the pipe the line came from.
                logger.exception("log listener failed")

    def listen(self, listener: Callable[[LogLine], None]) -> Callable[[], None]:
        """Call ``listener`` with every line appended from now on; returns the call that
        stops it. Listeners run inside ``append``, on the event loop: keep them light."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def tail(self, n: int, *, since: int = 0) -> list[LogLine]:
        """The last ``n`` lines (both streams), oldest first, numbered ``since`` or later."""
        if n <= 0:
            return []
        picked: list[LogLine] = []
        for line in reversed(self._lines):
            if line.seq < since or len(picked) == n:
                break
            picked.append(line)
        picked.reverse()
        return picked

    def stderr_tail(self, n: int = 5, *, since: int = 0) -> str:
        """The last ``n`` non-blank stderr lines joined by newlines: what ``last_error`` quotes."""
        picked: list[str] = []
        for line in reversed(self._lines):
            if line.seq < since or len(picked) == n:
                break
            if line.stream == "stderr" and line.text.strip():
                picked.append(line.text.strip())
        picked.reverse()
        return "\n".join(picked)

    def _fit(self, text: str) -> str:
        raw = text.encode("utf-8", errors="replace")
        if len(raw) <= self.max_line_bytes:
            return text
        keep = self.max_line_bytes - len(TRUNCATION_MARK.encode())
        # errors="ignore" drops a multi-byte character cut in half at the boundary.
        return raw[:keep].decode("utf-8", errors="ignore") + TRUNCATION_MARK


class LineSplitter:
    """Bytes from one pipe in, complete lines into the ring out.

    Output arrives in arbitrary chunks; a line is appended when its newline arrives (or
    at ``flush``, when the pipe closes). A line longer than the ring allows is appended
    once, cut, and the rest of it up to the next newline is dropped, so a runtime that
    never prints a newline cannot grow the buffer. Bytes are decoded as UTF-8 with
    replacement: a runtime's binary garbage must not break the supervisor.
    """

    def __init__(self, stream: Stream, ring: LogRing, now: Callable[[], float]) -> None:
        self._stream: Stream = stream
        self._ring = ring
        self._now = now
        self._buf = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\n")) >= 0:
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            if self._discarding:
                self._discarding = False  # the end of a line already appended cut
            else:
                self._emit(line)
        limit = self._ring.max_line_bytes
        if len(self._buf) > limit:
            if not self._discarding:
                # One byte past the limit, so the ring sees it is too long and marks it.
                self._emit(bytes(self._buf[: limit + 1]))
                self._discarding = True
            self._buf.clear()

    def flush(self) -> None:
        if self._buf and not self._discarding:
            self._emit(bytes(self._buf))
        self._buf.clear()
        self._discarding = False

    def _emit(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        self._ring.append(self._stream, text, ts=self._now())
