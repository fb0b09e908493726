"""The core's words and small judgements: why a request waited, why a service refuses.

Kept apart from ``core`` so the event handlers read as decisions; every message here is
one an operator or a client sees (queue timeouts, refusals, ``vramd ps``).
"""

from __future__ import annotations

from service.domain import InstanceState, Residency
from service.scheduler.admission import ClockText, when_text
from service.scheduler.state import ServiceState

S = InstanceState


def expired_idle(svc: ServiceState, now: float) -> float | None:
    """How long ``svc`` has been idle, if that is past its idle TTL (pinned: never)."""
    ttl = svc.rule.idle_ttl_s
    if svc.state is not S.READY or svc.rule.residency is Residency.PINNED or ttl <= 0:
        return None
    if not svc.idle or svc.last_used is None or now - svc.last_used < ttl:
        return None
    return now - svc.last_used


def what_it_waited_for(
    svc: ServiceState, now: float, clock: ClockText | None = None
) -> tuple[str | None, float | None]:
    """What a queued request of ``svc`` was waiting for, and when that may change."""
    if svc.state in (S.DRAINING, S.STOPPING):
        return f"{svc.name} was stopping ({svc.stop_reason})", None
    if svc.plan is not None:
        victims = ", ".join(sorted(svc.plan.victims))
        return f"{svc.name} was waiting for {victims} to stop", None
    text = svc.waiting_text(now, clock) if svc.state is S.STOPPED else None
    if text is not None:
        yields = svc.wait.yields_at() if svc.wait is not None else None
        return text, None if yields is None else max(0.0, yields - now)
    if svc.state is S.STARTING and svc.retry_at is not None:
        return backoff_text(svc, now, clock), max(0.0, svc.retry_at - now)
    if svc.state is S.STARTING:
        return f"{svc.name} was still loading", None
    if svc.state is S.READY:
        slots = svc.rule.max_concurrency
        return f"all {slots} slot(s) of {svc.name} were busy", None
    return None, None


def backoff_text(svc: ServiceState, now: float, clock: ClockText | None) -> str:
    """``chat died after being ready (killed by signal SIGKILL); it starts again by
    12:03:10``, or ``… failed to start …``, while its backoff runs."""
    what = "died after being ready" if svc.crashed else "failed to start"
    text = f"{svc.name} {what} ({svc.error or 'no error given'})"
    if svc.retry_at is None:
        return text
    return f"{text}; it starts again {when_text(svc.retry_at, now, clock)}"


def failed_message(svc: ServiceState) -> str:
    why = f" ({svc.error})" if svc.error else ""
    return (
        f"{svc.name} is crash-looping{why}; load it again with POST /api/services/{svc.name}/load"
    )


def unloaded_message(svc: ServiceState) -> str:
    if svc.rule.residency is Residency.PINNED:
        hint = f"load it again with POST /api/services/{svc.name}/load"
    else:
        hint = "a new request loads it again"
    return f"{svc.name} was unloaded by an operator; {hint}"
