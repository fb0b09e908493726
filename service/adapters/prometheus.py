"""Prometheus text exposition: the parser the adapters read runtimes' ``/metrics`` with.

``parse_samples`` turns a scrape into ``Sample`` values, ``parse_prometheus`` folds them
into the ``raw`` mapping ``RuntimeMetrics`` keeps, and ``MetricSamples`` answers the
lookups an adapter's ``parse_metrics`` makes ("the first of these names present").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple


class Sample(NamedTuple):
    """One sample line: metric name, its labels (sorted), and the value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def key(self) -> str:
        """``name{a="x",b="y"}`` with labels sorted; just ``name`` without labels."""
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}"


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _parse_labels(line: str, pos: int) -> tuple[tuple[tuple[str, str], ...], int] | None:
    """Labels starting after the ``{`` at ``pos``; returns them and the index past ``}``."""
    labels: dict[str, str] = {}
    end = len(line)
    while True:
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == "}":
            return tuple(sorted(labels.items())), pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            return None
        key = match.group()
        pos = match.end()
        while pos < end and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 1] != "=":
            return None
        pos += 1
        while pos < end and line[pos] in " \t":
            pos += 1
        if line[pos : pos + 1] != '"':
            return None
        pos += 1
        chars: list[str] = []
        while True:
            if pos >= end:
                return None
            char = line[pos]
            if char == "\\" and pos + 1 < end:
                chars.append(_UNESCAPE.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                chars.append(char)
                pos += 1
        labels[key] = "".join(chars)
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == ",":
            pos += 1
        elif pos >= end or line[pos] != "}":
            return None


def _parse_float(token: str) -> float | None:
    # Python's float() also takes "1_000" and "infinity"; harmless extras for a reader.
    try:
        return float(token)
    except ValueError:
        return None


def _parse_line(line: str) -> Sample | None:
    match = _NAME.match(line)
    if not match:
        return None
    name = match.group()
    pos = match.end()
    labels: tuple[tuple[str, str], ...] = ()
    if line[pos : pos + 1] == "{":
        parsed = _parse_labels(line, pos + 1)
        if parsed is None:
            return None
        labels, pos = parsed
    rest = line[pos:]
    if not rest[:1].isspace():
        return None
    # value [timestamp] [# exemplar]   (the exemplar is OpenMetrics, after " # ")
    tokens = rest.split("#", 1)[0].split()
    if not tokens or len(tokens) > 2:
        return None
    value = _parse_float(tokens[0])
    if value is None or (len(tokens) == 2 and _parse_float(tokens[1]) is None):
        return None
    return Sample(name, labels, value)


def parse_samples(text: str) -> list[Sample]:
    """Every well-formed sample in ``text``, in order; a repeated series keeps its last value.

    Comments, ``# HELP``/``# TYPE``/``# EOF`` lines and anything unparsable are skipped.

    Why not ``prometheus_client.parser``: it stops at the first malformed line (a generator
    that raises, so every sample after it is lost), it renames a counter's samples to
    ``<name>_total`` when the runtime wrote them without the suffix (llama.cpp's
    ``llamacpp:n_tokens_max``, TEI's ``te_request_count``), and on the recorded pages in
    ``tests/fixtures/adapters`` it takes two to seven times as long as this parser.

    The parser is deliberately forgiving: a scrape that contains one malformed line still
    yields every other sample, because a missing KV-cache figure is better than none at all.
    Metric names may contain colons (``vllm:kv_cache_usage_perc``), as the format allows.
    """
    series: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        sample = _parse_line(line)
        if sample is not None:
            series.pop((sample.name, sample.labels), None)
            series[(sample.name, sample.labels)] = sample
    return list(series.values())


def fold(samples: Iterable[Sample]) -> dict[str, float]:
    """Per metric name the sum over its label sets, plus each labelled series by its key."""
    out: dict[str, float] = {}
    totals: dict[str, float] = {}
    for sample in samples:
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        if sample.labels:
            out[sample.key] = sample.value
    out.update(totals)
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text → ``{name: sum over label sets, 'name{labels}': value, ...}``.

    Sums follow Prometheus: a NaN in any label set makes the name's sum NaN. Never raises
    on malformed input; it skips the line.
    """
    return fold(parse_samples(text))


class MetricSamples:
    """Lookups over one scrape, for ``parse_metrics``: first metric name present wins.

    Runtimes renamed their metrics across releases, so each lookup takes the known names
    newest first and uses the first one the scrape contains.
    """

    def __init__(self, samples: Iterable[Sample]) -> None:
        self._by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            self._by_name.setdefault(sample.name, []).append(sample)

    @classmethod
    def parse(cls, text: str) -> MetricSamples:
        return cls(parse_samples(text))

    def series(self, *names: str) -> list[Sample]:
        """The samples of the first of ``names`` present (finite values only)."""
        for name in names:
            found = [s for s in self._by_name.get(name, ()) if math.isfinite(s.value)]
            if found:
                return found
        return []

    def total(self, *names: str) -> float | None:
        """Sum over label sets (e.g. requests of several engines), or ``None``."""
        found = self.series(*names)
        return sum(s.value for s in found) if found else None

    def mean(self, *names: str) -> float | None:
        """Mean over label sets: for ratios, where a sum over engines would exceed 1."""
        found = self.series(*names)
        return sum(s.value for s in found) / len(found) if found else None

    def raw(self) -> Mapping[str, float]:
        return MappingProxyType(fold(s for group in self._by_name.values() for s in group))
