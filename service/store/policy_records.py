"""Storing a validated policy: its full text as a version, and its rules normalized.

The rules the daemon runs by live in SQLite, one row per service and per maintenance
window, so they can be queried and survive restarts; the YAML text is kept whole beside
them so any version can be shown or rolled back to (docs/policy.md, "Applying a changed
policy").
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy.orm import Session

from service.errors import PolicyError, PolicyIssue
from service.policy import NEVER, Policy, Service, Window
from service.store import queries


def window_conflicts(session: Session, *, policy: Policy) -> list[PolicyIssue]:
    """Policy windows named like a one-off window an operator created through the API."""
    taken = {row.name for row in queries.list_windows(session) if row.origin == "api"}
    return [
        PolicyIssue(
            f"maintenance.windows[{i}].name",
            f"a one-off window named {window.name!r} was created through the API; delete "
            f"it first (vramd windows rm {window.name}) or choose another name",
        )
        for i, window in enumerate(policy.maintenance.windows)
        if window.name in taken
    ]


def policy_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def persist_policy(
    session: Session, *, policy: Policy, text: str, source: str, now: float
) -> tuple[int, bool]:
    """Store ``text`` as the active version and write its rules; return (version, is_new).

    The same text again (same sha256 as the active version) keeps the active version and
    rewrites nothing. Raises ``PolicyError`` (nothing written) for a window whose name an
    operator already gave a one-off window through the API.
    """
    conflicts = window_conflicts(session, policy=policy)
    if conflicts:
        raise PolicyError(conflicts)
    sha = policy_sha256(text)
    active = queries.active_policy_version(session)
    if active is not None and active.sha256 == sha:
        return active.version, False
    record = queries.store_policy_version(
        session, text=text, sha256=sha, source=source, applied_at=now
    )
    queries.replace_active_rules(
        session,
        version=record.version,
        services=[service_row(name, svc) for name, svc in policy.services.items()],
        windows=[window_row(window) for window in policy.maintenance.windows],
    )
    return record.version, True


def service_row(name: str, service: Service) -> dict[str, Any]:
    """One ``services`` row: the effective values after defaults were merged."""
    return {
        "name": name,
        "kind": service.kind.value,
        "models": list(service.models),
        "command": list(service.command),
        "env": dict(service.env),
        "cwd": service.cwd,
        "health": service.health,
        "metrics": service.metrics,
        "upstream_model": service.upstream_model,
        "residency": service.residency.value,
        "priority": service.priority,
        "preload": service.preload,
        "estimate_bytes": service.memory.estimate,
        "cap_bytes": service.memory.cap,
        "on_cap": service.memory.on_cap.value,
        "idle_ttl_s": service.idle_ttl or 0.0,
        "protect_s": None if service.protect in (None, NEVER) else float(service.protect),
        "max_concurrency": service.max_concurrency,
        "queue_max": service.queue.max,
        "queue_timeout_s": service.queue.timeout,
        "startup_timeout_s": service.startup_timeout,
        "stop_timeout_s": service.stop_timeout,
        "gpus": list(service.gpus) if service.gpus is not None else None,
        "restart": service.restart.model_dump(mode="json"),
        "spec": service.model_dump(mode="json"),
    }


def window_row(window: Window) -> dict[str, Any]:
    return {
        "name": window.name,
        "cron": window.cron,
        "duration_s": window.duration,
        "timezone": window.timezone,
        "restart": window.restart if isinstance(window.restart, str) else list(window.restart),
        "allow": list(window.allow),
    }
