"""Answering operators: when a load, unload or restart they asked for has its outcome.

An operator's ``vramd load``/``unload``/``restart`` carries a ticket (the event's
``ticket`` field). After every event the scheduler looks at the services with open
tickets and resolves each one whose outcome is now known, so the kernel never polls:

- a load: ``ready`` once the instance is; ``waiting`` when it waits for memory others
  hold (the load still happens when it can, and the answer says what it waits for);
  ``refused`` when it can never fit; ``failed`` when the supervisor gave up; ``stopped``
  when nothing will load it any more (an unload or a window closing overtook it);
- a restart: like a load, once the old instance is gone (``core`` turns its ticket into
  a load ticket then), so the answer is about the new instance;
- an unload: ``stopped`` once the process is gone (a sleeper's too).
"""

from __future__ import annotations

from service.domain import InstanceState
from service.scheduler.book import Book
from service.scheduler.state import ServiceState

S = InstanceState


def answer_operators(book: Book) -> None:
    """Resolve every open ticket whose outcome the current state decides."""
    for svc in [s for s in book.ordered() if s.tickets]:
        for ticket, kind in list(svc.tickets.items()):
            outcome = _outcome(book, svc, kind)
            if outcome is not None:
                book.resolve(svc, ticket, *outcome)


def _outcome(book: Book, svc: ServiceState, kind: str) -> tuple[str, str] | None:
    if svc.state is S.FAILED:
        return "failed", f"{svc.name} failed to load: {svc.error}"
    if kind == "unload":
        if svc.state is S.STOPPED and not svc.sleeper_stopping:
            return "stopped", ""
        return None
    if kind != "load":
        return None  # a restart: answered about the new instance, once there is one
    if svc.state is S.READY:
        return "ready", ""
    if svc.state is not S.STOPPED or svc.sleeper_stopping:
        return None
    if svc.plan is None and (svc.wait is not None or svc.behind is not None):
        return "waiting", svc.waiting_text(book.now, book.clock) or ""
    if not book.wants(svc):
        if svc.error:
            return "refused", svc.error
        return "stopped", f"{svc.name} is no longer asked to load"
    return None
