"""The settle barrier's second question: has the device's free memory come back?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.domain import ProbeReading
from service.units import format_size

# Bytes (or this fraction of what was held, if more) that may be missing and still
# count as released.
SLACK_BYTES = 64 * 1024**2
SLACK_FRACTION = 0.05


def _room(reading: ProbeReading, device: int, but: str) -> int | None:
    """``free`` on ``device`` plus what every instance but ``but`` holds there."""
    snapshot = next((d for d in reading.devices if d.index == device), None)
    if snapshot is None:
        return None
    others = sum(
        memory.per_device.get(device, 0) for key, memory in reading.instances.items() if key != but
    )
    return snapshot.free + others


@dataclass(frozen=True, slots=True)
class Comeback:
    """What the devices of one stopped instance must show again.

    ``held``: device -> bytes the instance held there at the last sample; ``before``:
    device -> ``free + other instances`` at that sample.

    A pid leaving NVML's process list is not the last step of a teardown: on some drivers
    and with some allocators (CUDA's IPC pools, a ROCm runtime's deferred frees, a vLLM
    worker the root outlived) the device's ``free`` figure returns later, or never, while no
    listed process holds the memory. Starting the next load on the strength of the list
    alone then fails it with out-of-memory on a device that looked empty. So after a stop
    on a GPU backend the orchestrator also waits until, on every device the instance was
    on, ``free`` has risen by what the instance held there (docs/architecture.md, "Devices,
    and a load on several of them").

    Other instances keep running meanwhile and grow or shrink, which moves ``free`` too.
    The figure compared is therefore ``free + what our other instances hold`` on the
    device, before the stop (the last sample) and now: their growth cancels out, and only
    the stopped instance's release and foreign processes move it. ``SLACK`` forgives the
    rounding of drivers and the small figures that move with any read (a context's
    bookkeeping); past it, the memory is missing, and when the barrier gives up the event
    says how much of it on which device (a foreign process took it, or the driver kept it).

    The host backend is exempt: a process's RAM is back when the kernel reaps it, and
    ``available`` moves with every other program on the machine, page cache included.
    """

    service: str
    held: Mapping[int, int]
    before: Mapping[int, int]

    @classmethod
    def expect(cls, service: str, last: ProbeReading | None) -> Comeback:
        """From the last sample taken while the instance ran (nothing to wait for if
        there is none, or it held nothing)."""
        if last is None or service not in last.instances:
            return cls(service, {}, {})
        held = {d: b for d, b in last.instances[service].per_device.items() if b > 0}
        before = {d: room for d in held if (room := _room(last, d, service)) is not None}
        return cls(service, {d: held[d] for d in before}, before)

    def missing(self, now: ProbeReading) -> dict[int, int]:
        """Device -> bytes not back yet (beyond the slack); empty once all came back."""
        out: dict[int, int] = {}
        for device, held in self.held.items():
            room = _room(now, device, self.service)
            if room is None:
                continue  # the device is no longer read: nothing to wait for there
            short = held - (room - self.before[device])
            if short > max(SLACK_BYTES, held * SLACK_FRACTION):
                out[device] = short
        return out

    def describe(self, missing: Mapping[int, int]) -> str:
        return "; ".join(
            f"device {d}: {format_size(self.held[d] - short)} of {format_size(self.held[d])} "
            "came back"
            for d, short in sorted(missing.items())
        )
