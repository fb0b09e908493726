"""The scheduler's books: every service's record, the open requests, the ledger.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from service.domain import EventKind, InstanceState, Residency
from service.errors import ErrorCode
from service.scheduler.actions import (
    Action,
    Answer,
    Grant,
    Note,
    Reject,
    Resolve,
    Stop,
    StopSleeper,
)
from service.scheduler.admission import ClockText, Room
from service.scheduler.fairness import ANONYMOUS, ClientRule, Crowding, Waiter, make_room_for
from service.scheduler.ledger import Holding, Ledger, LedgerView
from service.scheduler.rules import DeviceRule, Learned, ServiceRule
from service.scheduler.state import ServiceState
from service.scheduler.yielding import Tuning, conduct, top_priority

S = InstanceState

# Retry-After for a full queue. The scheduler does not know how long requests take, so it
# says "soon" -- unless the instance is still loading, when nothing moves before it is
# ready and the rest of its learned load time is the honest estimate.
QUEUE_FULL_RETRY_S = 1.0


class Book:
    def __init__(
        self,
        rules: Mapping[str, ServiceRule],
        device_rule: DeviceRule,
        learned: Mapping[str, Learned],
    ) -> None:
        self.ledger = Ledger(device_rule)
        self.services: dict[str, ServiceState] = {}
        self.requests: dict[str, str] = {}  # queued or in-flight request id -> service
        self.granted_at: dict[str, float] = {}  # in-flight request id -> when granted
        self.client_of: dict[str, str] = {}  # in-flight request id -> its client
        self.clients: Mapping[str, ClientRule] = {}  # server.clients, by name
        self.allowed_now: frozenset[str] = frozenset()  # window-only services allowed now
        self.next_open: dict[str, float] = {}
        self.tuning = Tuning()  # what ``yielding: auto`` stands for now
        self.shutting_down = False
        self.now = 0.0
        self.out: list[Action] = []
        # When admission should next look at the loads that wait (see ``run_pass``).
        self.next_wake = math.inf
        # Clock times in messages (``Scheduler``'s ``clock_text``).
        self.clock: ClockText | None = None
        self._seq = itertools.count()
        self._order: list[ServiceState] | None = None
        for name in sorted(rules):
            self.add(rules[name], learned.get(name))

    # ------------------------------------------------------------------ queries

    def ordered(self) -> list[ServiceState]:
        """Services by priority (higher first), then name: the order of every sweep.

        Kept until a service is added or forgotten, or a policy changes priorities
        (``reorder``): every event sweeps it several times, and sorting was most of the
        cost of a request's two events. Callers must not change the list.
        """
        if self._order is None:
            self._order = sorted(self.services.values(), key=lambda s: (-s.rule.priority, s.name))
        return self._order

    def reorder(self) -> None:
        """The set of services or their priorities changed: sort again when next asked,
        and resolve each one's ``yielding`` again."""
        self._order = None
        self.retune()

    def retune(self) -> None:
        """Each service's ``Conduct``: its own setting, or ``tuning`` where ``auto``."""
        top = top_priority(s.rule for s in self.services.values() if not s.removed)
        for svc in self.services.values():
            svc.conduct = conduct(svc.rule, self.tuning, top)

    def allowed(self, svc: ServiceState) -> bool:
        """Whether ``svc`` may run now: not removed, not shutting down, and window-only
        only in its window."""
        if svc.removed or self.shutting_down:
            return False
        return svc.rule.residency is not Residency.WINDOW_ONLY or svc.name in self.allowed_now

    def wants(self, svc: ServiceState) -> bool:
        """Whether a load of ``svc`` is asked for and allowed now."""
        return self.allowed(svc) and svc.wants_load

    def claimed(self, svc: ServiceState, victim: str) -> bool:
        """Whether ``victim`` is still resident and claimed by ``svc``'s waiting load."""
        other = self.services.get(victim)
        return other is not None and other.resident and other.claimed_by == svc.name

    def hold(self, svc: ServiceState, device: int) -> int:
        """Bytes a waiting load keeps from others on ``device``: its need there less its
        victims' charges there.

        While the victims are resident their charges still count, so the hold is only
        the part of the need that is free already; once they are gone it is all of it.
        """
        plan = svc.plan
        if plan is None or device not in plan.devices:
            return 0
        pending = sum(
            self.services[v].charge_on(device) for v in plan.victims if self.claimed(svc, v)
        )
        return max(0, plan.need_on(device) - pending)

    def holds(self, device: int, *, but: str | None = None) -> tuple[tuple[str, int], ...]:
        """(service, bytes) of every waiting load's hold on ``device``, ``but`` one."""
        return tuple(
            (s.name, self.hold(s, device))
            for s in sorted(self.services.values(), key=lambda s: s.name)
            if s.plan is not None and device in s.plan.devices and s.name != but
        )

    def held(self, device: int, *, but: str | None = None) -> int:
        return sum(size for _, size in self.holds(device, but=but))

    def holdings(self, device: int) -> list[Holding]:
        return [
            Holding(s.name, s.charge_on(device), s.measured_at(device))
            for s in sorted(self.services.values(), key=lambda s: s.name)
            if s.on(device)
        ]

    def room(self, device: int, svc: ServiceState) -> Room:
        """``device`` as ``svc``'s admission sees it (other loads' holds deducted)."""
        reading = self.ledger.reading(device)
        assert reading is not None, "only sampled devices are candidates"
        holds = self.holds(device, but=svc.name)
        held = sum(size for _, size in holds)
        return Room(
            device=device,
            available=self.ledger.available(device, self.holdings(device), held),
            budget=self.ledger.budget(device),
            held_by_others=held,
            holds=holds,
            total=reading.total,
            foreign=reading.foreign,
            headroom=self.ledger.rule.headroom,
            budget_limit=self.ledger.rule.budget_limit,
            recently_stopped=self.ledger.recently_stopped(device, self.now),
            residents=tuple(
                s.snapshot(self.now, device)
                for s in sorted(self.services.values(), key=lambda s: s.name)
                if s.on(device)
            ),
        )

    def ledger_view(self, device: int) -> LedgerView | None:
        return self.ledger.view(device, self.holdings(device), self.held(device))

    # ------------------------------------------------------------------ moves

    def add(self, rule: ServiceRule, learned: Learned | None) -> None:
        svc = ServiceState(rule=rule, learned=learned or Learned())
        if rule.residency is Residency.WARM and rule.preload:
            svc.load_intent = "preload"
        self.services[rule.name] = svc
        self.reorder()

    def client_rule(self, client: str) -> ClientRule:
        return self.clients.get(client) or ClientRule(client)

    def share_of(self, client: str) -> float:
        rule = self.clients.get(client)
        return rule.share if rule is not None else 1.0

    def held_by(self, svc: ServiceState) -> dict[str, int]:
        """Each client's requests at ``svc``, in flight and waiting."""
        held = svc.queue.by_client()
        for request_id in svc.in_flight:
            client = self.client_of.get(request_id, ANONYMOUS)
            held[client] = held.get(client, 0) + 1
        return held

    def crowding(self, svc: ServiceState, client: str) -> Crowding:
        """How ``svc``'s bound is held, with ``client`` among those present."""
        held = self.held_by(svc)
        present = set(held) | {client}
        rule = svc.rule
        return Crowding(
            held=held,
            bound=rule.max_concurrency + rule.queue_max,
            shares={name: self.share_of(name) for name in sorted(present)},
        )

    def refuse_or_make_room(
        self, svc: ServiceState, client: str
    ) -> tuple[ErrorCode, str, float | None] | None:
        """Why a request of ``client`` may not join ``svc`` (a 429), or None; at a full
        service, a client under its share gets in by refusing the newest waiting request
        of the client furthest over its share (``fairness.make_room_for``)."""
        rule, name = svc.rule, svc.name
        limit = self.client_rule(client).max_concurrency
        if limit is not None:
            mine = self.held_by(svc).get(client, 0)
            if mine >= limit:
                message = (
                    f"client {client} holds {mine} request(s) at {name}, its "
                    f"max_concurrency ({limit}); others are still admitted"
                )
                return ErrorCode.QUEUE_FULL, message, self.share_retry(svc, client)
        if len(svc.in_flight) + len(svc.queue) < rule.max_concurrency + rule.queue_max:
            return None
        full = (
            f"{name} holds {len(svc.in_flight)} request(s) in flight and {len(svc.queue)} "
            f"queued (max_concurrency {rule.max_concurrency} + queue.max {rule.queue_max})"
        )
        if not rule.fair:
            return ErrorCode.QUEUE_FULL, full, self.retry_queue(svc)
        victim, why = make_room_for(svc.queue, client, self.crowding(svc, client))
        if victim is None:
            return ErrorCode.QUEUE_FULL, f"{full}; {why}", self.share_retry(svc, client)
        retry = self.share_retry(svc, victim.client, but=1, joining=client)
        self.reject(svc, victim, ErrorCode.QUEUE_FULL, f"{full}; {why}", retry)
        return None

    def share_retry(
        self, svc: ServiceState, client: str, *, but: int = 0, joining: str | None = None
    ) -> float:
        """Retry-After for a client refused for its own share or limit: when a request it
        sends again would be served, its line and the turns of the others waiting taken
        in order (at least a plain ``queue_full``'s, at most the queue's timeout). Honest,
        it keeps a flooding client from asking again many times a second. ``but``: its
        requests that leave the line now; ``joining``: a client whose request joins now."""
        base = self.retry_queue(svc)
        service_s = svc.habits.service_s
        if service_s is None:
            return base
        shares = self.crowding(svc, joining or client).shares
        waiting = svc.queue.by_client()
        if joining is not None:
            waiting[joining] = waiting.get(joining, 0) + 1
        ahead = max(0, waiting.get(client, 0) - but)
        # Deficit round robin: while ``ahead`` of its requests are served, each other
        # client is served its share's worth of turns, as far as it has requests waiting.
        turns = ahead / shares[client]
        work = ahead + sum(
            min(count, turns * shares[other]) for other, count in waiting.items() if other != client
        )
        return min(svc.rule.queue_timeout_s, max(base, work * service_s / svc.rule.max_concurrency))

    def enqueue(self, svc: ServiceState, request_id: str, client: str) -> None:
        self.requests[request_id] = svc.name
        svc.queue.append(Waiter(request_id, self.now, next(self._seq), client), self.share_of)

    def grant_next(self, svc: ServiceState) -> None:
        """Grant the waiting request whose turn it is (``fairness``)."""
        waiter = svc.queue.pop_next(fair=svc.rule.fair, share=self.share_of)
        self.grant(svc, waiter.request_id, waiter.client)

    def grant(self, svc: ServiceState, request_id: str, client: str) -> None:
        self.requests[request_id] = svc.name
        self.granted_at[request_id] = self.now
        self.client_of[request_id] = client
        svc.in_flight.add(request_id)
        svc.last_used = self.now
        self.out.append(Grant(request_id, svc.name))

    def stop(self, svc: ServiceState, reason: str, *, sleepable: bool = False) -> None:
        """Begin stopping: drain a ready instance, terminate a starting one.

        ``sleepable`` marks a stop that only makes room (see ``actions.Stop``).
        """
        svc.stop_sleepable = sleepable
        if svc.state is S.READY:
            svc.state = S.DRAINING
            svc.stop_reason = reason
            svc.drain_deadline = self.now + svc.rule.stop_timeout_s
            self.out.append(Stop(svc.name, reason, drain=True, sleepable=svc.stop_sleepable))
            if not svc.in_flight:
                self.terminate(svc, f"{reason}; nothing in flight")
        elif svc.state is S.STARTING:
            svc.stop_reason = reason
            self.terminate(svc, reason)

    def terminate(self, svc: ServiceState, reason: str) -> None:
        svc.state = S.STOPPING
        svc.drain_deadline = None
        self.out.append(Stop(svc.name, reason, drain=False, sleepable=svc.stop_sleepable))

    def release(self, svc: ServiceState) -> None:
        """The instance is gone: its memory is free now, even before the next sample."""
        if svc.resident:
            for device in svc.devices:
                self.ledger.release(device, svc.measured_at(device))
                self.ledger.stopped(device, svc.charge_on(device), self.now)
        self.drop_in_flight(svc)
        svc.devices = ()
        svc.measured = 0
        svc.measured_by_device = {}
        svc.started_at = None
        svc.drain_deadline = None
        svc.claimed_by = None
        svc.batch.clear()
        svc.retry_at = None
        svc.retry_after_room = False

    def stop_sleeper(self, svc: ServiceState, reason: str) -> None:
        """Stop a sleeper's process for good (to admission it is stopped already)."""
        if svc.sleeper is not None and not svc.sleeper.stopping:
            svc.sleeper.stopping = True
            self.out.append(StopSleeper(svc.name, reason))

    def forget(self, svc: ServiceState) -> None:
        """Drop a removed service's record; operators waiting on it get their answer."""
        for ticket, kind in list(svc.tickets.items()):
            outcome = Answer.STOPPED if kind == "unload" else Answer.IGNORED
            self.resolve(svc, ticket, outcome, f"{svc.name} was removed from the policy")
        svc.tickets.clear()
        del self.services[svc.name]
        self.reorder()

    def resolve(
        self,
        svc: ServiceState,
        ticket: str,
        outcome: Answer,
        message: str = "",
        retry_after: float | None = None,
    ) -> None:
        svc.tickets.pop(ticket, None)
        self.out.append(Resolve(ticket, svc.name, outcome, message, retry_after))

    def drop_in_flight(self, svc: ServiceState) -> None:
        """Forget requests whose process is gone; the proxy has answered them already."""
        for request_id in svc.in_flight:
            self.requests.pop(request_id, None)
            self.granted_at.pop(request_id, None)
            self.client_of.pop(request_id, None)
        svc.in_flight.clear()

    def drop_plan(self, svc: ServiceState) -> None:
        """Forget a waiting load's plan and free its claims (victims keep stopping)."""
        plan, svc.plan = svc.plan, None
        for name in plan.victims if plan else ():
            other = self.services.get(name)
            if other is not None and other.claimed_by == svc.name:
                other.claimed_by = None

    def note(
        self,
        svc: str | None,
        kind: EventKind,
        message: str,
        *,
        victims: Sequence[str] | None = None,
        **data: object,
    ) -> None:
        if victims is None:
            self.out.append(Note(svc, kind, message, dict(data)))
            return
        data["victims"] = list(victims)
        self.out.append(Note(svc, kind, message, dict(data), victims=tuple(victims)))

    def note_once(
        self, svc: ServiceState, kind: EventKind, message: str, data: Mapping[str, object]
    ) -> None:
        """A note for a decision that may be re-taken on every event: said once."""
        key = f"{kind}:{message}"
        if svc.last_note != key:
            svc.last_note = key
            self.out.append(Note(svc.name, kind, message, dict(data)))

    def reject(
        self, svc: ServiceState, waiter: Waiter, code: ErrorCode, message: str, retry: float | None
    ) -> None:
        svc.queue.remove(waiter)
        self.requests.pop(waiter.request_id, None)
        self.out.append(Reject(waiter.request_id, svc.name, code, message, retry, waiter.client))

    def reject_queue(
        self, svc: ServiceState, code: ErrorCode, message: str, retry: float | None = None
    ) -> None:
        for waiter in list(svc.queue):
            self.reject(svc, waiter, code, message, retry)

    def retry_window(self, name: str) -> float | None:
        opens = self.next_open.get(name)
        return None if opens is None else max(0.0, opens - self.now)

    def retry_queue(self, svc: ServiceState) -> float:
        load_s, started = svc.learned.load_s, svc.started_at
        if svc.state is S.STARTING and load_s is not None and started is not None:
            return max(QUEUE_FULL_RETRY_S, load_s - (self.now - started))
        return QUEUE_FULL_RETRY_S
