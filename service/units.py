"""Sizes and durations as people write them in policy files: ``6GiB``, ``512MiB``, ``90s``.

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) are
powers of 1000, as on a drive label. A bare integer is bytes or seconds. Parsing never
guesses: anything else raises ``ValueError`` with a message that says what was expected.
"""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

MIB = 1024**2
GIB = 1024**3
SIZE_HINT = "a size such as 512MiB, 6GiB, 6GB, 1.5GiB or a whole number of bytes"
# Far beyond any device, and inside SQLite's 64-bit integers.
MAX_SIZE = 2**62
# Ten years: longer than any sensible timeout or window, and inside a float's precision.
MAX_DURATION = 10 * 365 * 86400.0
DURATION_HINT = "a duration such as 90s, 10m, 1h, 1h30m or a whole number of seconds"


def parse_size(value: object) -> int:
    """Bytes from an int or a string like ``6GiB``; fractions round down to a byte."""
    if isinstance(value, bool):
        raise ValueError(f"expected {SIZE_HINT}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return _bounded_size(value, value)
    if isinstance(value, float):
        raise ValueError(f"expected {SIZE_HINT}, got {value!r} (write a unit, e.g. 1.5GiB)")
    if not isinstance(value, str):
        raise ValueError(f"expected {SIZE_HINT}, got {type(value).__name__}")
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"expected {SIZE_HINT}, got {value!r}")
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {unit!r} in {value!r}; use KiB, MiB, GiB, KB, MB or GB"
        )
    if unit == "" and "." in number:
        raise ValueError(f"a size without a unit is whole bytes, got {value!r}")
    if len(number) > 30:
        raise ValueError(f"size {_short(value)} is too large (at most {MAX_SIZE} bytes)")
    return _bounded_size(int(float(number) * factor), value)


def _bounded_size(size: int, written: object) -> int:
    if size > MAX_SIZE:
        raise ValueError(f"size {_short(written)} is too large (at most {MAX_SIZE} bytes)")
    return size


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_duration(value: object) -> float:
    """Seconds from an int or a string like ``1h30m``."""
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HINT}, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"duration must be a finite number >= 0, got {value}")
        return _bounded_duration(value, value)
    if not isinstance(value, str):
        raise ValueError(f"expected {DURATION_HINT}, got {type(value).__name__}")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return _bounded_duration(float(text) if len(text) < 30 else math.inf, value)
    pos = 0
    total = 0.0
    for part in _DURATION_PART_RE.finditer(text):
        if part.start() != pos:
            break
        digits = part.group(1)
        total += (float(digits) if len(digits) < 30 else math.inf) * _DURATION_UNITS[part.group(2)]
        pos = part.end()
    if pos != len(text) or not text:
        raise ValueError(f"expected {DURATION_HINT}, got {value!r}")
    return _bounded_duration(total, value)


def _bounded_duration(seconds: float, written: object) -> float:
    if not seconds <= MAX_DURATION:  # also catches inf and numbers past a float
        raise ValueError(f"duration {_short(written)} is too long (at most ten years)")
    return float(seconds)


def format_size(n_bytes: int | float | None) -> str:
    """Human size with binary units, e.g. ``1.5GiB``; ``-`` for unknown."""
    if n_bytes is None:
        return "-"
    value = float(n_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f}{unit}" if unit == "B" else f"{sign}{_trim(value)}{unit}"
        value /= 1024
    return f"{sign}{_trim(value)}TiB"


def format_duration(seconds: float | None) -> str:
    """Compact duration, e.g. ``1h30m``, ``90ms``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{_trim(seconds)}s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _trim(value: float) -> str:
    text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return text[:-2] if text.endswith(".0") else text
