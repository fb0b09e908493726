"""The kernel's effects: how the scheduler's actions become real (docs/architecture.md).

``KernelEffects`` implements ``scheduler.Effects`` for the daemon. Each method returns
at once; slow work (spawning, stopping, waiting for memory to settle, sleeping and
waking) runs in background tasks that report back through ``feed`` with the events the
scheduler expects: ``InstanceReady``, ``InstanceStopped``, ``InstanceAsleep``,
``InstanceBackoff``, ``InstanceFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from service.clock import Clock
from service.devices import DeviceProbe
from service.domain import INSTANCE_FLAGS, EventKind, Flag, InstanceState
from service.errors import RequestRejected
from service.kernel.background import BackgroundTasks
from service.kernel.sleeping import SleepMode
from service.kernel.swap_steps import SwapSteps, ms, now
from service.kernel.takeover import record_sleep, record_spawn
from service.kernel.tickets import Tickets
from service.live.events import EventLog
from service.live.leases import Lease, Waiters
from service.live.runtimes import RuntimeTable, ServiceRuntime, fit_target_for
from service.live.usage import Accounts
from service.memory.doctor import Doctor
from service.memory.release import Comeback
from service.memory.sampling import Sampler
from service.scheduler import (
    Event,
    Grant,
    InstanceAdopted,
    InstanceAsleep,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    Note,
    Reject,
    RequestFinished,
    Resolve,
    Start,
    Stop,
    StopSleeper,
)
from service.store import StoreWriter
from service.supervisor import (
    AdoptedProcess,
    LaunchSpec,
    RuntimeProcess,
    StartFailed,
    wait_settled,
)
from service.supervisor.backoff import LOOP_WINDOW_S
from service.supervisor.launch import FIT_TARGET, free_loopback_port, launch_args, uses_state_dir
from service.swapstate import StateKeeper

S = InstanceState
_PROCESS_GONE = frozenset({S.STOPPED, S.BACKOFF, S.FAILED})


class Feed(Protocol):
    def __call__(self, event: Event) -> None: ...


class KernelEffects:
    """It is also the observer of every instance transition (``on_state``): it records the
    transition, keeps the runtime's record (client, counters, flags, memory watch) in step,
    and tells the scheduler what the transition means. Nothing here decides: where to
    start, what to stop, when to retry, when to wake -- all of that came in the action.
    """

    def __init__(
        self,
        *,
        feed: Feed,
        runtimes: RuntimeTable,
        waiters: Waiters,
        tickets: Tickets,
        sleep: SleepMode,
        doctor: Doctor,
        sampler: Sampler,
        events: EventLog,
        accounts: Accounts,
        writer: StoreWriter,
        probe: DeviceProbe,
        clock: Clock,
        settle_timeout_s: float,
        keeper: StateKeeper,
    ) -> None:
        self._feed = feed
        self._keeper = self.keeper = keeper
        self._steps = SwapSteps(events)
        self._runtimes = runtimes
        self._waiters = waiters
        self._tickets = tickets
        self._sleep = sleep
        self._doctor = doctor
        self._sampler = sampler
        self._events = events
        self._accounts = accounts
        self._writer = writer
        self._probe = probe
        self._clock = clock
        self._settle_timeout_s = settle_timeout_s
        self.tasks = BackgroundTasks()
        # The daemon is closing: an instance that exits is not settled and reported.
        self._closing = False
        runtimes.observe(self.on_state)

    # ------------------------------------------------------------------ Effects

    @property
    def closing(self) -> bool:
        return self._closing

    def begin_closing(self) -> None:
        """The daemon is closing (the orchestrator's shutdown): from now on an instance
        that exits is not settled and reported."""
        self._closing = True

    def start(self, action: Start) -> None:
        rt = self._runtimes[action.service]
        self.tasks.spawn(self._start(rt, action), f"start {rt.name}")

    def drain(self, action: Stop) -> None:
        rt = self._runtimes[action.service]
        if rt.instance.state is S.READY:
            self._steps.begin(rt.name, "drain")
            rt.instance.begin_draining(action.reason)

    def stop(self, action: Stop) -> None:
        rt = self._runtimes[action.service]
        self.tasks.spawn(self._stop(rt, action), f"stop {rt.name}")

    def stop_sleeper(self, action: StopSleeper) -> None:
        rt = self._runtimes.get(action.service)
        if rt is not None:
            self.tasks.spawn(self._stop_sleeper(rt, action.reason), f"stop sleeper {rt.name}")

    def grant(self, action: Grant) -> None:
        waiter = self._waiters.withdraw(action.request_id)
        rt = self._runtimes[action.service]
        if waiter is None or waiter.future.done() or rt.client is None or rt.base_url is None:
            # Nobody can use this grant any more: give the slot straight back.
            self._feed(RequestFinished(action.request_id))
            return
        now = self._clock.monotonic()
        waiter.future.set_result(
            Lease(
                request_id=action.request_id,
                service=rt.name,
                base_url=rt.base_url,
                client=rt.client,
                upstream_model=rt.spec.upstream_model,
                queue_ms=(now - waiter.arrived) * 1000,
                cold_start=waiter.cold,
                caller=waiter.client,
                granted_at=now,
                answered=self._keeper.checking(rt.name),
                first_byte=self._steps.first_answer(rt),
            )
        )

    def reject(self, action: Reject) -> None:
        error = RequestRejected.of(action.code, action.message, retry_after=action.retry_after)
        waiter = self._waiters.refuse(action.request_id, error)
        if waiter is None:
            return
        self._accounts.ended(waiter.service, action.code, client=waiter.client)
        self._events.record(
            EventKind.REJECT,
            f"request of client {waiter.client} refused ({action.code}): {action.message}",
            service=action.service,
            data={"code": action.code, "retry_after": action.retry_after, "client": waiter.client},
        )

    def note(self, action: Note) -> None:
        for victim in action.victims:
            rt = self._runtimes.get(victim)
            if rt is not None:
                rt.placement.evictions += 1
        self._events.record(action.kind, action.message, service=action.service, data=action.data)

    def resolve(self, action: Resolve) -> None:
        self._tickets.answer(action)

    def adopt(
        self,
        rt: ServiceRuntime,
        proc: AdoptedProcess,
        spec: LaunchSpec,
        instance_id: int,
        devices: tuple[int, ...],
    ) -> None:
        """A runtime a previous daemon started becomes the service's instance, ready
        at once (``kernel/takeover.py``); ``on_state`` then tells the scheduler."""
        rt.placement.instance_id = instance_id
        rt.placement.device, rt.placement.devices = devices[0], devices
        self._sampler.process_spawned(rt, proc.pid)
        rt.instance.adopt(proc, spec, f"adopting pid {proc.pid} from a previous vramd")

    # ---------------------------------------------------------- carrying them out

    async def _start(self, rt: ServiceRuntime, action: Start) -> None:
        if rt.instance.state is S.SLEEPING:
            rt.placement.loads += 1
            if action.wake and await self._sleep.wake(rt, action.reason):
                return  # on_state has told the scheduler it is ready
            reason = "could not be woken" if action.wake else "admitted on another device"
            await self._sleep.stop_sleeper(rt, reason)
        devices = action.devices
        self._steps.begin(rt.name, "start")
        self._keeper.spawning(rt)
        fit = self._fit_target(rt, devices)
        args = launch_args(
            rt.name,
            rt.spec,
            port=free_loopback_port(),
            devices=devices,
            runtime_totals=self._runtime_totals(devices),
            placement=self._probe.placement_env(devices),
            state_dir=self._keeper.state_dir(rt.name) if uses_state_dir(rt.spec) else None,
            fit_target_mib=fit,
        )
        rt.placement.device, rt.placement.devices = action.device, devices
        if not action.retry:
            self._sampler.instance_starting(rt)
            rt.placement.loads += 1
            self._events.record(
                EventKind.LOAD,
                f"starting {rt.name} on {_where(devices)} ({action.reason})",
                service=rt.name,
                data={
                    "device": action.device,
                    "devices": list(devices),
                    "argv": args.argv,
                    "port": args.port,
                    "fit_target_mib": list(fit),
                },
            )

        async def spawned(proc: RuntimeProcess) -> None:
            self._steps.mark(rt.name, "spawned")
            self._sampler.process_spawned(rt, proc.pid)
            rt.placement.instance_id = record_spawn(
                self._writer, rt, proc, args.argv, args.port, devices, self._clock.now()
            )

        # A failed start needs nothing here: on_state has told the scheduler (backoff or
        # failed) and recorded why.
        with contextlib.suppress(StartFailed):
            await rt.instance.start(
                args.argv,
                env=args.env,
                cwd=args.cwd,
                port=args.port,
                health_url=args.health_url,
                startup_timeout_s=rt.spec.startup_timeout,
                on_spawned=spawned,
                health_ok=rt.adapter.health_ok,
                ready_line=rt.adapter.ready_line,
                ready_line_final=rt.adapter.ready_line_final,
            )

    def _runtime_totals(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """The total a runtime sees on each device (empty when one is not sampled yet)."""
        reading = self._sampler.last_reading
        seen = {d.index: d.runtime_total for d in reading.devices} if reading else {}
        totals = tuple(seen.get(device, 0) for device in devices)
        return totals if all(totals) else ()

    async def _stop(self, rt: ServiceRuntime, action: Stop) -> None:
        if action.sleepable and rt.spec.sleep and await self._sleep.try_sleep(rt, action.reason):
            self._feed(InstanceAsleep(rt.name))
            return
        marks = self._steps.take(rt.name)
        steps: dict[str, float] = {}
        began = now()
        if "drain" in marks:
            steps["drain_ms"] = ms(marks["drain"], began)
        if rt.spec.state is not None and rt.instance.state in (S.READY, S.DRAINING):
            await self._keeper.save(rt, action.reason)
            steps["save_ms"] = ms(began, now())
        pids = rt.measured.last_pids
        comeback = self._comeback(rt)  # taken while it still runs
        if self._probe.backend != "host":
            rt.placement.departing = dict(rt.measured.device_bytes)
        # Pooled keep-alive connections closed first: llama-server waits ~100 ms at
        # SIGTERM for an idle client connection to go (nothing is in flight by now, or
        # what is has run out of stop_timeout and is cut either way).
        await rt.close_client()
        signalled = now()
        await rt.instance.stop(action.reason, timeout_s=rt.exit_grace_s)
        exited = now()
        await self.settle(rt, pids, comeback)
        steps["stop_ms"] = ms(signalled, exited)
        steps["settle_ms"] = ms(exited, now())
        self._steps.record(rt, "stop", steps)

    async def stop_all(self, reason: str, *, keep_ready: bool = False) -> None:
        """The daemon closes: each runtime saves its state (if it keeps any and has not
        saved already) and stops, all at once; with ``keep_ready``, a ready one is left
        running for the next daemon to adopt instead (nothing to save: it keeps it)."""

        async def one(rt: ServiceRuntime) -> None:
            if keep_ready and await rt.instance.detach("left running for the next vramd"):
                return
            if rt.spec.state is not None and rt.instance.state in (S.READY, S.DRAINING):
                await self._keeper.save(rt, reason)
            await rt.instance.stop(reason, timeout_s=rt.exit_grace_s)

        await asyncio.gather(*(one(rt) for rt in self._runtimes.values()), return_exceptions=True)

    async def _stop_sleeper(self, rt: ServiceRuntime, reason: str) -> None:
        await self._sleep.stop_sleeper(rt, reason)
        self._feed(InstanceStopped(rt.name))
        if rt.retired:
            self._runtimes.drop(rt)

    def _comeback(self, rt: ServiceRuntime) -> Comeback:
        """What the instance's devices must show again after it stops (``memory.release``);
        nothing on the host backend."""
        last = self._sampler.last_reading if self._probe.backend != "host" else None
        return Comeback.expect(rt.name, last)

    async def settle(
        self, rt: ServiceRuntime, pids: tuple[int, ...], comeback: Comeback | None = None
    ) -> None:
        """Report the instance stopped once the probe shows its memory released: its
        pids no longer listed, and (GPU backends) each device's free figure back up by
        what it held there."""
        await rt.close_client()
        comeback = comeback or self._comeback(rt)
        if self._probe.backend != "host" and not rt.placement.departing:
            rt.placement.departing = dict(rt.measured.device_bytes)
        missing: dict[int, int] = {}

        async def released() -> bool:
            nonlocal missing
            if pids:
                held: set[int] = await asyncio.to_thread(self._probe.holding, pids)
                if held:
                    return False
            if not comeback.held:
                return True
            roots = {name: pid for name, pid in self._sampler.roots().items() if name != rt.name}
            missing = comeback.missing(await asyncio.to_thread(self._probe.read, roots))
            return not missing

        timeout = self._settle_timeout_s
        if not await wait_settled(released, clock=self._clock, timeout_s=timeout):
            if missing:
                message = (
                    f"{rt.name}: free memory not back {timeout:g}s after exit "
                    f"({comeback.describe(missing)}); admitting with fresh figures anyway"
                )
            else:
                message = (
                    f"{rt.name}: memory of pids {list(pids)} still held {timeout:g}s after "
                    "exit; admitting with fresh figures anyway"
                )
            data = {"missing_bytes": {str(d): b for d, b in missing.items()}}
            self._events.record(EventKind.SETTLE_TIMEOUT, message, service=rt.name, data=data)
        self._sampler.instance_released(rt)
        rt.placement.departing = {}
        self._feed(InstanceStopped(rt.name))
        if rt.retired:
            self._runtimes.drop(rt)  # removed by a policy apply; now it is gone

    async def _clear_loop_flag(self, rt: ServiceRuntime, ready_at: float) -> None:
        """``crash-looping`` clears once the instance that came up has stayed ready for
        the restart policy's stable run (60 s): it no longer loops."""
        inst = rt.instance
        await self._clock.sleep(inst.stable_after_s)
        if inst.state is S.READY and inst.ready_at == ready_at and not inst.crash_looping:
            self._doctor.clear_flags(rt, {Flag.CRASH_LOOPING}, "ready for a minute")

    # ------------------------------------------------------ instance transitions

    def on_state(self, rt: ServiceRuntime, old: S, new: S, reason: str) -> None:
        """Every instance transition: record it, and tell the scheduler what it means."""
        inst = rt.instance
        self._events.record(
            EventKind.STATE,
            f"{rt.name}: {old} -> {new} ({reason})",
            service=rt.name,
            instance_id=rt.placement.instance_id,
            data={"from": old.value, "to": new.value, "pid": inst.pid, "reason": reason},
        )
        if old is S.BACKOFF and new is S.STARTING:
            rt.placement.restarts += 1
        if S.SLEEPING in (old, new):
            record_sleep(self._writer, rt, asleep=new is S.SLEEPING)
        if new is S.READY:
            self._ready(rt, old)
        elif new is S.SLEEPING:
            self._doctor.end_watch(rt)  # waking starts a new series
        elif new in _PROCESS_GONE and old not in _PROCESS_GONE and not inst.detached:
            self._gone(rt, old, new, reason)

    def _ready(self, rt: ServiceRuntime, old: S) -> None:
        inst = rt.instance
        assert inst.port is not None
        if old is S.STARTING:
            # Flags that describe an instance: this one is new.
            self._doctor.clear_flags(rt, INSTANCE_FLAGS, "a fresh instance")
        if Flag.CRASH_LOOPING in rt.health.flags and inst.ready_at is not None:
            self.tasks.spawn(self._clear_loop_flag(rt, inst.ready_at), f"loop flag {rt.name}")
        rt.open_client(inst.port)
        self._doctor.start_watch(rt)
        if inst.adopted:  # a previous daemon loaded it: nothing to count or restore
            self._feed(InstanceAdopted(rt.name, rt.placement.devices))
            return
        if rt.health.oom_incident is not None:
            self._doctor.verdict(rt, retry_succeeded=True)
        rt.placement.last_load_s = inst.load_s
        if inst.load_s is not None and old is S.STARTING:
            self._accounts.counters.load_done(rt.name, inst.load_s)
        self._sampler.record_ready(rt)
        if old is not S.STARTING:
            self._feed(InstanceReady(rt.name))
        elif rt.spec.state is not None:
            self.tasks.spawn(self._restore_then_ready(rt, now()), f"restore {rt.name}")
        else:
            self._started(rt, now())

    async def _restore_then_ready(self, rt: ServiceRuntime, ready: float) -> None:
        """A fresh instance that keeps state: restore it before the scheduler hears the
        instance is ready, so no request lands in a slot being restored."""
        ready_at = rt.instance.ready_at
        await self._keeper.restore(rt)
        inst = rt.instance
        if inst.state is S.READY and inst.ready_at == ready_at:
            self._started(rt, ready, restore_ms=ms(ready, now()))
        # Else it died or was stopped meanwhile: on_state has said so.

    def _started(self, rt: ServiceRuntime, ready: float, restore_ms: float | None = None) -> None:
        """Tell the scheduler the new instance is ready, then record its start's steps."""
        self._steps.awaiting(rt.name)
        self._feed(InstanceReady(rt.name))
        self._steps.started(rt, ready, restore_ms)

    def _fit_target(self, rt: ServiceRuntime, devices: tuple[int, ...]) -> tuple[int, ...]:
        """``LLAMA_ARG_FIT_TARGET`` for a llama.cpp service; empty for other runtimes, when
        the service sets it, or before the first sample."""
        if rt.adapter.name != "llama.cpp" or FIT_TARGET in rt.spec.env:
            return ()
        reading = self._sampler.last_reading
        free = {d.index: d.free for d in reading.devices} if reading else {}
        starting = [o for o in self._runtimes.values() if o.instance.state is S.STARTING]
        return fit_target_for(rt, devices, free, starting)

    def _gone(self, rt: ServiceRuntime, old: S, new: S, reason: str) -> None:
        inst = rt.instance
        self._doctor.end_watch(rt)
        self._keeper.stopped(rt.name)
        self._steps.forget(rt.name)
        self._sampler.record_exit(rt, reason)
        error = inst.last_error or reason
        if old is S.STARTING and new is not S.STOPPED:
            output = inst.run_output()
            self._doctor.load_failed(rt, error, output=output, retrying=new is S.BACKOFF)
        failure = inst.last_failure
        if new is S.BACKOFF:
            if failure is not None and failure.looping:
                self._doctor.flag(rt, Flag.CRASH_LOOPING, _loop_text(failure.deaths))
            self.tasks.spawn(rt.close_client(), f"close {rt.name}")
            crashed = failure is not None and failure.was_ready
            self._feed(InstanceBackoff(rt.name, error, retry_at=inst.backoff_due, crashed=crashed))
        elif new is S.FAILED:
            if failure is not None and not failure.retry:
                why = f"gave up after {failure.failed_starts} failed starts in a row"
                self._doctor.flag(rt, Flag.CRASH_LOOPING, why)
            self.tasks.spawn(rt.close_client(), f"close {rt.name}")
            self._feed(InstanceFailed(rt.name, error))
        elif old is not S.STOPPING and not self._closing:
            # It left on its own (exited while draining or asleep): settle, then report.
            self.tasks.spawn(self.settle(rt, rt.measured.last_pids), f"settle {rt.name}")


def _loop_text(deaths: int) -> str:
    return f"died {deaths} times within {LOOP_WINDOW_S / 60:g} min after being ready"


def _where(devices: tuple[int, ...]) -> str:
    if len(devices) == 1:
        return f"device {devices[0]}"
    return "devices " + ", ".join(map(str, devices))
