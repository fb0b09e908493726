"""The simulated device: what the runtimes really hold, and when a load runs out of memory.

A runtime's memory ramps linearly from 0 to its true peak over its load time, then stays
flat until the process exits (``remove``). The device has a fixed ``total`` (None:
unlimited). Out of memory is decided when a load starts, first come first served: the
room it has is ``total`` minus what every other live runtime holds or is still ramping
up to. If its true peak does not fit that room it ramps until it hits the wall and fails
there, at ``start + load_s * room / true_peak``. (On a real GPU two loads ramping
together fail in whichever order their allocations race; here the later load fails.)

The device also integrates memory over time exactly (ramps included), for the
time-average memory use of a run.
"""

from __future__ import annotations

from dataclasses import dataclass

# A load with no room at all still takes a moment to find out.
MIN_FAIL_S = 0.05


@dataclass(slots=True)
class Occupant:
    service: str
    t0: float
    t1: float  # ramp end: loaded, or the moment it hits the wall
    bytes: int  # level reached at t1

    def level(self, now: float) -> int:
        if now >= self.t1 or self.t1 <= self.t0:
            return self.bytes if now >= self.t0 else 0
        return int(self.bytes * (now - self.t0) / (self.t1 - self.t0))

    def area(self, until: float) -> float:
        """Byte-seconds held from t0 to ``until``."""
        if until <= self.t0:
            return 0.0
        ramp = self.t1 - self.t0
        if until <= self.t1 and ramp > 0:
            return self.bytes * (until - self.t0) ** 2 / (2 * ramp)
        return self.bytes * ramp / 2 + self.bytes * (until - self.t1)


class SimDevice:
    def __init__(self, total: int | None) -> None:
        self.total = total
        self._live: dict[str, Occupant] = {}
        self._area = 0.0  # byte-seconds of occupants already removed
        self._gone: list[tuple[Occupant, float]] = []

    def place(self, service: str, now: float, true_peak: int, load_s: float) -> float | None:
        """Start loading ``service``; None if it fits, else the time it fails (OOM)."""
        assert service not in self._live, f"{service} is already on the device"
        room = None if self.total is None else self.total - self.committed(but=service)
        if room is None or true_peak <= room:
            self._live[service] = Occupant(service, now, now + load_s, true_peak)
            return None
        reached = max(0, room)
        fail_at = now + max(MIN_FAIL_S, load_s * reached / true_peak if true_peak else 0.0)
        self._live[service] = Occupant(service, now, fail_at, reached)
        return fail_at

    def freeze(self, service: str, now: float) -> None:
        """A load killed part-way stops allocating: it holds what it had reached."""
        occ = self._live.get(service)
        if occ is not None and now < occ.t1:
            occ.bytes, occ.t1 = occ.level(now), now

    def remove(self, service: str, now: float) -> None:
        occ = self._live.pop(service, None)
        if occ is not None:
            self._gone.append((occ, now))

    def holds(self, service: str) -> bool:
        return service in self._live

    def committed(self, but: str | None = None) -> int:
        """What live runtimes hold or are ramping up to (the first-come claim)."""
        return sum(o.bytes for name, o in self._live.items() if name != but)

    def footprint(self, service: str, now: float) -> int:
        occ = self._live.get(service)
        return 0 if occ is None else occ.level(now)

    def footprints(self, now: float) -> dict[str, int]:
        return {name: occ.level(now) for name, occ in sorted(self._live.items())}

    def used(self, now: float) -> int:
        return sum(occ.level(now) for occ in self._live.values())

    def byte_seconds(self, until: float) -> float:
        """Memory integrated over [0, until], for time averages."""
        total = sum(occ.area(min(until, gone)) for occ, gone in self._gone)
        return total + sum(occ.area(until) for occ in self._live.values())
