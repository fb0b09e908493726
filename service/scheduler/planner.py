"""The scheduling pass run after every event (the steps are listed in ``core``).

Event handlers only record facts; this pass turns the resulting state into actions, so a
decision never depends on which event happened to make it possible: a slot freed by a
finished request, memory freed by a stopped victim, a protection that lapsed on a tick
and a newly sampled device all lead to the same grants and loads.
"""

from __future__ import annotations

import math

from service.domain import EventKind, InstanceState, Residency
from service.errors import ErrorCode
from service.scheduler.actions import Start
from service.scheduler.admission import Evict, Place, Refuse, Wait, decide
from service.scheduler.book import Book
from service.scheduler.rules import ServiceRule, share_of
from service.scheduler.state import Plan, ServiceState
from service.units import format_size

S = InstanceState
# How often a waiting load is looked at again while nothing else happens (see ``run_pass``).
REVISIT_S = 1.0


def run_pass(book: Book, *, quiet: bool = False) -> None:
    """Drains, dropped loads, restarts, grants, then loads by priority (see ``core``).

    ``quiet``: the event changed nothing but the time (a tick that timed nothing out).
    Then a load that waits keeps its decision until the first protection it waits for
    lapses (``Book.next_wake``): nothing else that admission reads can have moved, and
    admission is the costly part of a pass, run ten times a second on every waiting load.
    """
    for svc in book.ordered():
        if svc.state is S.DRAINING and not svc.in_flight:
            book.terminate(svc, f"{svc.stop_reason}; nothing in flight")
    for svc in book.ordered():
        if svc.plan is not None and not book.wants(svc):
            # Step 6 of admission: the last waiter left before the load started.
            book.drop_plan(svc)
            book.note(
                svc.name, EventKind.DROP_PLAN, f"nothing waits for {svc.name}; its load is dropped"
            )
    for svc in book.ordered():
        if svc.restart is not None and svc.state is S.READY:
            restart(book, svc)
    for svc in book.ordered():
        if svc.state is S.STARTING and svc.retry_at is not None and book.now >= svc.retry_at:
            retry(book, svc)
    for svc in book.ordered():
        while svc.state is S.READY and svc.queue and len(svc.in_flight) < svc.rule.max_concurrency:
            book.grant_next(svc)
    # A sleeper being stopped for good is loaded once its process is gone.
    loads = [
        s
        for s in book.services.values()
        if s.state is S.STOPPED and book.wants(s) and not s.sleeper_stopping
    ]
    heads: list[ServiceState] = []  # loads earlier in line that wait for memory
    for svc in sorted(loads, key=lambda s: line_order(s, book.now)):
        if svc.plan is not None:
            if any(book.claimed(svc, victim) for victim in svc.plan.victims):
                continue  # victims still stopping: the plan stands, no second victim set
            book.drop_plan(svc)
        waited = svc.wait is not None or svc.behind is not None
        if quiet and waited and book.now < book.next_wake:
            heads.append(svc)
            continue
        head = first_in_line(book, svc, heads)
        if head is not None:
            _wait_behind(book, svc, head)
        else:
            svc.behind = None
            admit(book, svc)
        waiting = svc.wait is not None or svc.behind is not None
        if svc.state is S.STOPPED and svc.plan is None and waiting:
            heads.append(svc)
    wakes = [at for w in heads if w.wait is not None and (at := w.wait.yields_at()) is not None]
    # A protection that gives way to the cost of a wait moves as the holder's idle time
    # and the waiters' ages grow: look again now and then, not only at the estimate.
    book.next_wake = min(min(wakes, default=math.inf), book.now + REVISIT_S)


def line_order(svc: ServiceState, now: float) -> tuple[bool, float, float, str]:
    """Where a load stands in line: pinned services first (they are the floor every
    other load stands on), then the dearest wait (priority x requests, each weighing
    more as it ages toward its timeout; ``ServiceState.wait_cost``), then its oldest
    request, so no waiting load is overtaken for ever."""
    pinned = svc.rule.residency is Residency.PINNED
    return (not pinned, -svc.wait_cost(now), svc.first_seq(), svc.name)


def candidates(book: Book, rule: ServiceRule) -> list[int]:
    """The sampled devices a service may be placed on."""
    return [d for d in book.ledger.devices() if rule.gpus is None or d in rule.gpus]


