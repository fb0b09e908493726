"""The simulated device: what the runtimes really hold, and when a load runs out of memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.scheduler.rules import share_of

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


class SimBox:
    """The box's devices, and which of them each live runtime is on.

    A runtime's memory ramps linearly from 0 to its true peak over its load time, then stays
    flat until the process exits (``remove``). The device has a fixed ``total`` (None:
    unlimited). Out of memory is decided when a load starts, first come first served: the
    room it has is ``total`` minus what every other live runtime holds or is still ramping
    up to. If its true peak does not fit that room it ramps until it hits the wall and fails
    there, at ``start + load_s * room / true_peak``. (On a real GPU two loads ramping
    together fail in whichever order their allocations race; here the later load fails.)

    The device also integrates memory over time exactly (ramps included), for the
    time-average memory use of a run.

    ``SimBox`` is the box: one ``SimDevice`` per GPU, all of one size. A runtime lives on
    one device, or on several at once (``span``), holding its share of its true peak on
    each; it runs out of memory if any part does, at the first part's wall.
    """

    def __init__(self, count: int, total: int | None) -> None:
        if count < 1:
            raise ValueError("a box has at least one device")
        self.devices = tuple(SimDevice(total) for _ in range(count))
        self.total = total
        self.on: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.devices)

    def place(
        self,
        service: str,
        now: float,
        true_peak: int,
        load_s: float,
        on: Sequence[int] = (0,),
        shares: Sequence[float] = (1.0,),
    ) -> float | None:
        """Start loading ``service`` on devices ``on`` (device i of them holds share i of
        its true peak); None if it fits, else the time its first part fails (OOM)."""
        devices, parts = tuple(on), tuple(shares)
        if len(parts) != len(devices):
            parts = (1.0 / len(devices),) * len(devices)
        self.on[service] = devices
        fails = [
            self.devices[device].place(service, now, share_of(true_peak, parts, i), load_s)
            for i, device in enumerate(devices)
        ]
        failed = [t for t in fails if t is not None]
        return min(failed) if failed else None

    def freeze(self, service: str, now: float) -> None:
        for device in self.on.get(service, ()):
            self.devices[device].freeze(service, now)

    def remove(self, service: str, now: float) -> None:
        for device in self.on.pop(service, ()):
            self.devices[device].remove(service, now)

    def holds(self, service: str) -> bool:
        return service in self.on

    def footprint(self, service: str, now: float) -> int:
        return sum(self.devices[d].footprint(service, now) for d in self.on.get(service, ()))

    def footprints(self, now: float) -> dict[str, int]:
        """Each live runtime's bytes over all its devices, by service name."""
        return {name: self.footprint(name, now) for name in sorted(self.on)}

    def used(self, device: int, now: float) -> int:
        return self.devices[device].used(now)

    def byte_seconds(self, until: float) -> float:
        return sum(device.byte_seconds(until) for device in self.devices)
