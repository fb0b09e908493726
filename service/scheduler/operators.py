"""Operators' load, unload and restart: what each does, and when it has its outcome.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

from service.domain import EventKind, InstanceState, Residency
from service.errors import ErrorCode
from service.scheduler.actions import Answer
from service.scheduler.book import Book
from service.scheduler.events import LoadRequested, RestartRequested, UnloadRequested
from service.scheduler.reasons import unloaded_message
from service.scheduler.state import ServiceState

S = InstanceState


def answer_operators(book: Book) -> None:
    """Resolve every open ticket whose outcome the current state decides."""
    for svc in [s for s in book.ordered() if s.tickets]:
        for ticket, kind in list(svc.tickets.items()):
            outcome = _outcome(book, svc, kind)
            if outcome is not None:
                book.resolve(svc, ticket, *outcome)


def _outcome(book: Book, svc: ServiceState, kind: str) -> tuple[Answer, str] | None:
    if svc.state is S.FAILED:
        return Answer.FAILED, f"{svc.name} failed to load: {svc.error}"
    if kind == "unload":
        if svc.state is S.STOPPED and not svc.sleeper_stopping:
            return Answer.STOPPED, ""
        return None
    if kind != "load":
        return None  # a restart: answered about the new instance, once there is one
    if svc.state is S.READY:
        return Answer.READY, ""
    if svc.state is not S.STOPPED or svc.sleeper_stopping:
        return None
    if svc.plan is None and (svc.wait is not None or svc.behind is not None):
        return Answer.WAITING, svc.waiting_text(book.now, book.clock) or ""
    if not book.wants(svc):
        if svc.error:
            return Answer.REFUSED, svc.error
        return Answer.STOPPED, f"{svc.name} is no longer asked to load"
    return None


def on_restart(book: Book, event: RestartRequested) -> None:
    """An operator's restart: the instance drains and starts again (a load if none)."""
    # Draining or stopping, the instance is on its way out already (a restart in
    # progress, an eviction, an unload): what comes next is a fresh instance.
    svc = book.services.get(event.service)
    if svc is not None and svc.state in (S.READY, S.STARTING) and not svc.removed:
        svc.restart = event.reason
        if event.ticket is not None:
            svc.tickets[event.ticket] = "restart"
    elif event.ticket is not None:
        # An operator's restart of a service that is not loaded is a load.
        on_load(book, LoadRequested(event.service, event.ticket))


def on_load(book: Book, event: LoadRequested) -> None:
    """An operator's load (or a restart of what is not loaded): wanted until unloaded."""
    svc = book.services.get(event.service)
    if svc is None or svc.removed:
        book.note(event.service, EventKind.IGNORED, f"no service named {event.service!r}")
        return
    if svc.rule.residency is Residency.WINDOW_ONLY and svc.name not in book.allowed_now:
        if event.ticket is not None:
            message = f"{svc.name} runs only in a maintenance window that allows it; none is open"
            book.resolve(
                svc, event.ticket, Answer.WINDOW_CLOSED, message, book.retry_window(svc.name)
            )
        return
    if event.ticket is not None:
        svc.tickets[event.ticket] = "load"
    if svc.state is S.FAILED:
        svc.state = S.STOPPED
        svc.error = None
    svc.operator_unloaded = False
    svc.last_note = None
    if svc.state not in (S.STARTING, S.READY):
        svc.load_intent = "load requested"


def on_unload(book: Book, event: UnloadRequested) -> None:
    """An operator's unload: queued requests refused, the instance and a sleeper stopped."""
    svc = book.services.get(event.service)
    if svc is None or svc.removed:
        book.note(event.service, EventKind.IGNORED, f"no service named {event.service!r}")
        return
    svc.load_intent = None
    svc.restart = None
    svc.wait = svc.behind = None
    book.drop_plan(svc)
    # Pinned means "keep it loaded"; the operator overrides that until a load. Any
    # other service loads again for the next request, but not for those already
    # queued: they would undo the unload the moment it completed.
    svc.operator_unloaded = svc.rule.residency is Residency.PINNED
    if event.ticket is not None:
        svc.tickets[event.ticket] = "unload"
    book.reject_queue(svc, ErrorCode.INSUFFICIENT_CAPACITY, unloaded_message(svc))
    book.stop(svc, "unloaded by an operator")
    book.stop_sleeper(svc, "unloaded by an operator")
