"""Sizes and durations as written in policy files (docs/policy.md): parsing and display."""

from __future__ import annotations

import math

import pytest

from service.units import format_duration, format_size, parse_duration, parse_size

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (1, 1),
        (6 * GiB, 6 * GiB),
        ("0", 0),
        ("512", 512),
        ("512B", 512),
        ("1KiB", KiB),
        ("512MiB", 512 * MiB),
        ("6GiB", 6 * GiB),
        ("2TiB", 2 * TiB),
        ("1KB", 1000),
        ("600MB", 600 * 1000**2),
        ("6GB", 6 * 1000**3),
        ("1TB", 1000**4),
        ("1.5GiB", 1536 * MiB),
        ("0.5KiB", 512),
        ("0.3KiB", 307),  # fractions round down to a whole byte
        ("6gib", 6 * GiB),
        ("6GIB", 6 * GiB),
        ("6gb", 6 * 1000**3),
        ("6 GiB", 6 * GiB),
        ("  512MiB  ", 512 * MiB),
        (" 1.5 GiB ", 1536 * MiB),
    ],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, "must not be negative"),
        ("-5MiB", "expected a size"),
        (True, "got True"),
        (False, "got False"),
        (1.5, "write a unit"),
        ("1.5", "whole bytes"),
        ("6XB", "unknown size unit 'XB'"),
        ("6 G", "unknown size unit 'G'"),
        ("", "expected a size"),
        ("   ", "expected a size"),
        ("GiB", "expected a size"),
        ("6 Gi B", "expected a size"),
        ("six GiB", "expected a size"),
        (None, "got NoneType"),
        ([6, "GiB"], "got list"),
        ({"estimate": "6GiB"}, "got dict"),
    ],
)
def test_parse_size_rejects(value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_size(value)
    assert fragment in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0.0),
        (120, 120.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("120", 120.0),
        ("2.5", 2.5),
        ("90s", 90.0),
        ("2.5s", 2.5),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("1d", 86400.0),
        ("500ms", 0.5),
        ("1s500ms", 1.5),
        ("10M", 600.0),
        (" 90s ", 90.0),
    ],
)
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("1x", "expected a duration"),
        ("h1", "expected a duration"),
        ("1h 30m", "expected a duration"),
        ("10 minutes", "expected a duration"),
        ("", "expected a duration"),
        ("  ", "expected a duration"),
        ("-5", "expected a duration"),
        ("-5s", "expected a duration"),
        (-5, "must be a finite number >= 0"),
        (-0.5, "must be a finite number >= 0"),
        (math.inf, "must be a finite number >= 0"),
        (math.nan, "must be a finite number >= 0"),
        (True, "got True"),
        (None, "got NoneType"),
        (["1h"], "got list"),
    ],
)
def test_parse_duration_rejects(value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_duration(value)
    assert fragment in str(excinfo.value)


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        (None, "-"),
        (0, "0B"),
        (512, "512B"),
        (1023, "1023B"),
        (KiB, "1KiB"),
        (1536, "1.5KiB"),
        (150 * MiB, "150MiB"),
        (600 * MiB, "600MiB"),
        (1536 * MiB, "1.5GiB"),
        (6 * GiB, "6GiB"),
        (TiB, "1TiB"),
        (2048 * TiB, "2048TiB"),
        (-GiB, "-1GiB"),
    ],
)
def test_format_size(n_bytes: int | None, expected: str) -> None:
    assert format_size(n_bytes) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (None, "-"),
        (0, "0ms"),
        (0.5, "500ms"),
        (0.042, "42ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59, "59s"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "1d"),
        (90061, "1d1h1m1s"),
    ],
)
def test_format_duration(seconds: float | None, expected: str) -> None:
    assert format_duration(seconds) == expected


@pytest.mark.parametrize(
    "n_bytes", [0, 512, KiB, 1536, 200 * MiB, 600 * MiB, 1536 * MiB, 6 * GiB, 12 * GiB, TiB]
)
def test_format_size_round_trips(n_bytes: int) -> None:
    assert parse_size(format_size(n_bytes)) == n_bytes


@pytest.mark.parametrize("seconds", [0.5, 1, 1.5, 30, 90, 600, 3600, 5400, 86400, 90061])
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["512MiB", "6GiB", "1.5GiB", "1TiB"])
def test_parse_size_round_trips(text: str) -> None:
    assert format_size(parse_size(text)) == text


@pytest.mark.parametrize("text", ["500ms", "90s", "10m", "1h", "1h30m", "1d"])
def test_parse_duration_round_trips(text: str) -> None:
    assert format_duration(parse_duration(text)) == {"90s": "1m30s"}.get(text, text)
