"""Traces: one request per JSON line, ``{"t", "model", "duration_s", "stream"}``.

``t`` is seconds from the start of the trace, ``duration_s`` the time the runtime needs to
serve the request once it has a slot (its service time). Lines are sorted by ``t`` on
load; blank lines are skipped. Request ids are ``r<line index>`` in sorted order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceRequest:
    id: str
    t: float
    model: str
    duration_s: float
    stream: bool = False


def parse_trace(lines: Iterable[str]) -> list[TraceRequest]:
    raw: list[tuple[float, str, float, bool]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            t, model = float(item["t"]), str(item["model"])
            duration = float(item["duration_s"])
            stream = bool(item.get("stream", False))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"trace line {number}: {exc!r}: {line.strip()[:120]}") from None
        if t < 0 or duration < 0:
            raise ValueError(f"trace line {number}: negative t or duration_s")
        raw.append((t, model, duration, stream))
    raw.sort(key=lambda r: r[0])
    return [TraceRequest(f"r{i}", t, m, d, s) for i, (t, m, d, s) in enumerate(raw)]


def load_trace(path: str | Path) -> list[TraceRequest]:
    with open(path, encoding="utf-8") as fh:
        return parse_trace(fh)


def dump_trace(requests: Iterable[TraceRequest]) -> str:
    """The JSONL text of ``requests`` (times to the millisecond), as the generator writes."""
    lines = [
        json.dumps(
            {
                "t": round(r.t, 3),
                "model": r.model,
                "duration_s": round(r.duration_s, 3),
                "stream": r.stream,
            },
            separators=(",", ":"),
        )
        for r in requests
    ]
    return "".join(line + "\n" for line in lines)
