"""Budget arithmetic: how many bytes each device can still hand out (docs/operations.md).

The formula: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.domain import DeviceReading
from service.scheduler.rules import DeviceRule

# How long the memory of an instance that stopped may still read as foreign.
RECENT_STOP_S = 10.0


@dataclass(frozen=True, slots=True)
class Holding:
    """One resident instance's figures on a device."""

    service: str
    charge: int
    measured: int

    @property
    def growth(self) -> int:
        """What the instance may still grow into: bytes charged but not yet measured."""
        return max(0, self.charge - self.measured)


@dataclass(frozen=True, slots=True)
class LedgerView:
    """One device's accounting, as the API and ``vramd ps`` show it."""

    device: int
    total: int
    used: int
    free: int
    foreign: int
    headroom: int
    budget: int
    charges: Mapping[str, int]
    held: int
    available: int


def budget_of(reading: DeviceReading, rule: DeviceRule) -> int:
    """What vramd may hand out on the device, never below zero."""
    ceiling = reading.total if rule.budget_limit is None else min(rule.budget_limit, reading.total)
    return max(0, min(ceiling, reading.total - reading.foreign) - rule.headroom)


def available_of(
    reading: DeviceReading,
    rule: DeviceRule,
    holdings: Iterable[Holding],
    *,
    released: int = 0,
    held: int = 0,
) -> int:
    """``available(D)`` as in the module docstring; negative when overcommitted."""
    items = list(holdings)
    by_budget = budget_of(reading, rule) - sum(h.charge for h in items)
    by_free = reading.free + released - sum(h.growth for h in items)
    return min(by_budget, by_free) - held


class Ledger:
    """The latest probe figures per device, and the arithmetic over them.

    The ledger does not know which instances exist: the scheduler passes their holdings
    in, so the one record of instance state stays in the scheduler core.
    """

    def __init__(self, rule: DeviceRule) -> None:
        self.rule = rule
        self._readings: dict[int, DeviceReading] = {}
        self._released: dict[int, int] = {}
        self._stops: list[tuple[float, int, int]] = []  # (when, device, bytes charged)

    def sample(self, devices: Iterable[DeviceReading]) -> None:
        """Take a new probe sample; it supersedes every release credit."""
        self._readings = {d.index: d for d in devices}
        self._released = {}

    def release(self, device: int, measured: int) -> None:
        """An instance on ``device`` stopped holding ``measured`` bytes since the sample."""
        if device in self._readings and measured > 0:
            self._released[device] = self._released.get(device, 0) + measured

    def stopped(self, device: int, charged: int, now: float) -> None:
        """An instance charged ``charged`` bytes on ``device`` stopped at ``now``."""
        self._stops = [s for s in self._stops if now - s[0] < RECENT_STOP_S]
        self._stops.append((now, device, charged))

    def recently_stopped(self, device: int, now: float) -> int:
        """Bytes our instances held on ``device`` when they stopped, lately."""
        return sum(b for at, d, b in self._stops if d == device and now - at < RECENT_STOP_S)

    def devices(self) -> tuple[int, ...]:
        """Sampled devices the policy lets vramd use, in index order."""
        allowed = self.rule.gpus
        return tuple(sorted(i for i in self._readings if allowed is None or i in allowed))

    def reading(self, device: int) -> DeviceReading | None:
        return self._readings.get(device)

    def budget(self, device: int) -> int:
        reading = self._readings.get(device)
        return 0 if reading is None else budget_of(reading, self.rule)

    def available(self, device: int, holdings: Iterable[Holding], held: int = 0) -> int:
        reading = self._readings.get(device)
        if reading is None:
            return 0
        released = self._released.get(device, 0)
        return available_of(reading, self.rule, holdings, released=released, held=held)

    def view(self, device: int, holdings: Iterable[Holding], held: int = 0) -> LedgerView | None:
        reading = self._readings.get(device)
        if reading is None:
            return None
        items = list(holdings)
        return LedgerView(
            device=device,
            total=reading.total,
            used=reading.used,
            free=reading.free,
            foreign=reading.foreign,
            headroom=self.rule.headroom,
            budget=budget_of(reading, self.rule),
            charges={h.service: h.charge for h in sorted(items, key=lambda h: h.service)},
            held=held,
            available=self.available(device, items, held),
        )
