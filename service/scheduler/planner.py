"""The scheduling pass run after every event (the steps are listed in ``core``).

Event handlers only record facts; this pass turns the resulting state into actions, so a
decision never depends on which event happened to make it possible: a slot freed by a
finished request, memory freed by a stopped victim and a newly sampled device all lead
to the same grants and loads.
"""

from __future__ import annotations

from service.domain import InstanceState
from service.scheduler import actions as act
from service.scheduler.actions import Start
from service.scheduler.admission import Evict, Place, Refuse, Wait, decide
from service.scheduler.book import Book
from service.scheduler.state import Plan, ServiceState
from service.units import format_size

S = InstanceState


def run_pass(book: Book) -> None:
    """Drains, dropped loads, restarts, grants, then loads by priority (see ``core``)."""
    for svc in book.ordered():
        if svc.state is S.DRAINING and not svc.in_flight:
            book.terminate(svc, f"{svc.stop_reason}; nothing in flight")
    for svc in book.ordered():
        if svc.plan is not None and not book.wants(svc):
            # Step 5 of admission: the last waiter left before the load started.
            book.drop_plan(svc)
            book.note(svc.name, "drop-plan", f"nothing waits for {svc.name}; its load is dropped")
    for svc in book.ordered():
        if svc.restart_pending and svc.state is S.READY and svc.idle:
            _restart(book, svc)
    for svc in book.ordered():
        while svc.state is S.READY and svc.queue and len(svc.in_flight) < svc.rule.max_concurrency:
            book.grant(svc, svc.queue.popleft().request_id)
    loads = [s for s in book.services.values() if s.state is S.STOPPED and book.wants(s)]
    for svc in sorted(loads, key=lambda s: (-s.rule.priority, s.first_seq(), s.name)):
        if svc.plan is not None:
            if any(book.claimed(svc, victim) for victim in svc.plan.victims):
                continue  # victims still stopping: the plan stands, no second victim set
            book.drop_plan(svc)
        admit(book, svc)


def admit(book: Book, svc: ServiceState) -> None:
    """Run admission for ``svc`` with the current figures and carry out the decision."""
    rule, need = svc.rule, svc.expected_peak
    sampled = book.ledger.devices()
    if not sampled:
        book.note_once(svc, "wait", f"{svc.name} waits for the first memory sample", {})
        return
    candidates = [d for d in sampled if rule.gpus is None or d in rule.gpus]
    if not candidates:
        gpus = list(rule.gpus or ())
        message = f"{svc.name} may use GPUs {gpus} only, but vramd uses {list(sampled)}"
        _refuse(book, svc, message, {"gpus": gpus, "devices": list(sampled)})
        return
    decision = decide(rule, need, [book.room(d, svc) for d in candidates])
    match decision:
        case Place():
            _start(book, svc, decision.device, need, decision.available)
        case Evict():
            _evict(book, svc, decision, need)
        case Wait():
            book.note_once(svc, "wait", decision.reason, decision.data)
        case Refuse():
            _refuse(book, svc, decision.message, decision.data)


def _start(book: Book, svc: ServiceState, device: int, need: int, available: int) -> None:
    budget = book.ledger.budget(device)
    book.note(
        svc.name,
        "admit",
        f"{svc.name} fits on device {device}: needs {format_size(need)}, "
        f"{format_size(available)} available of a {format_size(budget)} budget",
        device=device,
        need=need,
        available=available,
        budget=budget,
    )
    if svc.queue:
        reason = f"{len(svc.queue)} request(s) waiting"
    else:
        reason = svc.load_intent or str(svc.rule.residency)
    book.out.append(Start(svc.name, device, reason))
    svc.state = S.STARTING
    svc.device = device
    svc.measured = 0
    svc.started_at = book.now
    svc.loaded_for = frozenset(w.request_id for w in svc.queue)
    svc.load_intent = None
    svc.last_note = None
    svc.error = None


def _evict(book: Book, svc: ServiceState, decision: Evict, need: int) -> None:
    """Claim every victim at once and stop the new ones together: one plan per need."""
    names = [v.name for v in (*decision.victims, *decision.claimed)]
    svc.plan = Plan(decision.device, need, frozenset(names), book.now)
    svc.last_note = None
    for name in names:
        book.services[name].claimed_by = svc.name
    parts = [
        f"{v.name} ({v.residency}, priority {v.priority}, {'busy' if v.busy else 'idle'}) "
        f"frees {format_size(v.charge)}"
        for v in decision.victims
    ]
    parts += [
        f"{v.name} (already stopping) frees {format_size(v.charge)}" for v in decision.claimed
    ]
    book.note(
        svc.name,
        "evict" if decision.victims else "wait",
        f"{svc.name} (priority {svc.rule.priority}) needs {format_size(need)} on device "
        f"{decision.device}, {format_size(decision.available)} available: " + "; ".join(parts),
        device=decision.device,
        need=need,
        available=decision.available,
        deficit=decision.deficit,
        victims=[v.name for v in decision.victims],
        claimed=[v.name for v in decision.claimed],
    )
    reason = f"evicted for {svc.name} (priority {svc.rule.priority}, needs {format_size(need)})"
    for victim in decision.victims:
        book.stop(book.services[victim.name], reason, sleepable=True)


def _restart(book: Book, svc: ServiceState) -> None:
    svc.restart_pending = False
    if book.wants(svc) and svc.device is not None:
        # A pinned service keeps its memory for its own return: with itself as the only
        # victim, its hold grows to its whole need as it stops, so no lower load takes it.
        svc.plan = Plan(svc.device, svc.expected_peak, frozenset({svc.name}), book.now)
        svc.claimed_by = svc.name
    book.stop(svc, f"restart: {svc.restart_reason or 'requested'}")


def _refuse(book: Book, svc: ServiceState, message: str, data: dict[str, object]) -> None:
    book.reject_queue(svc, act.INSUFFICIENT_CAPACITY, message)
    svc.load_intent = None
    svc.error = message
    book.note_once(svc, "refuse", message, data)
