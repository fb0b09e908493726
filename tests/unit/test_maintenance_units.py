"""Cron weekday numbering and windows that are already open when the daemon starts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.maintenance.schedule import Maintenance, OpenWindow, WindowSpec
from service.policy import check_cron
from service.policy.cron import cron_trigger, cron_weekdays, next_fire_time


@pytest.mark.parametrize(
    ("field", "names"),
    [
        ("0", "sun"),
        ("7", "sun"),
        ("1-5", "mon,tue,wed,thu,fri"),
        ("*", "sun,mon,tue,wed,thu,fri,sat"),
        ("*/2", "sun,tue,thu,sat"),
        ("5-0", "sun,fri,sat"),
        ("sat,sun", "sun,sat"),
        ("mon-fri", "mon,tue,wed,thu,fri"),
        ("0-6/3", "sun,wed,sat"),
        ("1,3,5", "mon,wed,fri"),
    ],
)
def test_cron_weekdays_count_from_sunday(field: str, names: str) -> None:
    assert cron_weekdays(field) == names


@pytest.mark.parametrize("field", ["8", "-1", "mon-xyz", "1/0", ""])
def test_bad_weekdays_are_errors(field: str) -> None:
    with pytest.raises(ValueError):
        cron_weekdays(field)


def test_sunday_means_sunday() -> None:
    # 2026-11-29 is a Sunday: "30 3 * * 0" next fires on Sunday 2026-12-06.
    after = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    fire = cron_trigger("30 3 * * 0").get_next_fire_time(None, after)
    assert fire is not None and fire.date().isoformat() == "2026-12-06"
    assert fire.strftime("%A") == "Sunday"


def test_next_fire_time_counts_in_the_window_time_zone() -> None:
    # 03:30 in Paris on Sunday 2026-12-06 (winter time, UTC+1) is 02:30 UTC.
    since = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
    fire = next_fire_time("30 3 * * 0", "Europe/Paris", since)
    assert fire == datetime(2026, 12, 6, 2, 30, tzinfo=UTC).timestamp()
    assert next_fire_time("30 3 * * 0", "Europe/Paris", fire) == fire  # at or after


def test_policy_cron_check_uses_the_same_numbering() -> None:
    check_cron("0 4 * * 7")
    with pytest.raises(ValueError, match="five fields"):
        check_cron("0 4 * *")
    with pytest.raises(ValueError, match="invalid cron"):
        check_cron("0 4 * * 9")


class StoppedClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - unused
        raise AssertionError("not used")


async def test_a_window_in_progress_at_startup_opens_for_what_is_left() -> None:
    # 04:30 on a day whose 04:00 window lasts an hour: open now, closing at 05:00.
    now = datetime(2026, 11, 29, 4, 30, tzinfo=UTC).timestamp()
    opened: list[str] = []
    closed: list[OpenWindow] = []
    maintenance = Maintenance(
        clock=StoppedClock(now),
        on_open=lambda spec, trigger: opened.append(f"{spec.name}:{trigger}"),
        on_close=closed.append,
    )
    windows = [
        WindowSpec(name="nightly", cron="0 4 * * *", duration_s=3600, restart="none", allow=()),
        WindowSpec(name="later", cron="0 6 * * *", duration_s=3600, restart="none", allow=()),
    ]
    maintenance.start(windows)
    try:
        assert opened == ["nightly:startup"]
        assert maintenance.open["nightly"].closes_at == pytest.approx(now + 1800)
        assert "later" not in maintenance.open
    finally:
        maintenance.shutdown()
