"""The rules the daemon runs by: policy versions, service rows, maintenance windows.

Applying a policy is one transaction (docs/policy.md, "Applying a changed policy"):
``store_policy_version`` then ``replace_active_rules`` in the same session, so a failure
leaves the previous version and its rules in place. Windows created through the API live
in the same table with ``origin="api"`` and are never touched by a policy apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import MaintenanceWindow, PolicyVersion, ServiceRule

ORIGIN_POLICY = "policy"
ORIGIN_API = "api"

# --------------------------------------------------------------------------- versions


def store_policy_version(
    session: Session, *, text: str, sha256: str, source: str, applied_at: float
) -> PolicyVersion:
    """Record an applied policy text and make it the active version.

    Re-applying the text that is already active returns that version unchanged, so a
    daemon restart or a repeated ``vramd apply`` does not grow the history. Any other text
    (including an older one, as in a rollback) becomes a new version: history only grows.
    """
    active = active_policy_version(session)
    if active is not None and active.sha256 == sha256:
        return active
    _deactivate_all(session)
    version = PolicyVersion(
        text=text, sha256=sha256, source=source, applied_at=applied_at, active=True
    )
    session.add(version)
    session.flush()
    return version


def active_policy_version(session: Session) -> PolicyVersion | None:
    """The version the daemon runs by, or None before the first apply."""
    return session.scalars(
        select(PolicyVersion).where(PolicyVersion.active.is_(True)).limit(1)
    ).first()


def policy_history(session: Session, *, limit: int = 50) -> list[PolicyVersion]:
    """The most recent versions, newest first."""
    stmt = select(PolicyVersion).order_by(PolicyVersion.version.desc()).limit(limit)
    return list(session.scalars(stmt))


def get_policy_version(session: Session, *, version: int) -> PolicyVersion | None:
    return session.get(PolicyVersion, version)


def activate_policy_version(session: Session, *, version: int) -> PolicyVersion:
    """Make an existing version the active one (the caller rewrites the rules with it).

    Raises ``LookupError`` for an unknown version, leaving the active one as it was.
    """
    target = session.get(PolicyVersion, version)
    if target is None:
        raise LookupError(f"no policy version {version}")
    if not target.active:
        _deactivate_all(session)
        target.active = True
        session.flush()
    return target


def _deactivate_all(session: Session) -> None:
    # Flushed before the new active row is written: the partial unique index on
    # ``active`` allows one active row at any moment, not only at commit.
    for version in session.scalars(select(PolicyVersion).where(PolicyVersion.active.is_(True))):
        version.active = False
    session.flush()


# --------------------------------------------------------------------------- rules

SERVICE_COLUMNS = frozenset(ServiceRule.__table__.columns.keys())
_SERVICE_OPTIONAL = frozenset(
    {"cwd", "metrics", "upstream_model", "cap_bytes", "gpus", "spec", "protect_s"}
)
WINDOW_POLICY_KEYS = frozenset(
    {"name", "cron", "start_at", "duration_s", "timezone", "restart", "allow"}
)
_WINDOW_OPTIONAL = frozenset({"cron", "start_at"})


def replace_active_rules(
    session: Session,
    *,
    version: int,
    services: Sequence[Mapping[str, Any]],
    windows: Sequence[Mapping[str, Any]],
) -> None:
    """Make ``services`` and ``windows`` the normalized rules of policy ``version``.

    ``services``: one dict per service with the ``services`` columns as keys: ``name``,
    ``kind``, ``models``, ``command``, ``env``, ``health``, ``residency``, ``priority``,
    ``preload``, ``estimate_bytes``, ``on_cap``, ``idle_ttl_s``, ``max_concurrency``,
    ``queue_max``, ``queue_timeout_s``, ``startup_timeout_s``, ``stop_timeout_s``,
    ``restart`` (required) and ``cwd``, ``metrics``, ``upstream_model``, ``cap_bytes``,
    ``gpus``, ``protect_s`` (default None; ``protect_s`` None is ``never``), ``spec``
    (default: the dict itself). Sizes are bytes, durations seconds.

    ``windows``: one dict per policy window with ``name``, ``duration_s``, ``timezone``,
    ``restart`` (``"flagged"``/``"all"``/``"none"`` or a list of services), ``allow``
    (required) and ``cron``, ``start_at`` (default None).

    Services and policy windows not in the lists are deleted; API windows are kept. A
    policy window named like an API window raises ``ValueError`` (names are unique and the
    operator's window is not ours to overwrite), as do unknown or missing keys; the
    caller's transaction then rolls back and the previous rules stay.
    """
    policy = session.get(PolicyVersion, version)
    if policy is None:
        raise LookupError(f"no policy version {version}")

    existing_services = {rule.name: rule for rule in session.scalars(select(ServiceRule))}
    wanted_services = {str(spec["name"]): spec for spec in services}
    for name, rule in existing_services.items():
        if name not in wanted_services:
            session.delete(rule)
    for name, spec in wanted_services.items():
        values = _service_values(spec)
        values["policy_version"] = version
        _upsert(session, existing_services.get(name), ServiceRule, values)

    existing_windows = {w.name: w for w in session.scalars(select(MaintenanceWindow))}
    wanted_windows = {str(spec["name"]): spec for spec in windows}
    for name, window in existing_windows.items():
        if window.origin == ORIGIN_POLICY and name not in wanted_windows:
            session.delete(window)
    for name, spec in wanted_windows.items():
        current = existing_windows.get(name)
        if current is not None and current.origin != ORIGIN_POLICY:
            raise ValueError(
                f"policy window {name!r} has the name of a window created through the API; "
                "rename one of them"
            )
        values = _checked(spec, WINDOW_POLICY_KEYS, _WINDOW_OPTIONAL, "maintenance window")
        values.update(origin=ORIGIN_POLICY, policy_version=version)
        if current is None:
            values["created_at"] = policy.applied_at
        _upsert(session, current, MaintenanceWindow, values)
    session.flush()


def list_services(session: Session) -> list[ServiceRule]:
    """The active service rules, by name."""
    return list(session.scalars(select(ServiceRule).order_by(ServiceRule.name)))


def _service_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    allowed = SERVICE_COLUMNS - {"policy_version"}
    values = _checked(spec, allowed, _SERVICE_OPTIONAL, "service")
    if values["spec"] is None:
        values["spec"] = dict(spec)
    return values


def _checked(
    spec: Mapping[str, Any], allowed: frozenset[str], optional: frozenset[str], what: str
) -> dict[str, Any]:
    """The dict with optional keys defaulted to None; unknown or missing keys raise."""
    name = spec.get("name", "?")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"{what} {name!r}: unknown keys {', '.join(unknown)}")
    missing = sorted(allowed - optional - set(spec))
    if missing:
        raise ValueError(f"{what} {name!r}: missing keys {', '.join(missing)}")
    values = {key: None for key in optional & allowed}
    values.update(spec)
    return values


def _upsert(
    session: Session,
    current: ServiceRule | MaintenanceWindow | None,
    model: type[ServiceRule] | type[MaintenanceWindow],
    values: Mapping[str, Any],
) -> None:
    if current is None:
        session.add(model(**values))
        return
    for key, value in values.items():
        if getattr(current, key) != value:
            setattr(current, key, value)


# --------------------------------------------------------------------------- api windows


def add_api_window(
    session: Session,
    *,
    name: str,
    start_at: float,
    duration_s: float,
    restart: str | list[str],
    allow: list[str],
    timezone: str = "UTC",
    created_at: float,
) -> MaintenanceWindow:
    """Store a one-off window an operator scheduled; it survives restarts and applies.

    Raises ``ValueError`` when any window (policy or API) already has this name.
    """
    if session.get(MaintenanceWindow, name) is not None:
        raise ValueError(f"a maintenance window named {name!r} already exists")
    window = MaintenanceWindow(
        name=name,
        origin=ORIGIN_API,
        cron=None,
        start_at=start_at,
        duration_s=duration_s,
        timezone=timezone,
        restart=restart,
        allow=allow,
        created_at=created_at,
        policy_version=None,
    )
    session.add(window)
    session.flush()
    return window


def delete_api_window(session: Session, *, name: str) -> bool:
    """Delete a window created through the API; False if there is none by that name.

    Policy windows are not deleted here (they come back with the next apply): the
    caller answers that they must be removed from the policy file.
    """
    window = session.get(MaintenanceWindow, name)
    if window is None or window.origin != ORIGIN_API:
        return False
    session.delete(window)
    session.flush()
    return True


def list_windows(session: Session) -> list[MaintenanceWindow]:
    """Every window, policy and API, by name."""
    return list(session.scalars(select(MaintenanceWindow).order_by(MaintenanceWindow.name)))
