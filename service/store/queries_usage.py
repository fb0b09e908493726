"""Usage per client and service, per hour: added to as requests end, summed when read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import UsageHour

SUMMED = ("requests", "tokens_in", "tokens_out", "runtime_s", "images", "audio_s")


def add_usage(session: Session, *, rows: Iterable[Mapping[str, Any]]) -> None:
    """Add each row's figures (``hour``, ``client``, ``service``, the ``SUMMED`` fields,
    ``errors`` by code) to the stored hour, creating it when new."""
    for row in rows:
        key = (row["hour"], row["client"], row["service"])
        stored = session.get(UsageHour, key)
        if stored is None:
            stored = UsageHour(
                hour=key[0], client=key[1], service=key[2], errors={},
                **{name: 0 for name in SUMMED},
            )  # fmt: skip
            session.add(stored)
        for name in SUMMED:
            setattr(stored, name, getattr(stored, name) + row[name])
        errors = dict(stored.errors)
        for code, count in row["errors"].items():
            errors[code] = errors.get(code, 0) + count
        stored.errors = errors  # assigned, not mutated: a JSON column notices assignment
    session.flush()


def usage_since(
    session: Session, *, since: float, client: str | None = None
) -> list[dict[str, Any]]:
    """Every client's use of every service in the hours that end after ``since``, summed
    per (client, service): ``requests``, ``errors`` (and ``errors_by_code``), tokens,
    ``runtime_s``, ``images``, ``audio_s``; sorted by client, then service."""
    query = select(UsageHour).where(UsageHour.hour > since - 3600.0)
    if client is not None:
        query = query.where(UsageHour.client == client)
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in session.scalars(query):
        entry = totals.setdefault(
            (row.client, row.service),
            {"client": row.client, "service": row.service, "errors_by_code": {}}
            | {name: 0 for name in SUMMED},
        )
        for name in SUMMED:
            entry[name] += getattr(row, name)
        for code, count in row.errors.items():
            entry["errors_by_code"][code] = entry["errors_by_code"].get(code, 0) + count
    out = []
    for key in sorted(totals):
        entry = totals[key]
        entry["errors"] = sum(entry["errors_by_code"].values())
        entry["runtime_s"] = round(entry["runtime_s"], 3)
        entry["audio_s"] = round(entry["audio_s"], 3)
        out.append(entry)
    return out