def admit(book: Book, svc: ServiceState) -> None:
    """Run admission for ``svc`` with the current figures and carry out the decision."""
    rule, need = svc.rule, svc.expected_peak
    sampled = book.ledger.devices()
    if not sampled:
        book.note_once(svc, EventKind.WAIT, f"{svc.name} waits for the first memory sample", {})
        return
    devices = candidates(book, rule)
    if not devices:
        gpus = list(rule.gpus or ())
        message = f"{svc.name} may use GPUs {gpus} only, but vramd uses {list(sampled)}"
        _refuse(book, svc, message, {"gpus": gpus, "devices": list(sampled)})
        return
    rooms = [book.room(d, svc) for d in devices]
    decision = decide(svc.asker(), need, rooms, book.now)
    match decision:
        case Place():
            _start(book, svc, decision, need)
        case Evict():
            _evict(book, svc, decision, need)
        case Wait():
            _wait(book, svc, decision)
        case Refuse():
            _refuse(book, svc, decision.message, decision.data)


def may_backfill(head: ServiceRule, rule: ServiceRule, never: bool) -> bool:
    """Whether a load later in line may take memory the waiting ``head`` could use.

    Only if it would give the memory back: every protection yields to a waiting request
    before its deadline, except ``protect: never`` against a lower priority, so a load
    that would hold memory that way waits behind ``head`` and no waiting load is
    overtaken for ever. A pinned service always loads (it is never evicted, and counts
    against what any load could ever get).
    """
    if rule.residency is Residency.PINNED:
        return True
    outranks = (
        head.priority <= rule.priority
        if rule.residency is Residency.WARM
        else head.priority < rule.priority
    )
    return not (outranks and never)


def first_in_line(book: Book, svc: ServiceState, heads: list[ServiceState]) -> str | None:
    """The first of ``heads`` (waiting loads earlier in line) that ``svc`` must not
    overtake on a device they share (``may_backfill``), if any."""
    mine = set(candidates(book, svc.rule))
    for head in heads:
        if mine & set(candidates(book, head.rule)) and not may_backfill(
            head.rule, svc.rule, svc.conduct.never
        ):
            return head.name
    return None


def _wait_behind(book: Book, svc: ServiceState, head: str) -> None:
    svc.wait, svc.behind = None, head
    message = f"{svc.name} waits behind {head}, first in line for the same memory"
    book.note_once(svc, EventKind.WAIT, message, {"behind": head})


def _wait(book: Book, svc: ServiceState, wait: Wait) -> None:
    svc.wait = wait
    key = f"wait:{wait.key}"
    if svc.last_note == key:
        return  # said already: spare the words, a waiting load is re-admitted often
    svc.last_note = key
    book.note(
        svc.name,
        EventKind.WAIT,
        wait.message(svc.name, book.now, book.clock),
        need=wait.need,
        available=wait.available,
        holders=[h.as_dict(book.now, book.clock) for h in wait.holders],
    )


def _start(book: Book, svc: ServiceState, place: Place, need: int) -> None:
    devices = place.devices
    budget = book.ledger.budget(place.device)
    book.note(
        svc.name,
        EventKind.ADMIT,
        f"{svc.name} fits on {place.where()}: {place.figures(need)}"
        + (f" of a {format_size(budget)} budget" if len(devices) == 1 else ""),
        device=place.device,
        devices=list(devices),
        need=need,
        available=place.available,
        budget=budget,
    )
    if svc.load_intent is not None:
        reason = svc.load_intent
    elif svc.queue:
        reason = f"{len(svc.queue)} request(s) waiting"
    else:
        reason = str(svc.rule.residency)
    wake = svc.sleeper is not None and svc.sleeper.on == devices
    spans = devices if len(devices) > 1 else ()
    book.out.append(Start(svc.name, place.device, reason, wake=wake, spans=spans))
    svc.sleeper = None
    svc.state = S.STARTING
    svc.devices = devices
    svc.measured = 0
    svc.measured_by_device = {}
    svc.started_at = book.now
    svc.begin_batch()
    svc.load_intent = None
    svc.last_note = None
    svc.error = None
    svc.wait = None


