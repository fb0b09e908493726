"""The scheduler: events flow in, a plan flows out.

What it decides, in the operator's words: docs/operations.md, "How vramd decides".

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

from collections.abc import Mapping

from service.domain import EventKind, InstanceState, Residency
from service.errors import ErrorCode
from service.scheduler.actions import Action, Note, Reject
from service.scheduler.admission import ClockText
from service.scheduler.book import Book
from service.scheduler.events import (
    Event,
    InstanceAdopted,
    InstanceAsleep,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    LearnedChanged,
    LoadRequested,
    MakeRoom,
    MemorySampled,
    PolicyChanged,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    RestartRequested,
    ShutdownRequested,
    Tick,
    TuningChanged,
    UnloadRequested,
    WindowChanged,
)
from service.scheduler.explain import Explanation, explain
from service.scheduler.ledger import LedgerView
from service.scheduler.operators import answer_operators, on_load, on_restart, on_unload
from service.scheduler.planner import give_up_retry, run_pass, wanted_back
from service.scheduler.reasons import (
    backoff_text,
    expired_idle,
    failed_message,
    unloaded_message,
    what_it_waited_for,
)
from service.scheduler.rules import DeviceRule, Learned, ServiceRule
from service.scheduler.state import ServiceState, ServiceView, Sleeper
from service.scheduler.yielding import Block, Tuning, eviction_block
from service.units import format_duration

S = InstanceState
# Retry-After for requests refused because the daemon is stopping (it may be restarting).
SHUTDOWN_RETRY_S = 5.0


class Scheduler:
    """The pure decision core. Not thread-safe: one owner feeds it events in order."""

    def __init__(
        self,
        rules: Mapping[str, ServiceRule],
        device_rule: DeviceRule,
        *,
        learned: Mapping[str, Learned] | None = None,
        clock_text: ClockText | None = None,
    ) -> None:
        """``clock_text`` turns a time on the scheduler's clock into a clock time for
        messages ("yields by 12:03:10"); without one they say "in 1m10s"."""
        self._book = Book(rules, device_rule, learned or {})
        self._book.clock = clock_text

    # ----------------------------------------------------------------- read-only views

    def service_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._book.services))

    @property
    def tuning(self) -> Tuning:
        """What ``yielding: auto`` stands for now."""
        return self._book.tuning

    def learned(self) -> dict[str, Learned]:
        """What each service's past instances showed (peak, load time)."""
        return {name: svc.learned for name, svc in self._book.services.items()}

    def service_view(self, name: str, now: float | None = None) -> ServiceView:
        """The service's decision state; ``idle_for`` is measured at ``now`` (default:
        the time of the last event). Raises ``KeyError`` for an unknown service."""
        svc = self._book.services[name]
        at = self._book.now if now is None else now
        return svc.view(at, waiting_for_memory=self._waits(svc), clock=self._book.clock)

    def load_of(self, name: str) -> tuple[int, int, bool]:
        """Requests in flight, requests queued, and whether a load waits for memory: the
        few figures a cluster router reads many times a second, without a whole view."""
        svc = self._book.services[name]
        return len(svc.in_flight), len(svc.queue), self._waits(svc)

    def _waits(self, svc: ServiceState) -> bool:
        # A restarting instance (draining, its own memory claimed) is not waiting.
        return svc.state is S.STOPPED and (svc.plan is not None or self._book.wants(svc))

    def explain(self, name: str, now: float | None = None) -> Explanation:
        """What loading ``name`` now would do, changing nothing (``explain``).
        Raises ``KeyError`` for an unknown service."""
        return explain(self._book, name, self._book.now if now is None else now)

    def devices(self) -> tuple[int, ...]:
        """Devices of the last sample that the policy lets vramd use."""
        return self._book.ledger.devices()

    def ledger_view(self, device: int) -> LedgerView | None:
        """One device's accounting, or None if the last sample did not include it."""
        return self._book.ledger_view(device)

    # ------------------------------------------------------------------------- events

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event that happened at ``now`` and return the resulting plan."""
        book = self._book
        book.now, book.out = now, []
        match event:
            case RequestArrived():
                self._on_arrived(event)
            case RequestCancelled():
                self._on_request_gone(event.request_id, finished=False)
            case RequestFinished():
                self._on_request_gone(event.request_id, finished=True)
            case InstanceReady():
                self._on_ready(event)
            case InstanceAdopted():
                self._on_adopted(event)
            case InstanceBackoff():
                self._on_backoff(event)
            case InstanceFailed():
                self._on_failed(event)
            case InstanceStopped():
                self._on_stopped(event)
            case InstanceAsleep():
                self._on_asleep(event)
            case MemorySampled():
                book.ledger.sample(event.devices)
                for svc in book.services.values():
                    if svc.resident:
                        by_device = event.per_device.get(svc.name, {})
                        svc.take_sample(event.footprints.get(svc.name, 0), by_device)
            case Tick():
                self._on_tick()
            case WindowChanged():
                self._on_window(event)
            case PolicyChanged():
                self._on_policy(event)
            case TuningChanged():
                book.tuning = event.tuning
                book.retune()
            case LearnedChanged():
                if event.service in book.services:
                    book.services[event.service].learned = event.learned
            case LoadRequested():
                on_load(self._book, event)
            case UnloadRequested():
                on_unload(self._book, event)
            case RestartRequested():
                on_restart(self._book, event)
            case MakeRoom():
                self._on_make_room(event)
            case ShutdownRequested():
                self._on_shutdown()
        run_pass(book, quiet=isinstance(event, Tick) and not book.out)
        self._stop_sleepers_for_waits()
        answer_operators(book)
        return book.out

    def _on_arrived(self, event: RequestArrived) -> None:
        book, rid, name = self._book, event.request_id, event.service
        if rid in book.requests:
            book.note(name, EventKind.IGNORED, f"request {rid} is already known", request=rid)
            return
        svc = book.services.get(name)
        if svc is None or svc.removed:
            message = f"no service named {name!r}"
            book.out.append(Reject(rid, name, ErrorCode.MODEL_NOT_FOUND, message))
            return
        rule = svc.rule
        svc.habits.arrived(book.now, svc.last_used if svc.idle else None)
        refusal: tuple[ErrorCode, str, float | None] | None = None
        if book.shutting_down:
            refusal = (ErrorCode.INSUFFICIENT_CAPACITY, "vramd is shutting down", SHUTDOWN_RETRY_S)
        elif svc.state is S.FAILED:
            refusal = (ErrorCode.RUNTIME_FAILED, failed_message(svc), None)
        elif rule.residency is Residency.WINDOW_ONLY and name not in book.allowed_now:
            message = f"{name} runs only in a maintenance window that allows it"
            refusal = (ErrorCode.WINDOW_CLOSED, message, book.retry_window(name))
        elif rule.residency is Residency.PINNED and svc.operator_unloaded:
            refusal = (ErrorCode.INSUFFICIENT_CAPACITY, unloaded_message(svc), None)
        else:
            refusal = book.refuse_or_make_room(svc, event.client)
        if refusal is not None:
            book.out.append(Reject(rid, name, *refusal, client=event.client))
            return
        svc.join_batch(rid)
        if svc.state is S.READY and not svc.queue and len(svc.in_flight) < rule.max_concurrency:
            book.grant(svc, rid, event.client)
        else:
            book.enqueue(svc, rid, event.client)

    def _on_request_gone(self, request_id: str, *, finished: bool) -> None:
        book = self._book
        name = book.requests.pop(request_id, None)
        granted = book.granted_at.pop(request_id, None)
        book.client_of.pop(request_id, None)
        svc = book.services.get(name) if name is not None else None
        if svc is None:
            return
        if request_id in svc.in_flight:
            svc.in_flight.discard(request_id)
            svc.last_used = book.now
            if finished and granted is not None:
                svc.habits.finished(book.now - granted)
            return
        waiter = svc.queue.get(request_id)
        if waiter is not None:
            svc.queue.remove(waiter)

    def _on_ready(self, event: InstanceReady) -> None:
        svc = self._book.services.get(event.service)
        if svc is not None and svc.state is S.STARTING:
            svc.state = S.READY
            # Idle time counts from ready, not from start; but an instance back after a
            # crash keeps its last use, or a crash would renew its idle TTL for ever.
            if not svc.crashed or svc.last_used is None:
                svc.last_used = self._book.now
            svc.error = None
            svc.crashed = False

    def _on_adopted(self, event: InstanceAdopted) -> None:
        """Resident and ready at once, charged its expected peak until measured."""
        svc = self._book.services.get(event.service)
        if svc is None or svc.state is not S.STOPPED or not event.devices:
            return
        svc.state = S.READY
        svc.devices = event.devices
        svc.measured = 0
        svc.measured_by_device = {}
        svc.started_at = svc.last_used = self._book.now
        svc.sleeper = None
        svc.error = None

    def _on_backoff(self, event: InstanceBackoff) -> None:
        svc = self._book.services.get(event.service)
        if svc is None or not svc.resident:
            return
        book = self._book
        book.drop_in_flight(svc)
        svc.error = event.error
        svc.retry_at = event.retry_at
        svc.crashed = event.crashed
        if svc.state is S.READY:
            svc.state = S.STARTING  # the supervisor retries; the reservation stays
        if event.retry_at is not None and not wanted_back(svc, book.now):
            give_up_retry(book, svc)
            return
        book.note(svc.name, EventKind.BACKOFF, backoff_text(svc, book.now, book.clock))

    def _on_failed(self, event: InstanceFailed) -> None:
        book = self._book
        svc = book.services.get(event.service)
        if svc is None:
            return
        book.release(svc)
        book.drop_plan(svc)
        svc.state = S.FAILED
        svc.error = event.error
        svc.load_intent = None
        svc.restart = None
        book.reject_queue(svc, ErrorCode.RUNTIME_FAILED, failed_message(svc))
        svc.wait = svc.behind = None
        svc.retry_at = None
        if svc.removed:
            book.forget(svc)

    def _on_stopped(self, event: InstanceStopped) -> None:
        book = self._book
        svc = book.services.get(event.service)
        if svc is None:
            return
        if not svc.resident:
            # A sleeper's process is gone: stopped for good, or it died asleep.
            svc.sleeper = None
            return
        if svc.state in (S.STARTING, S.READY):
            book.note(svc.name, EventKind.EXITED, f"{svc.name} stopped without being asked to")
        book.release(svc)
        svc.state = S.STOPPED
        svc.restart = None
        # A restart's old instance is gone: its operators now wait for the new one.
        svc.tickets = {t: "load" if k == "restart" else k for t, k in svc.tickets.items()}
        if svc.removed:
            book.forget(svc)

    def _on_asleep(self, event: InstanceAsleep) -> None:
        book = self._book
        svc = book.services.get(event.service)
        if svc is None or not svc.resident:
            return
        devices = svc.devices
        book.release(svc)
        svc.state = S.STOPPED
        svc.restart = None
        svc.sleeper = Sleeper(devices, book.now)
        if svc.removed:
            book.stop_sleeper(svc, "removed from the policy")
            book.forget(svc)

    def _on_tick(self) -> None:
        book, now = self._book, self._book.now
        for svc in book.ordered():
            rule = svc.rule
            for waiter in list(svc.queue):
                waited = now - waiter.arrived_at
                if waited >= rule.queue_timeout_s:
                    message = (
                        f"waited {format_duration(waited)} in the queue of {svc.name} "
                        f"(queue.timeout {format_duration(rule.queue_timeout_s)})"
                    )
                    why, retry = what_it_waited_for(svc, now, book.clock)
                    if why:
                        message += f": {why}"
                    book.reject(svc, waiter, ErrorCode.QUEUE_TIMEOUT, message, retry)
            deadline = svc.drain_deadline
            if svc.state is S.DRAINING and deadline is not None and now >= deadline:
                reason = (
                    f"stop_timeout {format_duration(rule.stop_timeout_s)} reached with "
                    f"{len(svc.in_flight)} request(s) in flight"
                )
                book.terminate(svc, reason)
            idle_s = expired_idle(svc, now)
            if idle_s is not None:
                ttl = format_duration(rule.idle_ttl_s)
                book.stop(
                    svc, f"idle for {format_duration(idle_s)} (idle_ttl {ttl})", sleepable=True
                )
            since = svc.sleeper.since if svc.sleeper else None
            if since is not None and rule.idle_ttl_s > 0 and now - since >= rule.idle_ttl_s:
                book.stop_sleeper(svc, f"asleep longer than its idle_ttl ({rule.idle_ttl_s:g}s)")

    def _on_window(self, event: WindowChanged) -> None:
        book = self._book
        book.allowed_now = event.allowed
        book.next_open = dict(event.next_open_at)
        for svc in book.ordered():
            if svc.rule.residency is not Residency.WINDOW_ONLY or svc.name in book.allowed_now:
                continue
            message = f"the maintenance window that allows {svc.name} closed"
            book.reject_queue(svc, ErrorCode.WINDOW_CLOSED, message, book.retry_window(svc.name))
            svc.load_intent = None
            book.drop_plan(svc)
            book.stop(svc, "its maintenance window closed")

    def _on_policy(self, event: PolicyChanged) -> None:
        book = self._book
        book.ledger.rule = event.device
        book.clients = dict(event.clients)
        for name in sorted(set(book.services) - set(event.rules)):
            svc = book.services[name]
            if svc.removed:
                continue
            message = f"service {name!r} was removed from the policy"
            book.reject_queue(svc, ErrorCode.MODEL_NOT_FOUND, message)
            book.drop_plan(svc)
            svc.removed = True
            svc.load_intent = None
            if svc.resident:
                book.stop(svc, "removed from the policy")  # forgotten once stopped
            else:
                book.stop_sleeper(svc, "removed from the policy")
                book.forget(svc)
        for name in sorted(event.rules):
            rule = event.rules[name]
            current = book.services.get(name)
            if current is None:
                book.add(rule, None)
                continue
            old, current.rule, current.removed = current.rule, rule, False
            newly_preloaded = rule.preload and not (old.preload and old.residency is rule.residency)
            if rule.residency is Residency.WARM and newly_preloaded:
                current.load_intent = "preload"
            if name in event.restart and current.resident:
                current.restart = "its command changed"
        book.reorder()  # priorities may have changed

    def _on_make_room(self, event: MakeRoom) -> None:
        book = self._book
        svc = book.services.get(event.service)
        if svc is None or not svc.devices or not svc.resident:
            return
        victims = [
            other
            for other in book.ordered()
            if other.name != svc.name
            and other.resident
            and set(other.devices) & set(svc.devices)
            and other.state in (S.READY, S.STARTING)
            and eviction_block(svc.asker(), other.snapshot(book.now), book.now)
            in (None, Block.BATCH)
        ]
        svc.retry_after_room = True
        if not victims:
            book.note(
                svc.name, EventKind.MAKE_ROOM, f"{event.reason}: nothing {svc.name} may evict"
            )
            return
        names = [v.name for v in victims]
        book.note(
            svc.name,
            EventKind.EVICT,
            f"{event.reason}: evicting everything {svc.name} may evict on device "
            f"{', '.join(map(str, svc.devices))} before its retry: {', '.join(names)}",
            device=svc.device,
            devices=list(svc.devices),
            victims=names,
        )
        for victim in victims:
            book.stop(victim, f"evicted to make room for {svc.name}'s retry", sleepable=True)

    def _on_shutdown(self) -> None:
        """Refuse what waits, drain what runs (terminated at ``stop_timeout``), load
        nothing more: ``Book.allowed`` says no to every service from now on."""
        book = self._book
        book.shutting_down = True
        for svc in book.ordered():
            book.reject_queue(
                svc, ErrorCode.INSUFFICIENT_CAPACITY, "vramd is shutting down", SHUTDOWN_RETRY_S
            )
            svc.load_intent = None
            svc.restart = None
            svc.retry_at = None
            book.drop_plan(svc)
            book.stop(svc, "daemon shutting down")
            book.stop_sleeper(svc, "daemon shutting down")

    def _stop_sleepers_for_waits(self) -> None:
        """A load waits for memory: sleepers' leftovers are the cheapest to take."""
        book = self._book
        waiting = [a.service for a in book.out if isinstance(a, Note) and a.kind is EventKind.WAIT]
        for name in waiting:
            for svc in book.ordered():
                if svc.asleep and svc.name != name:
                    book.stop_sleeper(svc, f"{name} waits for memory")
