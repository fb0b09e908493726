"""``Comeback``: the settle barrier waits for a stopped instance's free memory to return."""

from __future__ import annotations

from service.domain import DeviceSnapshot, InstanceMemory, ProbeReading
from service.memory.release import SLACK_BYTES, Comeback

GiB = 1024**3


def reading(free: dict[int, int], **instances: dict[int, int]) -> ProbeReading:
    devices = tuple(DeviceSnapshot(d, 24 * GiB, 24 * GiB - f, f) for d, f in free.items())
    memory = {
        name: InstanceMemory(sum(on.values()), 0, (1,), per_device=on)
        for name, on in instances.items()
    }
    return ProbeReading("nvml", devices, memory)


BEFORE = reading({0: 4 * GiB, 1: 10 * GiB}, big={0: 8 * GiB, 1: 6 * GiB}, other={1: 2 * GiB})


def test_released_once_every_device_of_a_span_has_its_free_memory_back() -> None:
    comeback = Comeback.expect("big", BEFORE)
    assert comeback.held == {0: 8 * GiB, 1: 6 * GiB}
    half = reading({0: 12 * GiB, 1: 10 * GiB}, other={1: 2 * GiB})  # device 1 lags
    assert comeback.missing(half) == {1: 6 * GiB}
    assert "device 1: 0B of 6GiB came back" in comeback.describe(comeback.missing(half))
    assert comeback.missing(reading({0: 12 * GiB, 1: 16 * GiB}, other={1: 2 * GiB})) == {}


def test_another_instance_growing_meanwhile_does_not_hold_the_barrier() -> None:
    comeback = Comeback.expect("big", BEFORE)
    # other grew by 3 GiB on device 1 while big's 6 GiB came back: free rose by 3 only.
    now = reading({0: 12 * GiB, 1: 13 * GiB}, other={1: 5 * GiB})
    assert comeback.missing(now) == {}


def test_a_foreign_process_taking_the_memory_keeps_it_missing() -> None:
    comeback = Comeback.expect("big", BEFORE)
    now = reading({0: 6 * GiB, 1: 16 * GiB}, other={1: 2 * GiB})  # 6 GiB taken on 0
    assert comeback.missing(now) == {0: 6 * GiB}


def test_small_differences_are_forgiven() -> None:
    comeback = Comeback.expect("big", BEFORE)
    now = reading({0: 12 * GiB - SLACK_BYTES, 1: 16 * GiB - 1000}, other={1: 2 * GiB})
    assert comeback.missing(now) == {}


def test_nothing_to_wait_for_without_a_sample_or_a_footprint() -> None:
    assert Comeback.expect("big", None).held == {}
    assert Comeback.expect("absent", BEFORE).held == {}
    idle = reading({0: 4 * GiB}, big={0: 0})
    assert Comeback.expect("big", idle).held == {}


def test_memory_of_an_instance_between_exit_and_settle_is_managed_not_foreign() -> None:
    """The driver still lists a stopped runtime's memory for a moment: counted as
    foreign, it would make a load look as if it could never fit."""
    from service.memory.sampling import with_departing

    lagging = ProbeReading("nvml", (DeviceSnapshot(1, 24 * GiB, 6 * GiB, 18 * GiB, 0),))
    fixed = with_departing(lagging, [{1: 6 * GiB}, {}])
    assert fixed.devices[0].foreign == 0
    assert fixed.devices[0].managed == 6 * GiB
    # Gone from the device already: nothing is invented beyond what is used.
    empty = ProbeReading("nvml", (DeviceSnapshot(1, 24 * GiB, 0, 24 * GiB, 0),))
    assert with_departing(empty, [{1: 6 * GiB}]).devices[0].managed == 0
    assert with_departing(lagging, []) is lagging
