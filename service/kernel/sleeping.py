"""Sleep mode: evicting a runtime by putting it to sleep instead of stopping it.

vLLM started with ``--enable-sleep-mode`` (and ``VLLM_SERVER_DEV_MODE=1``) can move its
weights to host memory and free the GPU (``POST /sleep?level=1``), then take them back
in a fraction of a load's time (``POST /wake_up``). For a service with ``sleep: true``
an eviction or idle unload first tries that; it falls back to a stop when the sleep
call fails, host memory is too short to receive the weights, or the sleep frees nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import psutil

from service.adapters import vllm
from service.clock import Clock
from service.devices import DeviceProbe
from service.domain import EventKind, InstanceState
from service.live.events import EventLog
from service.supervisor import wait_settled
from service.units import format_size

if TYPE_CHECKING:
    from service.live.runtimes import ServiceRuntime

S = InstanceState
# Host memory kept free beyond the weights a sleep moves there.
HOST_MARGIN = 1024**3
# A sleep has released the device when the footprint is below this share of before.
RELEASED_SHARE = 0.5


class SleepMode:
    """A sleep is trusted only once the footprint has dropped: vLLM's CPU build answers
    ``/sleep`` with success and keeps every byte (docs/runtimes.md, vLLM). A sleep that frees
    nothing within the settle timeout is undone (``/wake_up``) and the runtime stopped
    instead; that service is not put to sleep again while its command and environment stay
    the same.

    To the scheduler a sleeping service is *stopped* (``InstanceAsleep``): its expected
    peak is no longer charged, and a request loads it again -- a ``Start(wake=True)``,
    which the kernel carries out as a wake. The little device memory a sleeper keeps (its
    CUDA context) stays visible to the device's free-memory ceiling, so admission never
    over-commits because of it. When a sleeper is stopped for good (after its service's
    ``idle_ttl`` of sleep, or first of all when a load waits for memory) is the scheduler's
    decision (``StopSleeper``); this module only carries out sleeping, waking and stopping.
    """

    def __init__(
        self, *, events: EventLog, probe: DeviceProbe, clock: Clock, settle_timeout_s: float
    ) -> None:
        self._events = events
        self._probe = probe
        self._clock = clock
        self._settle_timeout_s = settle_timeout_s
        # Services whose runtime answered a sleep without freeing memory, by launch.
        self._frees_nothing: set[tuple[str, ...]] = set()

    async def try_sleep(self, rt: ServiceRuntime, reason: str) -> bool:
        """Put ``rt`` to sleep and wait for its device memory to drop; False: stop it."""
        if not rt.spec.sleep or rt.client is None:
            return False
        if rt.instance.state not in (S.READY, S.DRAINING):
            return False
        if _launch(rt) in self._frees_nothing:
            return False
        weights = rt.measured.footprint
        available = psutil.virtual_memory().available
        if available < weights + HOST_MARGIN:
            self._events.record(
                EventKind.SLEEP_SKIPPED,
                f"{rt.name}: host memory too short to hold its weights while asleep "
                f"({format_size(available)} available, {format_size(weights)} needed); "
                "stopping it instead",
                service=rt.name,
            )
            return False
        started = time.monotonic()
        if not await vllm.sleep(rt.client, level=1):
            self._events.record(
                EventKind.SLEEP_FAILED,
                f"{rt.name}: the runtime refused to sleep; stopping it instead",
                service=rt.name,
            )
            return False
        if rt.instance.state not in (S.READY, S.DRAINING):
            return False  # it died meanwhile: the supervisor has it
        rt.instance.mark_sleeping(f"asleep instead of stopped: {reason}")
        if not await self._released(rt, weights):
            return await self._undo_sleep(rt, weights, time.monotonic() - started)
        self._events.record(
            EventKind.SLEEP,
            f"{rt.name} is asleep ({reason}); device memory released after "
            f"{time.monotonic() - started:.1f}s",
            service=rt.name,
            data={"weights_bytes": weights, "released": True},
        )
        return True

    async def _undo_sleep(self, rt: ServiceRuntime, weights: int, waited_s: float) -> bool:
        """The runtime said it sleeps but kept its memory: wake it and have it stopped."""
        self._frees_nothing.add(_launch(rt))
        self._events.record(
            EventKind.SLEEP_FAILED,
            f"{rt.name}: the runtime said it was asleep but its memory did not drop below "
            f"{RELEASED_SHARE:.0%} of {format_size(weights)} in {waited_s:.1f}s; stopping "
            "it instead, and stopping rather than sleeping it from now on",
            service=rt.name,
            data={"weights_bytes": weights, "released": False},
        )
        if rt.client is not None:
            await vllm.wake_up(rt.client)
        if rt.instance.state is S.SLEEPING:
            rt.instance.mark_awake("its sleep freed no memory")
        return False

    async def _released(self, rt: ServiceRuntime, before: int) -> bool:
        pid = rt.instance.pid
        if pid is None:
            return True

        async def dropped() -> bool:
            reading = await asyncio.to_thread(self._probe.read, {rt.name: pid})
            memory = reading.instances.get(rt.name)
            return memory is None or memory.device_bytes <= before * RELEASED_SHARE

        return await wait_settled(dropped, clock=self._clock, timeout_s=self._settle_timeout_s)

    async def wake(self, rt: ServiceRuntime, reason: str) -> bool:
        """Wake a sleeper for a request; False: it has to be stopped and loaded afresh."""
        if rt.instance.state is not S.SLEEPING or rt.client is None:
            return False
        started = time.monotonic()
        if not await vllm.wake_up(rt.client):
            self._events.record(
                EventKind.WAKE_FAILED,
                f"{rt.name}: the runtime did not wake; loading it afresh",
                service=rt.name,
            )
            return False
        if rt.instance.state is not S.SLEEPING:
            return False
        self._events.record(
            EventKind.WAKE,
            f"{rt.name} woken in {time.monotonic() - started:.2f}s ({reason})",
            service=rt.name,
        )
        rt.instance.mark_awake(f"woken: {reason}")
        return True

    async def stop_sleeper(self, rt: ServiceRuntime, reason: str) -> None:
        """Stop a sleeping runtime for good (the scheduler already counts it stopped)."""
        if rt.instance.state is S.SLEEPING:
            await rt.instance.stop(reason, timeout_s=rt.exit_grace_s)
            await rt.close_client()


def _launch(rt: ServiceRuntime) -> tuple[str, ...]:
    """What identifies a runtime's behaviour: its service, command and environment."""
    env = (f"{key}={value}" for key, value in sorted(rt.spec.env.items()))
    return (rt.name, *rt.spec.command, "\0", *env)
