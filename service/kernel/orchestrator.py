"""The orchestrator: the kernel's pump and the single owner of live state.

It feeds events to the pure scheduler one at a time (``scheduler.Pump``) and the
scheduler's actions go to the kernel's ``Effects`` (``service.kernel.effects``). Everything
it needs is built in ``service.app`` and handed in; it builds no helper of its own
(docs/architecture.md, "The kernel's shape").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from service.adapters import find_oom
from service.clock import Clock
from service.contract import (
    ApplyAnswer,
    Explanation,
    LogLine,
    ServiceMemory,
    ServiceStatus,
    Status,
)
from service.domain import EventKind, Flag, InstanceState
from service.errors import (
    ErrorCode,
    HandedOver,
    InsufficientCapacity,
    ModelNotFound,
    PolicyError,
    PolicyIssue,
    ServiceNotFound,
)
from service.health.healthz import Health
from service.kernel import views
from service.kernel.background import BackgroundTasks
from service.kernel.effects import KernelEffects
from service.kernel.policy_reload import reload_policy_file
from service.kernel.routing import RouteTable
from service.kernel.takeover import take_over_previous_daemon
from service.kernel.tickets import Tickets, raise_for
from service.kernel.tuning import AutoTuning
from service.live.events import EventLog
from service.live.leases import Lease, Outcome, Routed, ServedModel, Waiters
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.live.usage import Accounts, AnswerUsage, Usage
from service.maintenance.windows import Windows
from service.memory.doctor import Doctor
from service.memory.sampling import LastReading, Sampler
from service.policy import Policy, diff_policies, load_policy
from service.scheduler import (
    ANONYMOUS,
    TICK_S,
    Event,
    LoadRequested,
    PolicyChanged,
    Pump,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    RestartRequested,
    Scheduler,
    ShutdownRequested,
    Tick,
    UnloadRequested,
    clients_from_policy,
    rules_from_policy,
)
from service.settings import Settings, refuse_unsafe_bind, server_address
from service.store import Store, StoreWriter
from service.store.policy_records import persist_policy, window_conflicts

# Beyond a service's stop and startup timeouts, how long an operator waits for an answer.
OPERATOR_SLACK_S = 30.0


class Orchestrator:
    """What it does itself is what only the owner may do: its lifecycle (take over from a
    previous daemon, start the loops, shut down), applying policies, and answering the API --
    requests get leases (``acquire``/``release``), operators get their loads, unloads and
    restarts answered by the events those cause (``Tickets``), never by polling.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        pump: Pump,
        effects: KernelEffects,
        runtimes: RuntimeTable,
        waiters: Waiters,
        tickets: Tickets,
        sampler: Sampler,
        last: LastReading,
        doctor: Doctor,
        windows: Windows,
        health: Health,
        events: EventLog,
        accounts: Accounts,
        store: Store,
        writer: StoreWriter,
        clock: Clock,
        settings: Settings,
        tuning: AutoTuning,
    ) -> None:
        self.policy = policy
        self.tuning = tuning
        self._routing = RouteTable.of(policy)
        self.runtimes = runtimes
        self.sampler = sampler
        self.doctor = doctor
        self.windows = windows
        self.events = events
        self.accounts = accounts
        self._pump = pump
        self._effects = effects
        self._waiters = waiters
        self._tickets = tickets
        self._last = last
        self._health = health
        self._store = store
        self._writer = writer
        self._clock = clock
        self._settings = settings
        self._bind_host = server_address(settings, policy).host
        self._headroom = rules_from_policy(policy)[1].headroom
        self._loops = BackgroundTasks()
        self._applying = asyncio.Lock()
        # Closing leaves ready runtimes running: asked to, or handed over (``--replace``).
        self.keep_runtimes = settings.keep_runtimes or policy.server.keep_runtimes_on_exit
        self.handing_over = False
        # Called with each newly installed policy (the app refreshes keys and limits).
        self.policy_listeners: list[Callable[[Policy], None]] = []

    @property
    def scheduler(self) -> Scheduler:
        return self._pump.scheduler

    @property
    def store(self) -> Store:
        return self._store

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def failed_tasks(self) -> list[asyncio.Task[Any]]:
        """Background work that ended with an exception (a bug): loops and effects."""
        return [*self._loops.failed, *self._effects.tasks.failed]

    def feed(self, event: Event) -> None:
        """Hand one event to the scheduler and carry out its plan (re-entrant safe)."""
        self._pump.feed(event)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Adopt or reap what a previous daemon left, take a first sample, start pinned
        services."""
        await take_over_previous_daemon(
            store=self._store, writer=self._writer, events=self.events, clock=self._clock,
            runtimes=self.runtimes, http=self.runtimes.http, adopt=self._effects.adopt,
        )  # fmt: skip
        await self.sampler.sample_once()
        rules, device_rule = rules_from_policy(self.policy)
        self.events.record(
            EventKind.POLICY,
            f"policy active: {len(rules)} services, backend {self._health.backend}",
            data={"services": sorted(rules)},
        )
        self.feed(PolicyChanged(rules, device_rule, clients=clients_from_policy(self.policy)))
        self.windows.start()
        self._loops.spawn(self.sampler.run(), "sampler")
        self._loops.spawn(self._tick_loop(), "ticker")
        self._loops.spawn(self.tuning.run(), "tuning")
        self._health.watchdog.start()

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse what waits, let what runs finish (up to each service's
        ``stop_timeout``), then stop everything (``ShutdownRequested``). Called as the
        signal arrives, so no queued request holds the server's graceful wait."""
        if self._effects.closing:
            return
        self._effects.begin_closing()
        if self.keep_runtimes:
            return  # what waits is served or refused as the server closes; nothing stops
        waiting = self._waiters.ids()
        self._waiters.refuse_all("vramd is shutting down", retry_after=5)
        for request_id in waiting:
            self.feed(RequestCancelled(request_id))
        self.events.record(
            EventKind.DAEMON,
            f"shutting down: {len(waiting)} waiting request(s) refused; "
            "requests in flight may finish within their service's stop_timeout",
        )
        self.feed(ShutdownRequested())

    def hand_over(self) -> None:
        """A new daemon serves (``--replace``): what waits goes to it, runtimes stay."""
        self.handing_over = self.keep_runtimes = True
        waiting = self._waiters.ids()
        self._waiters.hand_over_all()
        for request_id in waiting:
            self.feed(RequestCancelled(request_id))

    async def close(self) -> None:
        """Refuse waiting requests and stop every runtime (SIGTERM, grace, SIGKILL)."""
        self._effects.begin_closing()
        self.windows.shutdown()
        await self._health.watchdog.stop()
        await self._loops.cancel_all()
        await self.tuning.close()
        self._waiters.refuse_all("vramd is shutting down", retry_after=5)
        await self._effects.stop_all("daemon shutting down", keep_ready=self.keep_runtimes)
        await self._effects.tasks.cancel_all()
        await self.runtimes.aclose()
        self.sampler.flush_counters()
        self.accounts.usage.store(self._writer)
        left = [rt.name for rt in self.runtimes.values() if rt.instance.detached]
        if left:
            self.events.record(EventKind.DAEMON, f"vramd stopped; left running: {', '.join(left)}")
        else:
            self.events.record(EventKind.DAEMON, "vramd stopped; every runtime was stopped")

    async def _tick_loop(self) -> None:
        while True:
            await self._clock.sleep(TICK_S)
            self.feed(Tick())
            self._health.last_tick = now = self._clock.monotonic()
            self.accounts.usage.store(self._writer, now=now)

    # -------------------------------------------------------------- policy apply

    async def apply_policy(self, text: str, *, source: str, dry_run: bool = False) -> ApplyAnswer:
        """Validate, diff, store as a version, then act (docs/policy.md, "Applying a changed
        policy").

        Raises ``PolicyError`` (nothing changes) for an invalid text. New services are
        registered (pinned ones start), removed ones drain and stop, services whose
        process would differ restart at once (drained), and everything else
        (priorities, caps, queues, TTLs, windows) takes effect in place.
        """
        policy = load_policy(text)
        async with self._applying:  # one apply at a time: each diffs against the last
            return await self._apply(policy, text, source=source, dry_run=dry_run)

    async def _apply(self, policy: Policy, text: str, *, source: str, dry_run: bool) -> ApplyAnswer:
        if refuse_unsafe_bind(self._bind_host, policy):
            message = (
                f"vramd listens on {self._bind_host}, reachable from other machines: "
                "client keys (server.api_keys or server.clients) and server.admin_keys "
                "must both stay set"
            )
            raise PolicyError([PolicyIssue("server", message)])
        with self._store.read() as session:
            conflicts = window_conflicts(session, policy=policy)
        if conflicts:
            raise PolicyError(conflicts)
        diff = diff_policies(self.policy, policy)
        result = ApplyAnswer(
            dry_run=dry_run, diff=diff, lines=diff.lines(), version=None, changed=False
        )
        if dry_run:
            return result
        now = self._clock.now()
        version, is_new = await self._writer.call(
            lambda session: persist_policy(
                session, policy=policy, text=text, source=source, now=now
            )
        )
        result.version, result.changed = version, is_new
        if is_new:
            self._install(policy, diff.added, {c.name for c in diff.changed if c.restart})
            self.events.record(
                EventKind.POLICY,
                f"policy version {version} applied from {source}: " + "; ".join(diff.lines()),
                data={"version": version, "diff": diff.model_dump(mode="json")},
            )
        return result

    def _install(self, policy: Policy, added: list[str], restart: set[str]) -> None:
        self.policy = policy
        self._routing = RouteTable.of(policy)
        self.keep_runtimes = self._settings.keep_runtimes or policy.server.keep_runtimes_on_exit
        for listener in self.policy_listeners:
            listener(policy)
        for name in added:
            self.runtimes.add(name, policy.services[name])
        for name, rt in self.runtimes.items():
            if name in policy.services:
                rt.spec = policy.services[name]
            elif rt.instance.state in (InstanceState.STOPPED, InstanceState.FAILED):
                self.runtimes.drop(rt)  # removed and not running: nothing to drain
            else:
                # Running, asleep or backing off: the scheduler stops it; dropped then.
                rt.retired = True
        rules, device_rule = rules_from_policy(policy)
        self._headroom = device_rule.headroom
        clients = clients_from_policy(policy)
        self.feed(PolicyChanged(rules, device_rule, frozenset(restart), clients))
        self.windows.reconfigure(policy)

    def reload_policy_file(self) -> None:
        """SIGHUP: apply the policy file again, in the background (a signal handler
        cannot wait); an invalid file is reported and ignored."""
        self._loops.spawn(reload_policy_file(self, self._settings.config), "SIGHUP reload")

    # ------------------------------------------------------------- for the proxy

    def resolve(self, model: str, route: str) -> Routed:
        try:
            return self._routing.resolve(model, route)
        except ModelNotFound:
            self.accounts.counters.request_done("", ErrorCode.MODEL_NOT_FOUND)
            raise

    def service_named(self, name: str) -> str:
        if name not in self.policy.services:
            raise ServiceNotFound(f"no service named {name!r}; see GET /api/services")
        return name

    async def acquire(
        self,
        service: str,
        *,
        request_id: str | None = None,
        request_info: dict[str, Any] | None = None,
        client: str = ANONYMOUS,
    ) -> Lease:
        """Wait for a slot on a ready instance of ``service`` (loading it if needed), in
        ``client``'s turn (docs/policy.md, "Fair queues").

        ``request_info`` (body size, max_tokens, prompt length, image size) is kept for
        incident records: what the service was asked just before it ran out of memory.
        """
        request_id = request_id or uuid.uuid4().hex
        if self.handing_over:
            raise HandedOver("a new vramd serves", retry_after=0)
        if self._effects.closing:
            raise InsufficientCapacity("vramd is shutting down", retry_after=5)
        rt = self.runtimes[service]
        if request_info is not None:
            rt.recent_requests.append({"ts": self._clock.now(), **request_info})
        cold = rt.instance.state is not InstanceState.READY
        now = self._clock.monotonic()
        waiter = self._waiters.add(request_id, service, arrived=now, cold=cold, client=client)
        self.feed(RequestArrived(request_id, service, client))
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away. Withdraw the request; a load others wait for goes on.
            future = waiter.future
            if self._waiters.withdraw(request_id) is not None:
                self.feed(RequestCancelled(request_id))
                self.accounts.ended(service, Outcome.CLIENT_GONE, client=client)
            elif future.done() and not future.cancelled() and future.exception() is None:
                # Granted, but cancelled before the caller saw the lease: give it back.
                self.feed(RequestFinished(request_id))
                self.accounts.ended(service, Outcome.CLIENT_GONE, client=client)
            raise

    def release(
        self,
        lease: Lease,
        *,
        outcome: str,
        error: str | None = None,
        status: int | None = None,
        usage: AnswerUsage | None = None,
    ) -> None:
        if outcome == Outcome.NOT_SENT:
            # The proxy asks again for the same request: it is not done, nor was it served.
            self.feed(RequestCancelled(lease.request_id))
            return
        code = f"http_{status}" if outcome == Outcome.UPSTREAM_ERROR and status else outcome
        self.accounts.ended(
            lease.service, code, client=lease.caller, queue_s=lease.queue_ms / 1000,
            runtime_s=self._clock.monotonic() - lease.granted_at, usage=usage,
        )  # fmt: skip
        rt = self.runtimes.get(lease.service)
        if rt is not None and outcome in ("ok", "upstream_error", "client_gone"):
            rt.requests_served += 1
        self.feed(RequestFinished(lease.request_id))
        if rt is not None and error and outcome == "upstream_error":
            quoted = find_oom(rt.adapter, error)
            if quoted:
                self.doctor.runtime_oom(rt, quoted, source="response")

    def models(self) -> list[ServedModel]:
        out = []
        for name, spec in self.policy.services.items():
            state = self.runtimes[name].instance.state.value
            out += [ServedModel(model, name, spec.kind.value, state) for model in spec.models]
        return out

    # --------------------------------------------------------------- for operators

    def runtime(self, name: str) -> ServiceRuntime:
        rt = self.runtimes.get(name)
        if rt is None:
            raise ServiceNotFound(f"no service named {name!r}")
        return rt

    async def load(self, name: str) -> ServiceStatus:
        """Load a service (clears ``failed``) and wait until it is ready, waiting for
        memory (the answer says for what: the load still happens when it can), or
        refused."""
        rt = self.runtime(name)
        self.events.record(EventKind.OPERATOR, f"load {name} requested", service=name)
        self.doctor.clear_flags(rt, {Flag.CRASH_LOOPING}, "an operator's load")
        return await self._ask(rt, lambda ticket: LoadRequested(name, ticket))

    async def unload(self, name: str) -> ServiceStatus:
        """Drain and stop a service (pinned ones stay down until loaded again)."""
        rt = self.runtime(name)
        self.events.record(EventKind.OPERATOR, f"unload {name} requested", service=name)
        return await self._ask(rt, lambda ticket: UnloadRequested(name, ticket))

    async def restart(self, name: str) -> ServiceStatus:
        """A drained restart (docs/policy.md, "Restarts") and wait for the new instance; a
        service that is not loaded is loaded."""
        rt = self.runtime(name)
        if self.scheduler.service_view(name).state not in ("starting", "ready"):
            return await self.load(name)
        self.events.record(EventKind.OPERATOR, f"restart {name} requested", service=name)
        reason = "requested by an operator"
        return await self._ask(rt, lambda ticket: RestartRequested(name, reason, ticket))

    async def _ask(self, rt: ServiceRuntime, event: Callable[[str], Event]) -> ServiceStatus:
        """Feed an operator's event and wait for the scheduler's answer to it."""
        ticket = self._tickets.issue()
        self.feed(event(ticket))
        spec = rt.spec
        timeout = spec.stop_timeout + spec.startup_timeout + self._settings.settle_timeout
        answer = await self._tickets.wait(ticket, timeout_s=timeout + OPERATOR_SLACK_S)
        if answer is not None:
            raise_for(answer)
        return self.service_view(rt.name)

    def admission(self, name: str) -> Explanation:
        """What loading ``name`` now would do (``GET /api/services/{name}/admission``)."""
        self.runtime(name)
        return Explanation.model_validate(
            self.scheduler.explain(name, self._clock.monotonic()).as_dict()
        )

    def logs(self, name: str, tail: int) -> list[LogLine]:
        return [
            LogLine(ts=line.ts, stream=line.stream, text=line.text)
            for line in self.runtime(name).log.tail(tail)
        ]

    # ------------------------------------------------------------------- views

    def service_view(self, name: str) -> ServiceStatus:
        rt, watch = self.runtime(name), self.doctor.watches.get(name)
        view = self.scheduler.service_view(name, self._clock.monotonic())
        return views.service_view(rt, view, watch, self._effects.keeper)

    def memory_view(self, name: str) -> ServiceMemory:
        return views.memory_view(self.runtime(name), self.doctor.watches.get(name))

    def services_view(self) -> list[ServiceStatus]:
        return [self.service_view(name) for name in self.runtimes]

    def status(self) -> Status:
        scheduler = self.scheduler
        return views.status_view(
            reading=self._last.reading,
            ledgers=[scheduler.ledger_view(d) for d in scheduler.devices()],
            headroom=self._headroom,
            services=self.services_view(),
        )

    def node_load(self) -> views.NodeLoad:
        """Queues, residency and KV use, for ``/metrics`` at a router's 20 scrapes a second:
        the kernel's counts and the sampler's figures, nothing asked of a device."""
        return views.node_load(self.runtimes, self.scheduler, self.doctor.watches)

    def client_usage(self) -> dict[tuple[str, str], Usage]:
        """Usage since start of the configured clients (``/metrics``' per-client series)."""
        return self.accounts.usage.of_clients(self.policy.server.client_names)

    def health(self) -> dict[str, Any]:
        """Liveness for /healthz: periodic work on time, no loop stall, loops alive."""
        return self._health.report(failed=self._loops.failed, closing=self._effects.closing)
