"""What loading a service now would do, asked without doing it (docs/cli.md, ``vramd explain``).

``explain`` runs the same admission the scheduling pass runs (``admission.decide`` and
the pass's "first in line" rule) on the current books and reports the answer -- fits
on device D, would evict X and Y, would wait for X (and when X can yield), can never
fit -- with the figures behind it. It changes nothing: no action, no note, no claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from service.domain import InstanceState
from service.errors import ErrorCode
from service.scheduler.admission import Evict, Place, Refuse, Wait, decide
from service.scheduler.book import Book
from service.scheduler.planner import candidates, first_in_line, line_order
from service.scheduler.reasons import backoff_text
from service.scheduler.state import ServiceState
from service.scheduler.yielding import Asker
from service.units import format_duration, format_size

S = InstanceState


@dataclass(frozen=True, slots=True)
class Explanation:
    """``verdict``: loaded, stopping, backoff (restarts after a crash or a failed start),
    fits, evict, evicting (victims already stopping), wait, never, window_closed or
    failed. ``message`` says it in words."""

    service: str
    verdict: str
    message: str
    need: int
    device: int | None = None
    available: dict[int, int] = field(default_factory=dict)
    victims: tuple[dict[str, object], ...] = ()
    holders: tuple[dict[str, object], ...] = ()
    behind: str | None = None
    data: dict[str, object] = field(default_factory=dict)
    # Every device of a spanning service's placement (``device`` is the first).
    devices: tuple[int, ...] = ()
    # Who waits in its queue and who has requests in flight, by client (fair queues).
    waiting: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "service": self.service,
            "verdict": self.verdict,
            "message": self.message,
            "need_bytes": self.need,
            "device": self.device,
            "devices": list(self.devices or ((self.device,) if self.device is not None else ())),
            "available_bytes": {str(d): a for d, a in self.available.items()},
            "victims": list(self.victims),
            "holders": list(self.holders),
            "behind": self.behind,
            "waiting_by_client": dict(sorted(self.waiting.items())),
            "in_flight_by_client": dict(sorted(self.in_flight.items())),
            **self.data,
        }


def explain(book: Book, name: str, now: float) -> Explanation:
    """Raises ``KeyError`` for an unknown service."""
    svc = book.services[name]
    in_flight = book.held_by(svc)
    for client, count in svc.queue.by_client().items():
        in_flight[client] -= count
    return replace(
        _explain(book, svc, now),
        waiting=svc.queue.by_client(),
        in_flight={client: n for client, n in in_flight.items() if n},
    )


def _explain(book: Book, svc: ServiceState, now: float) -> Explanation:
    name = svc.name
    need = svc.expected_peak
    if svc.resident:
        return _resident(book, svc, need, now)
    if svc.state is S.FAILED:
        message = f"{name} failed ({svc.error or 'crash-looping'}); a load clears it"
        return Explanation(name, "failed", message, need)
    if not book.allowed(svc):
        message = f"{name} runs only in a maintenance window that allows it; none is open"
        opens = book.retry_window(name)
        data: dict[str, object] = {"opens_in_s": opens}
        if opens is not None:
            message += f" (the next opens in {format_duration(opens)})"
        return Explanation(name, ErrorCode.WINDOW_CLOSED.value, message, need, data=data)
    if svc.plan is not None:
        victims = ", ".join(sorted(svc.plan.victims))
        plan = svc.plan
        message = f"{name} is loading on {plan.where()} once {victims} have stopped"
        return Explanation(name, "evicting", message, need, plan.device, devices=plan.devices)
    devices = candidates(book, svc.rule)
    if not book.ledger.devices():
        return Explanation(name, "wait", f"{name} would wait for the first memory sample", need)
    if not devices:
        message = f"{name} may use GPUs {list(svc.rule.gpus or ())} only, none of them sampled"
        return Explanation(name, "never", message, need)
    head = first_in_line(book, svc, _ahead_of(book, svc))
    if head is not None:
        message = f"{name} would wait behind {head}, first in line for the same memory"
        return Explanation(name, "wait", message, need, behind=head)
    rooms = [book.room(d, svc) for d in devices]
    available = {room.device: room.available for room in rooms}
    decision = decide(_asker(svc, now), need, rooms, now)
    match decision:
        case Place():
            budget = book.ledger.budget(decision.device)
            message = f"{name} fits on {decision.where()}: {decision.figures(need)}"
            if not decision.spans:
                message += f" of a {format_size(budget)} budget"
            return Explanation(
                name,
                "fits",
                message,
                need,
                decision.device,
                available,
                data={"budget": budget},
                devices=decision.devices,
            )
        case Evict():
            return _evict(name, need, decision, available)
        case Wait():
            return Explanation(
                name,
                "wait",
                decision.message(name, now, book.clock).replace(" waits ", " would wait ", 1),
                need,
                available=decision.available,
                holders=tuple(h.as_dict(now, book.clock) for h in decision.holders),
                data={"yields_in_s": _yields_in(decision, now)},
            )
        case Refuse():
            return Explanation(
                name, "never", f"can never fit: {decision.message}", need, data=decision.data
            )


def _resident(book: Book, svc: ServiceState, need: int, now: float) -> Explanation:
    devices = svc.devices
    where = f"on device{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))}"
    if svc.state in (S.DRAINING, S.STOPPING):
        message = f"{svc.name} is {svc.state.value} {where} ({svc.stop_reason})"
        return Explanation(svc.name, "stopping", message, need, svc.device, devices=devices)
    if svc.retry_at is not None:
        message = f"{backoff_text(svc, now, book.clock)}, {where}; its memory stays reserved"
        data: dict[str, object] = {
            "restart_in_s": max(0.0, svc.retry_at - now),
            "crashed": svc.crashed,
        }
        return Explanation(
            svc.name, "backoff", message, need, svc.device, devices=devices, data=data
        )
    message = f"{svc.name} is {svc.state.value} {where}, charged {format_size(svc.charge)}"
    return Explanation(svc.name, "loaded", message, need, svc.device, devices=devices)


def _evict(name: str, need: int, decision: Evict, available: dict[int, int]) -> Explanation:
    victims = tuple(
        {
            "service": v.name,
            "residency": str(v.residency),
            "priority": v.priority,
            "busy": v.busy,
            "bytes": v.charge,
            "already_stopping": v in decision.claimed,
        }
        for v in (*decision.victims, *decision.claimed)
    )
    names = ", ".join(v.name for v in (*decision.victims, *decision.claimed))
    message = f"{name} would evict {names} on {decision.where()}: {decision.figures(need)}"
    return Explanation(
        name,
        "evict",
        message,
        need,
        decision.device,
        available,
        victims=victims,
        devices=decision.devices,
    )


def _ahead_of(book: Book, svc: ServiceState) -> list[ServiceState]:
    """Loads in line before ``svc`` that wait for memory, as the pass would meet them.

    A service nothing has asked for yet would join the line now: behind every request.
    """
    now = book.now
    mine = line_order(svc, now)
    if not svc.queue:  # a service nothing has asked for yet would join the line now
        mine = (mine[0], mine[1], math.inf, mine[3])
    return sorted(
        (
            other
            for other in book.services.values()
            if other is not svc
            and other.state is S.STOPPED
            and other.plan is None
            and book.wants(other)
            and (other.wait is not None or other.behind is not None)
            and line_order(other, now) < mine
        ),
        key=lambda other: line_order(other, now),
    )


def _yields_in(wait: Wait, now: float) -> float | None:
    at = wait.yields_at()
    return None if at is None else max(0.0, at - now)


def _asker(svc: ServiceState, now: float) -> Asker:
    """The load as admission would weigh it: what waits for it, or else one request
    arriving now (what "loading it now" means to a client)."""
    asker = svc.asker()
    if svc.queue:
        return asker
    return replace(asker, arrivals=(now,))
