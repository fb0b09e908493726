"""Cron lines and time zones as values: parsed, checked, and asked for their next firing."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def cron_trigger(expression: str, timezone: str = "UTC") -> CronTrigger:
    """A five-field cron line as an APScheduler trigger, with cron's weekday numbers.

    APScheduler numbers weekdays from Monday = 0; cron from Sunday = 0 (7 too). Handing
    ``30 3 * * 0`` to ``CronTrigger.from_crontab`` would fire on Mondays, so the weekday
    field is translated to names first. Raises ``ValueError`` for a malformed line.
    Like APScheduler (and unlike Vixie cron), a restricted day-of-month AND day-of-week
    must both match.

    A maintenance window recurs on a five-field cron line in an IANA time zone. Both the
    policy (which must reject a bad line with a message naming it) and the maintenance jobs
    (which must fire on it) read the line here, so they cannot disagree about what it means.
    APScheduler's ``CronTrigger`` does the calendar arithmetic; a trigger is a plain value
    that holds no scheduler, no job and no event loop, so this module is safe for the
    policy and anything that imports it.
    """
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(
            f"cron must have five fields (minute hour day month weekday), got {expression!r}"
        )
    minute, hour, day, month, weekday = fields
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=cron_weekdays(weekday),
        timezone=ZoneInfo(timezone),
    )


def cron_weekdays(field: str) -> str:
    """Cron's weekday field (0/7 = Sunday, names, ranges, steps) as APScheduler names."""
    days: set[int] = set()
    for part in field.lower().split(","):
        span, _, step_text = part.partition("/")
        step = _number(step_text, 1, 7) if step_text else 1
        if step < 1:
            raise ValueError(f"invalid weekday step in {field!r}")
        if span == "*":
            first, last = 0, 6
        else:
            start, _, end = span.partition("-")
            first = _weekday(start, field)
            last = _weekday(end, field) if end else (6 if step_text else first)
            if last < first:  # e.g. 5-0: Friday to Sunday (cron writes Sunday as 7 too)
                last += 7
        days.update(d % 7 for d in range(first, last + 1, step))
    return ",".join(_WEEKDAYS[d] for d in sorted(days))


def _weekday(text: str, field: str) -> int:
    if text in _WEEKDAYS:
        return _WEEKDAYS.index(text)
    day = _number(text, 0, 7)
    if day < 0:
        raise ValueError(f"invalid weekday {text!r} in {field!r} (use 0-7 or sun..sat)")
    return day


def _number(text: str, low: int, high: int) -> int:
    return int(text) if text.isdigit() and low <= int(text) <= high else -1


def check_cron(expression: str) -> None:
    """Raise ``ValueError`` unless ``expression`` is a valid five-field cron line."""
    try:
        cron_trigger(expression)
    except ValueError as exc:
        message = str(exc)
        if message.startswith("cron must have"):
            raise
        raise ValueError(f"invalid cron {expression!r}: {message}") from None


def check_timezone(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a time zone this machine knows."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as UTC)") from None


def next_fire_time(expression: str, timezone: str, since: float) -> float | None:
    """Epoch seconds of the line's first firing at or after ``since``; None if it never does."""
    start = datetime.fromtimestamp(since, UTC)
    fire = cron_trigger(expression, timezone).get_next_fire_time(None, start)
    return float(fire.timestamp()) if fire is not None else None
