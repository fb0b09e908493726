"""The orchestrator: the single owner of live state (DESIGN section 2).

It feeds events to the pure scheduler (``service.scheduler``) and carries out the plan
each event produces: starting and stopping runtimes through the supervisor, granting or
refusing waiting requests, recording every decision as an event. Nothing else starts or
stops a process or decides who gets memory; the API asks the orchestrator
(``acquire``/``release`` for requests, ``load``/``unload``/``restart`` for operators).

Events are fed one at a time: an event raised while a plan is being carried out (an
instance callback firing synchronously, say) is queued and handled after it, so the
scheduler always sees a consistent order. Slow work (spawning, stopping, waiting for
memory to settle) runs in tasks that report back with further events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy.orm import Session

from service import __version__
from service.adapters import find_oom
from service.clock import Clock
from service.devices import DeviceProbe
from service.doctor import Doctor
from service.domain import INSTANCE_FLAGS, ROUTES_BY_KIND, InstanceState, ProbeReading
from service.errors import (
    InsufficientCapacity,
    InvalidRequest,
    ModelNotFound,
    PolicyError,
    PolicyIssue,
    QueueFull,
    QueueTimeout,
    RequestRejected,
    RuntimeFailed,
    ServiceNotFound,
    WindowClosed,
)
from service.eventlog import EventLog
from service.metrics import Metrics
from service.policy import Policy, diff_policies, load_policy
from service.policy_records import persist_policy, window_conflicts
from service.proxy import Lease
from service.runtimes import ServiceRuntime, free_loopback_port, launch_args
from service.sampling import Sampler
from service.scheduler import (
    Action,
    Event,
    Grant,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    Learned,
    LoadRequested,
    Note,
    PolicyChanged,
    Reject,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    RestartRequested,
    Scheduler,
    Start,
    Stop,
    Tick,
    UnloadRequested,
    rules_from_policy,
)
from service.settings import Settings, refuse_unsafe_bind, server_address
from service.sleeping import SleepMode
from service.store import Store, StoreWriter, queries
from service.supervisor import (
    Instance,
    LogRing,
    OrphanRecord,
    ProcessLauncher,
    RestartPolicy,
    StartFailed,
    SubprocessLauncher,
    reap_orphans,
    wait_settled,
)
from service.tasks import TaskGroup
from service.views import service_view, status_view
from service.watchdog import Liveness, Stall, Watchdog
from service.windows import Windows

log = logging.getLogger("vramd.orchestrator")

S = InstanceState
TICK_S = 0.2
_REJECTIONS: dict[str, type[RequestRejected]] = {
    "queue_full": QueueFull,
    "queue_timeout": QueueTimeout,
    "insufficient_capacity": InsufficientCapacity,
    "window_closed": WindowClosed,
    "runtime_failed": RuntimeFailed,
    "model_not_found": ModelNotFound,
}
_PROCESS_GONE = frozenset({S.STOPPED, S.BACKOFF, S.FAILED})


@dataclass
class _Waiter:
    future: asyncio.Future[Lease]
    service: str
    arrived: float
    cold: bool


class Orchestrator:
    def __init__(
        self,
        *,
        policy: Policy,
        store: Store,
        writer: StoreWriter,
        probe: DeviceProbe,
        clock: Clock,
        settings: Settings,
        launcher: ProcessLauncher | None = None,
    ) -> None:
        self.policy = policy
        self._bind_host = server_address(settings, policy).host
        self._writer = writer
        self.events = EventLog(writer, clock)
        self.metrics = Metrics(self.status, version=__version__, backend=probe.backend)
        self._store = store
        self._probe = probe
        self._clock = clock
        self._settings = settings
        self._launcher = launcher or SubprocessLauncher(clock)
        self._health_http = httpx.AsyncClient(timeout=httpx.Timeout(2.0))
        self.runtimes = {name: self._new_runtime(name) for name in policy.services}
        learned = self._restore_stats()
        rules, device_rule = rules_from_policy(policy)
        self._scheduler = Scheduler(rules, device_rule, learned=learned)
        self._device_rule = device_rule
        self._waiters: dict[str, _Waiter] = {}
        self._pending: deque[Event] = deque()
        self._feeding = False
        self._tasks = TaskGroup()
        self._loops = TaskGroup()
        self._closing = False
        self.sampler = Sampler(self, probe=probe, store=store, writer=writer, clock=clock)
        # Called with each newly installed policy (the app refreshes keys and limits).
        self.policy_listeners: list[Callable[[Policy], None]] = []
        self.doctor = Doctor(
            store=store,
            events=self.events,
            clock=clock,
            settings=settings,
            sampler=self.sampler,
            runtimes=lambda: self.runtimes,
            feed=self.feed,
            nvml=probe.backend == "nvml",
        )
        self.sleep = SleepMode(
            events=self.events,
            probe=probe,
            clock=clock,
            settle_timeout_s=settings.settle_timeout,
        )
        self._last_tick: float | None = None
        self.watchdog = Watchdog(
            stall_after_s=settings.watchdog_stall_s,
            on_stall=self._stall_noticed,
            on_recover=self._stall_ended,
        )
        interval = policy.device.sample_interval
        grace = settings.liveness_grace_s
        self.liveness = Liveness(
            {
                "scheduler ticks": (lambda: self._age(self._last_tick), max(grace / 3, 5 * TICK_S)),
                "memory samples": (
                    lambda: self._age(self.sampler.last_sample_at),
                    max(grace, 5 * interval),
                ),
            }
        )
        self.windows = Windows(self)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Reap what a previous daemon left, take a first sample, start pinned services."""
        await self._reap_orphans()
        await self.sampler.sample_once()
        rules, device_rule = rules_from_policy(self.policy)
        self.events.record(
            "policy",
            f"policy active: {len(rules)} services, backend {self._probe.backend}",
            data={"services": sorted(rules)},
        )
        self.feed(PolicyChanged(rules, device_rule))
        self.windows.start()
        self._loops.spawn(self.sampler.run(), "sampler")
        self._loops.spawn(self._tick_loop(), "ticker")
        self.watchdog.start()

    def begin_shutdown(self) -> None:
        """The daemon got SIGTERM: refuse what waits (and what comes), finish what runs.

        Called as soon as the signal arrives, before the server waits for open
        connections: a request queued behind a load would otherwise hold the shutdown
        until the server gives up on it. Requests already at a runtime (streams
        included) go on to their end; the runtimes stop in ``close``.
        """
        if self._closing:
            return
        self._closing = True
        waiting = list(self._waiters)
        self._refuse_waiters()
        for request_id in waiting:
            self.feed(RequestCancelled(request_id))
        self.events.record(
            "daemon",
            f"shutting down: {len(waiting)} waiting request(s) refused; "
            "requests in flight may finish within their service's stop_timeout",
        )
        self._tasks.spawn(self._drain_for_shutdown(), "shutdown drain")

    async def _drain_for_shutdown(self) -> None:
        """Let each runtime finish what it serves, up to its stop_timeout, then stop it.

        A request at a hung runtime then ends with an error (the runtime is gone)
        instead of holding the whole shutdown until the HTTP server gives up on it.
        """

        async def drain(rt: ServiceRuntime) -> None:
            deadline = self._clock.monotonic() + rt.spec.stop_timeout
            while self._clock.monotonic() < deadline:
                if self._scheduler.service_view(rt.name).in_flight == 0:
                    break
                await self._clock.sleep(0.05)
            await rt.instance.stop("daemon shutting down", timeout_s=rt.spec.stop_timeout)

        known = set(self._scheduler.service_names())
        await asyncio.gather(
            *(drain(rt) for name, rt in self.runtimes.items() if name in known),
            return_exceptions=True,
        )

    def _refuse_waiters(self) -> None:
        for request_id, waiter in list(self._waiters.items()):
            self._waiters.pop(request_id, None)
            if not waiter.future.done():
                waiter.future.set_exception(
                    InsufficientCapacity("vramd is shutting down", retry_after=5)
                )

    async def close(self) -> None:
        """Refuse waiting requests and stop every runtime (SIGTERM, grace, SIGKILL)."""
        self._closing = True
        self.windows.shutdown()
        await self.watchdog.stop()
        await self._loops.cancel_all()
        self._refuse_waiters()
        await asyncio.gather(
            *(
                rt.instance.stop("daemon shutting down", timeout_s=rt.spec.stop_timeout)
                for rt in self.runtimes.values()
            ),
            return_exceptions=True,
        )
        await self._tasks.cancel_all()
        for rt in self.runtimes.values():
            await rt.close_client()
        await self._health_http.aclose()
        self.sampler.flush_counters()
        self.events.record("daemon", "vramd stopped; every runtime was stopped")

    async def _tick_loop(self) -> None:
        while True:
            await self._clock.sleep(TICK_S)
            self.feed(Tick())
            self._last_tick = self._clock.monotonic()
            for rt in self.sleep.overslept(self.runtimes):
                self._end_sleep(rt.name, f"asleep longer than its idle_ttl ({rt.spec.idle_ttl:g}s)")

    def _end_sleep(self, name: str, reason: str) -> None:
        """Stop a sleeper for good (in the background); the scheduler counts it stopped."""
        self.sleep.asleep_since.pop(name, None)
        rt = self.runtimes.get(name)
        if rt is not None:
            self._tasks.spawn(self.sleep.stop_sleeper(rt, reason), f"stop sleeper {name}")

    def _age(self, since: float | None) -> float | None:
        return None if since is None else self._clock.monotonic() - since

    def _stall_noticed(self, stall: Stall) -> None:
        """From the watchdog thread: the loop is blocked, so only queue the row (the
        store writer's thread is not blocked by the loop)."""
        message = (
            f"event loop blocked for {stall.duration:.1f}s: no request, load or stop can "
            f"proceed; the loop is at:\n{stall.where}"
        )
        self.events.persist("watchdog", message)

    def _stall_ended(self, stall: Stall) -> None:
        self.events.record(
            "watchdog-recovered",
            f"event loop ran again after being blocked for {stall.duration:.1f}s",
            data={"blocked_s": stall.duration, "where": stall.where},
        )

    async def _reap_orphans(self) -> None:
        with self._store.session() as session:
            live = queries.live_instances(session)
            records = [
                (row.id, row.service, OrphanRecord(row.pid, row.pgid, row.proc_start_time))
                for row in live
            ]
        if not records:
            return
        results = await asyncio.to_thread(reap_orphans, [r for _, _, r in records])
        now = self._clock.now()

        def write(session: Session) -> None:
            for (instance_id, _, _), result in zip(records, results, strict=True):
                reaped = result.outcome.value == "reaped"
                queries.record_instance_exit(
                    session,
                    instance_id=instance_id,
                    stopped_at=now,
                    exit_code=None,
                    reason="reaped at startup" if reaped else "gone before startup",
                    reaped=reaped,
                )

        self._writer.put(write)
        for (instance_id, service, record), result in zip(records, results, strict=True):
            if result.outcome.value == "reaped":
                self.events.record(
                    "reap",
                    f"killed pid {record.pid} of {service}, left running by a previous vramd",
                    service=service,
                    instance_id=instance_id,
                    data={"pid": record.pid, "pgid": record.pgid},
                )

    # ------------------------------------------------------------- the event pump

    def feed(self, event: Event) -> None:
        """Hand one event to the scheduler and carry out its plan (re-entrant safe)."""
        self._pending.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._pending:
                actions = self._scheduler.handle(self._pending.popleft(), self._clock.monotonic())
                for action in actions:
                    self._act(action)
        finally:
            self._feeding = False

    def _act(self, action: Action) -> None:
        match action:
            case Start():
                rt = self.runtimes[action.service]
                self._tasks.spawn(self._start(rt, action), f"start {rt.name}")
            case Stop(drain=True):
                rt = self.runtimes[action.service]
                if rt.instance.state is S.READY:
                    rt.instance.begin_draining(action.reason)
            case Stop():
                rt = self.runtimes[action.service]
                self._tasks.spawn(
                    self._stop(rt, action.reason, sleepable=action.sleepable), f"stop {rt.name}"
                )
            case Note(kind="wait") if self.sleep.asleep_since:
                # A load waits for memory: sleepers' leftovers are the cheapest to take.
                for name in list(self.sleep.asleep_since):
                    if name != action.service:
                        self._end_sleep(name, f"{action.service} waits for memory")
                self.events.record(
                    action.kind, action.message, service=action.service, data=action.data
                )
            case Grant():
                self._grant(action)
            case Reject():
                self._reject(action)
            case Note():
                if action.kind == "evict":
                    for victim in action.data.get("victims", []):
                        self.runtimes[str(victim)].counters["evictions"] += 1
                self.events.record(
                    action.kind, action.message, service=action.service, data=action.data
                )

    def _grant(self, action: Grant) -> None:
        waiter = self._waiters.pop(action.request_id, None)
        rt = self.runtimes[action.service]
        if waiter is None or waiter.future.done() or rt.client is None or rt.base_url is None:
            # Nobody can use this grant any more: give the slot straight back.
            self.feed(RequestFinished(action.request_id))
            return
        waited = self._clock.monotonic() - waiter.arrived
        waiter.future.set_result(
            Lease(
                request_id=action.request_id,
                service=rt.name,
                base_url=rt.base_url,
                client=rt.client,
                upstream_model=rt.spec.upstream_model,
                queue_ms=waited * 1000,
                cold_start=waiter.cold,
            )
        )

    def _reject(self, action: Reject) -> None:
        waiter = self._waiters.pop(action.request_id, None)
        if waiter is None or waiter.future.done():
            return
        self.metrics.request_done(waiter.service, action.code)
        error = _REJECTIONS.get(action.code, RuntimeFailed)
        waiter.future.set_exception(error(action.message, retry_after=action.retry_after))
        self.events.record(
            "reject",
            f"request refused ({action.code}): {action.message}",
            service=action.service,
            data={"code": action.code, "retry_after": action.retry_after},
        )

    # ------------------------------------------------------------ runtime control

    def _new_runtime(self, name: str) -> ServiceRuntime:
        spec = self.policy.services[name]
        ring = LogRing()
        restart = RestartPolicy(
            max_retries=spec.restart.max_retries,
            backoff_s=spec.restart.backoff,
            max_backoff_s=max(spec.restart.max_backoff, spec.restart.backoff),
        )
        holder: list[ServiceRuntime] = []
        instance = Instance(
            name,
            launcher=self._launcher,
            clock=self._clock,
            http=self._health_http,
            log=ring,
            on_state=lambda inst, old, new, why: self._on_state(holder[0], old, new, why),
            restart_policy=restart,
            restart_gate=lambda inst: self._restart_gate(holder[0]),
        )
        rt = ServiceRuntime(name=name, spec=spec, instance=instance, log=ring)
        holder.append(rt)
        return rt

    async def _start(self, rt: ServiceRuntime, action: Start) -> None:
        if rt.instance.state is S.SLEEPING:
            rt.counters["loads"] += 1
            if rt.device == action.device and await self.sleep.wake(rt, action.reason):
                return  # on_state has told the scheduler it is ready
            await self.sleep.stop_sleeper(rt, "could not be woken where it was admitted")
        ledger = self._scheduler.ledger_view(action.device)
        args = launch_args(
            rt.name,
            rt.spec,
            port=free_loopback_port(),
            device=action.device,
            device_total=ledger.total if ledger else None,
            set_cuda_device=self._probe.backend == "nvml",
        )
        rt.device = action.device
        rt.peak = 0
        rt.counters["loads"] += 1
        self.events.record(
            "load",
            f"starting {rt.name} on device {action.device} ({action.reason})",
            service=rt.name,
            data={"device": action.device, "argv": args.argv, "port": args.port},
        )

        async def spawned(proc: Any) -> None:
            rt.last_pids = (proc.pid,)
            started_at = self._clock.now()
            rt.instance_id = self._writer.put_row(
                "instances",
                lambda session, row_id: queries.record_instance_spawn(
                    session,
                    id=row_id,
                    service=rt.name,
                    pid=proc.pid,
                    pgid=proc.pgid,
                    proc_start_time=proc.proc_start_time,
                    port=args.port,
                    device=action.device,
                    started_at=started_at,
                ),
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
            )

    async def _restart_gate(self, rt: ServiceRuntime) -> bool:
        """Before a retry after an out-of-memory load: wait for the evicted to be gone.

        ``MakeRoom`` asked every instance the load may evict to stop; retrying before
        they have released their memory would fail again for the wrong reason and be
        diagnosed as a capacity shortage.
        """
        if rt.oom_incident is None:
            return True
        going = ("draining", "stopping")  # until their memory has settled
        slowest = max((other.spec.stop_timeout for other in self.runtimes.values()), default=0)
        deadline = self._clock.monotonic() + slowest + self._settings.settle_timeout
        while self._clock.monotonic() < deadline:
            known = set(self._scheduler.service_names())
            if not any(
                self._scheduler.service_view(name).state in going
                for name, other in self.runtimes.items()
                if other is not rt and other.device == rt.device and name in known
            ):
                break
            await self._clock.sleep(0.05)
        return True

    async def _stop(self, rt: ServiceRuntime, reason: str, *, sleepable: bool = False) -> None:
        if sleepable and rt.spec.sleep and await self.sleep.try_sleep(rt, reason):
            self.feed(InstanceStopped(rt.name))  # to the scheduler, a sleeper is stopped
            return
        pids = rt.last_pids
        await rt.instance.stop(reason, timeout_s=rt.spec.stop_timeout)
        await self._settle(rt, pids)

    async def _settle(self, rt: ServiceRuntime, pids: tuple[int, ...]) -> None:
        """Report the instance stopped once the probe shows its memory released."""
        await rt.close_client()

        async def released() -> bool:
            return not pids or not await asyncio.to_thread(self._probe.holding, pids)

        timeout = self._settings.settle_timeout
        if not await wait_settled(released, clock=self._clock, timeout_s=timeout):
            self.events.record(
                "settle-timeout",
                f"{rt.name}: memory of pids {list(pids)} still held {timeout:g}s after exit; "
                "admitting with fresh figures anyway",
                service=rt.name,
            )
        rt.footprint = rt.host_bytes = 0
        self.feed(InstanceStopped(rt.name))
        if rt.name not in self.policy.services and self.runtimes.get(rt.name) is rt:
            del self.runtimes[rt.name]  # removed by a policy apply; now it is gone

    def _on_state(self, rt: ServiceRuntime, old: S, new: S, reason: str) -> None:
        """Every instance transition: record it, and tell the scheduler what it means."""
        inst = rt.instance
        self.events.record(
            "state",
            f"{rt.name}: {old} -> {new} ({reason})",
            service=rt.name,
            instance_id=rt.instance_id,
            data={"from": old.value, "to": new.value, "pid": inst.pid},
        )
        if old is S.BACKOFF and new is S.STARTING:
            rt.counters["restarts"] += 1
        if new is S.READY:
            assert inst.port is not None
            cleared = rt.flags & INSTANCE_FLAGS if old is S.STARTING else set()
            if cleared:
                # Flags describe an instance; this one is new.
                rt.flags -= cleared
                self.events.record(
                    "flag-cleared",
                    f"{rt.name}: {', '.join(sorted(cleared))} cleared by a fresh instance",
                    service=rt.name,
                    data={"flags": sorted(cleared)},
                )
            rt.open_client(inst.port)
            rt.watch = self.doctor.new_watch(rt)
            if rt.oom_incident is not None:
                self.doctor.verdict(rt, retry_succeeded=True)
            rt.last_load_s = inst.load_s
            if inst.load_s is not None and old is S.STARTING:
                self.metrics.load_done(rt.name, inst.load_s)
            self.sampler.record_ready(rt)
            self.feed(InstanceReady(rt.name))
        elif new in _PROCESS_GONE and old not in _PROCESS_GONE:
            rt.watch = None
            self.sampler.record_exit(rt, reason)
            if old is S.STARTING and new is not S.STOPPED:
                self.doctor.load_failed(rt, inst.last_error or reason, retrying=new is S.BACKOFF)
            if new is S.BACKOFF:
                self._tasks.spawn(rt.close_client(), f"close {rt.name}")
                self.feed(InstanceBackoff(rt.name, inst.last_error or reason))
            elif new is S.FAILED:
                if inst.attempt > rt.spec.restart.max_retries:
                    rt.flags.add("crash-looping")
                self._tasks.spawn(rt.close_client(), f"close {rt.name}")
                self.feed(InstanceFailed(rt.name, inst.last_error or reason))
            elif old is not S.STOPPING and not self._closing:
                # It left on its own (exited while draining): settle, then report.
                self._tasks.spawn(self._settle(rt, rt.last_pids), f"settle {rt.name}")

    # -------------------------------------------------------------- policy apply

    def apply_policy(self, text: str, *, source: str, dry_run: bool = False) -> dict[str, Any]:
        """Validate, diff, store as a version, then act (DESIGN section 3).

        Raises ``PolicyError`` (nothing changes) for an invalid text. New services are
        registered (pinned ones start), removed ones drain and stop, services whose
        process would differ restart at once (drained), and everything else
        (priorities, caps, queues, TTLs, windows) takes effect in place.
        """
        policy = load_policy(text)
        unsafe = refuse_unsafe_bind(self._bind_host, policy)
        if unsafe:
            raise PolicyError(
                [
                    PolicyIssue(
                        "server",
                        f"vramd listens on {self._bind_host}, reachable from other machines: "
                        "server.api_keys and server.admin_keys must both stay set",
                    )
                ]
            )
        with self._store.session() as session:
            conflicts = window_conflicts(session, policy=policy)
        if conflicts:
            raise PolicyError(conflicts)
        diff = diff_policies(self.policy, policy)
        result: dict[str, Any] = {
            "dry_run": dry_run,
            "diff": diff.model_dump(mode="json"),
            "lines": diff.lines(),
            "version": None,
            "changed": False,
        }
        if dry_run:
            return result
        with self._store.session() as session:
            version, is_new = persist_policy(
                session, policy=policy, text=text, source=source, now=self._clock.now()
            )
        result.update(version=version, changed=is_new)
        if is_new:
            self._install(policy, diff.added, {c.name for c in diff.changed if c.restart})
            self.events.record(
                "policy",
                f"policy version {version} applied from {source}: " + "; ".join(diff.lines()),
                data={"version": version, "diff": result["diff"]},
            )
        return result

    def _install(self, policy: Policy, added: list[str], restart: set[str]) -> None:
        self.policy = policy
        for listener in self.policy_listeners:
            listener(policy)
        for name in added:
            self.runtimes[name] = self._new_runtime(name)
        for name, rt in list(self.runtimes.items()):
            if name in policy.services:
                rt.spec = policy.services[name]
            elif rt.instance.state is S.SLEEPING:
                self._end_sleep(name, "removed from the policy")
                del self.runtimes[name]
            elif rt.instance.pid is None:
                del self.runtimes[name]  # removed and not running: nothing to drain
        rules, device_rule = rules_from_policy(policy)
        self._device_rule = device_rule
        self.feed(PolicyChanged(rules, device_rule, restart=frozenset(restart)))
        self.windows.reconfigure()

    def reload_policy_file(self) -> None:
        """SIGHUP: apply the policy file again; an invalid file is reported and ignored."""
        path = self._settings.config
        try:
            result = self.apply_policy(path.read_text(encoding="utf-8"), source=str(path))
        except (OSError, UnicodeDecodeError) as exc:
            self.events.record("policy-error", f"SIGHUP: cannot read {path}: {exc}")
        except PolicyError as exc:
            self.events.record(
                "policy-error",
                f"SIGHUP: {path} is invalid; nothing changed: {exc}",
                data={"errors": [issue.as_dict() for issue in exc.issues]},
            )
        else:
            if not result["changed"]:
                self.events.record("policy", f"SIGHUP: {path} unchanged")

    # ------------------------------------------------------------- for the proxy

    def resolve(self, model: str, route: str) -> str:
        """The service that serves ``model``; 404 if none, 400 if it cannot serve ``route``."""
        name = self.policy.service_for_model(model)
        if name is None:
            self.metrics.request_done("", "model_not_found")
            raise ModelNotFound(f"model {model!r} is not served here; see GET /v1/models")
        kind = self.policy.services[name].kind
        if route not in ROUTES_BY_KIND[kind]:
            raise InvalidRequest(f"model {model!r} is a {kind} model and does not serve {route}")
        return name

    async def acquire(
        self,
        service: str,
        *,
        request_id: str | None = None,
        request_info: dict[str, Any] | None = None,
    ) -> Lease:
        """Wait for a slot on a ready instance of ``service`` (loading it if needed).

        ``request_info`` (body size, max_tokens, prompt length, image size) is kept for
        incident records: what the service was asked just before it ran out of memory.
        """
        request_id = request_id or uuid.uuid4().hex
        if self._closing:
            raise InsufficientCapacity("vramd is shutting down", retry_after=5)
        rt = self.runtimes[service]
        if request_info is not None:
            rt.recent_requests.append({"ts": self._clock.now(), **request_info})
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = _Waiter(
            future, service, self._clock.monotonic(), cold=rt.instance.state is not S.READY
        )
        self.feed(RequestArrived(request_id, service))
        try:
            return await future
        except asyncio.CancelledError:
            # The client went away. Withdraw the request; a load others wait for goes on.
            if self._waiters.pop(request_id, None) is not None:
                self.feed(RequestCancelled(request_id))
                self.metrics.request_done(service, "client_gone")
            elif future.done() and not future.cancelled() and future.exception() is None:
                # Granted, but cancelled before the caller saw the lease: give it back.
                self.feed(RequestFinished(request_id))
                self.metrics.request_done(service, "client_gone")
            raise

    def release(self, lease: Lease, *, outcome: str, error: str | None = None) -> None:
        self.metrics.request_done(lease.service, outcome, queue_s=lease.queue_ms / 1000)
        rt = self.runtimes.get(lease.service)
        if rt is not None and outcome in ("ok", "upstream_error", "client_gone"):
            rt.counters["requests_served"] += 1
        self.feed(RequestFinished(lease.request_id))
        if rt is not None and error and outcome == "upstream_error":
            quoted = find_oom(rt.adapter, error)
            if quoted:
                self.doctor.runtime_oom(rt, quoted, source="response")

    def models(self) -> list[dict[str, Any]]:
        out = []
        for name, spec in self.policy.services.items():
            state = self.runtimes[name].instance.state.value
            out += [
                {"id": model, "service": name, "kind": spec.kind.value, "state": state}
                for model in spec.models
            ]
        return out

    # --------------------------------------------------------------- for operators

    def runtime(self, name: str) -> ServiceRuntime:
        rt = self.runtimes.get(name)
        if rt is None:
            raise ServiceNotFound(f"no service named {name!r}")
        return rt

    async def load(self, name: str) -> dict[str, Any]:
        """Load a service (clears ``failed``) and wait until it is ready or refused."""
        rt = self.runtime(name)
        if (
            rt.spec.residency.value == "window-only"
            and name not in self.windows.maintenance.allowed()
        ):
            opens = self.windows.maintenance.next_allowed_at().get(name)
            wait = None if opens is None else max(0.0, opens - self._clock.now())
            raise WindowClosed(
                f"{name} runs only in a maintenance window that allows it; none is open",
                retry_after=wait,
            )
        rt.flags.discard("crash-looping")
        self.events.record("operator", f"load {name} requested", service=name)
        self.feed(LoadRequested(name))
        return await self._until_loaded(rt, loads_before=None)

    async def _until_loaded(
        self, rt: ServiceRuntime, *, loads_before: int | None
    ) -> dict[str, Any]:
        """Wait until ``rt`` is ready (a new instance, if ``loads_before`` is given), or
        refused; return at once when its load has to wait for memory others hold
        (``waiting_for`` says for what: the load still happens when it can)."""
        name = rt.name
        deadline = self._clock.monotonic() + rt.spec.stop_timeout + rt.spec.startup_timeout + 30
        while self._clock.monotonic() < deadline:
            state = rt.instance.state
            view = self._scheduler.service_view(name)
            fresh = loads_before is None or rt.counters["loads"] > loads_before
            if state is S.READY and fresh and view.state == "ready":
                return self.service_view(name)
            if state is S.FAILED:
                raise RuntimeFailed(f"{name} failed to load: {rt.instance.last_error}")
            if view.state == "stopped" and not view.waiting_for_memory and view.error:
                raise InsufficientCapacity(view.error)
            if view.waiting_for is not None and not view.evicting:
                return self.service_view(name)
            await self._clock.sleep(0.05)
        return self.service_view(name)

    async def unload(self, name: str) -> dict[str, Any]:
        """Drain and stop a service (pinned ones stay down until loaded again)."""
        rt = self.runtime(name)
        self.events.record("operator", f"unload {name} requested", service=name)
        if rt.instance.state is S.SLEEPING:
            await self.sleep.stop_sleeper(rt, "unloaded by an operator")
        self.feed(UnloadRequested(name))
        deadline = self._clock.monotonic() + rt.spec.stop_timeout + self._settings.settle_timeout
        while self._clock.monotonic() < deadline + 5:
            if self._scheduler.service_view(name).state in ("stopped", "failed"):
                break
            await self._clock.sleep(0.05)
        return self.service_view(name)

    async def restart(self, name: str) -> dict[str, Any]:
        """A drained restart (DESIGN section 4) and wait for the new instance; a service
        that is not loaded is loaded."""
        rt = self.runtime(name)
        if self._scheduler.service_view(name).state not in ("starting", "ready"):
            return await self.load(name)
        self.events.record("operator", f"restart {name} requested", service=name)
        loads_before = rt.counters["loads"]
        self.feed(RestartRequested(name, "requested by an operator"))
        return await self._until_loaded(rt, loads_before=loads_before)

    def admission(self, name: str) -> dict[str, Any]:
        """What loading ``name`` now would do (``GET /api/services/{name}/admission``)."""
        self.runtime(name)
        return self._scheduler.explain(name, self._clock.monotonic()).as_dict()

    def logs(self, name: str, tail: int) -> list[dict[str, Any]]:
        rt = self.runtime(name)
        return [
            {"ts": line.ts, "stream": line.stream, "text": line.text} for line in rt.log.tail(tail)
        ]

    # ------------------------------------------------------------------- views

    def service_view(self, name: str) -> dict[str, Any]:
        rt = self.runtime(name)
        view = service_view(rt, self._scheduler.service_view(name, self._clock.monotonic()))
        view["memory"] = self.memory_view(name)
        return view

    def memory_view(self, name: str) -> dict[str, Any]:
        """Estimate, learned peak and cap side by side, and the footprint's parts."""
        rt = self.runtime(name)
        watch = rt.watch
        metrics = watch.metrics if watch else None
        return {
            "estimate_bytes": rt.spec.memory.estimate,
            "learned_peak_bytes": rt.learned_peak,
            "cap_bytes": rt.spec.memory.cap,
            "footprint_bytes": rt.footprint,
            "host_bytes": rt.host_bytes,
            "weights_bytes": watch.weights_bytes if watch else None,
            "growth_bytes": watch.growth_bytes() if watch else None,
            "kv_cache_usage_ratio": metrics.kv_cache_usage_ratio if metrics else None,
            "kv_cache_tokens": metrics.kv_cache_tokens if metrics else None,
            "runtime_requests_running": metrics.requests_running if metrics else None,
        }

    def services_view(self) -> list[dict[str, Any]]:
        return [self.service_view(name) for name in self.runtimes]

    def status(self) -> dict[str, Any]:
        return status_view(
            reading=self.sampler.last_reading,
            ledgers=[self._scheduler.ledger_view(d) for d in self._scheduler.devices()],
            headroom=self._device_rule.headroom,
            services=self.services_view(),
        )

    def health(self) -> dict[str, Any]:
        """Liveness for /healthz: periodic work on time, no loop stall, loops alive."""
        reading: ProbeReading | None = self.sampler.last_reading
        live = self.liveness.report()
        problems = list(live["problems"])
        for task in self._loops.failed:
            problems.append(f"{task.get_name()} died: {task.exception()!r}")
        stalled = self.watchdog.stalled_for
        if stalled is not None:
            problems.append(f"event loop blocked for {stalled:.1f}s")
        if self._closing:
            problems.append("shutting down")
        last = self.watchdog.last_stall
        return {
            "ok": not problems,
            "problems": problems,
            "backend": self._probe.backend,
            "degraded": reading.degraded if reading else None,
            "progress_age_s": live["ages_s"],
            "last_stall": {"blocked_s": round(last.duration, 3), "where": last.where}
            if last
            else None,
            "services": {name: rt.instance.state.value for name, rt in self.runtimes.items()},
        }

    # -------------------------------------------------------------- internals

    def _restore_stats(self) -> dict[str, Learned]:
        """Counters and learned figures survive daemon restarts (SQLite); flags describe
        an instance, and every instance of a new daemon is new, so they start clear."""
        learned = {}
        with self._store.session() as session:
            for stats in queries.all_stats(session):
                rt = self.runtimes.get(stats.service)
                if rt is None:
                    continue
                for key in rt.counters:
                    rt.counters[key] = int(getattr(stats, key) or 0)
                rt.learned_peak = stats.learned_peak_bytes
                rt.learned_load_s = stats.learned_load_s
                learned[stats.service] = Learned(stats.learned_peak_bytes, stats.learned_load_s)
        return learned

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def store(self) -> Store:
        return self._store

    @property
    def clock(self) -> Clock:
        return self._clock