def _evict(book: Book, svc: ServiceState, decision: Evict, need: int) -> None:
    """Claim every victim at once and stop the new ones together: one plan per need."""
    names = [v.name for v in (*decision.victims, *decision.claimed)]
    svc.plan = Plan(decision.needs(need), frozenset(names), book.now)
    svc.last_note = None
    svc.wait = None
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
        EventKind.EVICT if decision.victims else EventKind.WAIT,
        f"{svc.name} (priority {svc.rule.priority}) {_needs_on(decision, need)}: "
        + "; ".join(parts),
        device=decision.device,
        devices=list(decision.devices),
        need=need,
        available=decision.available,
        deficit=decision.deficit,
        victims=[v.name for v in decision.victims],
        claimed=[v.name for v in decision.claimed],
    )
    reason = f"evicted for {svc.name} (priority {svc.rule.priority}, needs {format_size(need)})"
    for victim in decision.victims:
        book.stop(book.services[victim.name], reason, sleepable=True)


def _needs_on(decision: Evict, need: int) -> str:
    if not decision.spans:
        return (
            f"needs {format_size(need)} on device {decision.device}, "
            f"{format_size(decision.available)} available"
        )
    return f"on {decision.where()} {decision.figures(need)}"


def restart(book: Book, svc: ServiceState) -> None:
    """A drained restart (docs/policy.md, "Restarts"): drain now, start again at once.

    The instance takes no new requests (they queue for the new one), its memory stays
    claimed for its own return (with itself as the only victim, its hold grows to its
    whole need as it stops, so no other load takes it), and the restart intent loads it
    again even if nothing waits: a restart never leaves unloaded what was loaded.
    """
    reason = f"restart: {svc.restart or 'requested'}"
    svc.restart = None
    if book.allowed(svc) and svc.devices:
        svc.load_intent = reason
        needs = tuple(
            (device, share_of(svc.expected_peak, svc.rule.shares, i))
            for i, device in enumerate(svc.devices)
        )
        svc.plan = Plan(needs, frozenset({svc.name}), book.now)
        svc.claimed_by = svc.name
    book.stop(svc, reason)


def retry(book: Book, svc: ServiceState) -> None:
    """The backoff of a crashed or failed start is over: start it again.

    After an out-of-memory load (``MakeRoom``) the retry also waits for the instances
    evicted for it to be gone: retrying while they still hold their memory would fail
    again for the wrong reason and be diagnosed as a capacity shortage.
    """
    if not wanted_back(svc, book.now):
        give_up_retry(book, svc)
        return
    if svc.retry_after_room and any(
        other.going and set(other.devices) & set(svc.devices)
        for other in book.services.values()
        if other.name != svc.name
    ):
        return
    assert svc.devices, "a backoff keeps its reservation"
    svc.retry_at = None
    svc.retry_after_room = False
    spans = svc.devices if len(svc.devices) > 1 else ()
    book.out.append(
        Start(svc.name, svc.devices[0], "restart after backoff", retry=True, spans=spans)
    )


def wanted_back(svc: ServiceState, now: float) -> bool:
    """Whether an instance that crashed or failed to start is started again: something
    asks for it (requests, pinning, an operator's load or restart, a preload), or it
    would still be resident now had it not crashed (its idle TTL has not run out).

    A runtime that keeps coming up is retried for as long as this holds, however often
    it dies; one that nobody wants any more is stopped and loads afresh when asked.
    """
    if svc.wants_load:
        return True
    ttl = svc.rule.idle_ttl_s
    return ttl <= 0 or (svc.last_used is not None and now - svc.last_used < ttl)


def give_up_retry(book: Book, svc: ServiceState) -> None:
    """Stop a backed-off instance nothing wants back; its memory is released."""
    svc.retry_at = None
    svc.retry_after_room = False
    message = f"{svc.name} is not started again: nothing asks for it and its idle_ttl ran out"
    book.note(svc.name, EventKind.NO_RETRY, message)
    book.stop(svc, "nothing wants it back after it ended")


def _refuse(book: Book, svc: ServiceState, message: str, data: dict[str, object]) -> None:
    book.reject_queue(svc, ErrorCode.INSUFFICIENT_CAPACITY, message)
    svc.load_intent = None
    svc.error = message
    svc.wait = None
    book.note_once(svc, EventKind.REFUSE, message, data)
