"""The SQLite schema as typed SQLAlchemy models."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints let batch migrations (SQLite's copy-and-move) find them again later.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# None is SQL NULL, not the JSON text "null", so NOT NULL JSON columns really refuse it.
JSONValue = JSON(none_as_null=True)

# Sample resolutions: fine rows are kept for an hour, then folded into coarse ones.
FINE = "1s"
COARSE = "1m"


class Base(DeclarativeBase):
    """Three kinds of table live here:

    - **rules**: ``policy_versions`` (every applied YAML text), ``services`` and
      ``maintenance_windows`` (the active rules, normalized so they can be queried and
      survive restarts);
    - **history**: ``instances``, ``events``, ``maintenance_runs``, ``incidents``;
    - **measurements**: ``device_samples``, ``instance_samples`` (downsampled, see
      ``queries_samples``), ``service_stats`` (learned figures and counters) and
      ``usage_hours`` (each client's use of each service, per hour).

    Conventions: timestamps are float epoch seconds, sizes are integer bytes (``*_bytes``),
    durations are float seconds (``*_s``). History tables name a service by its string, not
    by a foreign key, because history must outlive the service's rule. The only foreign keys
    point at ``policy_versions``, whose rows are never deleted.

    Any change here needs an Alembic revision in ``migrations/versions``;
    ``tests/process/test_migrations.py`` fails when the two disagree.
    """

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# --------------------------------------------------------------------------- rules


class PolicyVersion(Base):
    """One applied policy text. Exactly one row is active once any policy was applied."""

    __tablename__ = "policy_versions"
    __table_args__ = (
        # The database itself refuses a second active version.
        Index("uq_policy_versions_active", "active", unique=True, sqlite_where=text("active")),
        # AUTOINCREMENT: a version number is never reused, so history links stay unambiguous.
        {"sqlite_autoincrement": True},
    )

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    text: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    source: Mapped[str] = mapped_column(String(1024))
    applied_at: Mapped[float] = mapped_column(Float)
    active: Mapped[bool] = mapped_column(Boolean, default=False)


class ServiceRule(Base):
    """The active rule of one service, one column per policy key (sizes in bytes).

    ``spec`` keeps the whole normalized service dict as well, so a key added to the
    policy later is stored before it earns a column.
    """

    __tablename__ = "services"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    models: Mapped[list[str]] = mapped_column(JSONValue)
    command: Mapped[list[str]] = mapped_column(JSONValue)
    env: Mapped[dict[str, str]] = mapped_column(JSONValue)
    cwd: Mapped[str | None] = mapped_column(String(4096))
    health: Mapped[str] = mapped_column(String(1024))
    metrics: Mapped[str | None] = mapped_column(String(1024))
    upstream_model: Mapped[str | None] = mapped_column(String(256))
    residency: Mapped[str] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    preload: Mapped[bool] = mapped_column(Boolean)
    estimate_bytes: Mapped[int] = mapped_column(BigInteger)
    cap_bytes: Mapped[int | None] = mapped_column(BigInteger)
    on_cap: Mapped[str] = mapped_column(String(16))
    idle_ttl_s: Mapped[float] = mapped_column(Float)
    # ``protect`` in seconds; NULL is ``never`` (and pinned, which is never evicted).
    protect_s: Mapped[float | None] = mapped_column(Float)
    max_concurrency: Mapped[int] = mapped_column(Integer)
    queue_max: Mapped[int] = mapped_column(Integer)
    queue_timeout_s: Mapped[float] = mapped_column(Float)
    startup_timeout_s: Mapped[float] = mapped_column(Float)
    stop_timeout_s: Mapped[float] = mapped_column(Float)
    gpus: Mapped[list[int] | None] = mapped_column(JSONValue)
    restart: Mapped[dict[str, Any]] = mapped_column(JSONValue)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONValue)
    policy_version: Mapped[int] = mapped_column(ForeignKey("policy_versions.version"), index=True)


class MaintenanceWindow(Base):
    """A maintenance window, from the policy (``origin="policy"``) or the API (``"api"``).

    Policy windows recur (``cron``); API windows are one-off (``start_at``) and are left
    alone when a policy is applied, so an operator's scheduled restart survives it.
    """

    __tablename__ = "maintenance_windows"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    origin: Mapped[str] = mapped_column(String(16))
    cron: Mapped[str | None] = mapped_column(String(128))
    start_at: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    timezone: Mapped[str] = mapped_column(String(64))
    # "flagged" | "all" | "none" | [service, ...]
    restart: Mapped[str | list[str]] = mapped_column(JSONValue)
    allow: Mapped[list[str]] = mapped_column(JSONValue)
    created_at: Mapped[float] = mapped_column(Float)
    policy_version: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.version"))


# --------------------------------------------------------------------------- history


class InstanceRecord(Base):
    """One process (group) vramd started. ``stopped_at IS NULL`` means it may still run.

    ``proc_start_time`` (psutil ``create_time``) tells our process from an unrelated one
    that later got the same pid, so startup reaping never signals a stranger.
    """

    __tablename__ = "instances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service: Mapped[str] = mapped_column(String(64), index=True)
    pid: Mapped[int] = mapped_column(Integer)
    pgid: Mapped[int] = mapped_column(Integer)
    proc_start_time: Mapped[float] = mapped_column(Float)
    port: Mapped[int] = mapped_column(Integer)
    device: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    ready_at: Mapped[float | None] = mapped_column(Float)
    stopped_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reaped: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the next daemon needs to adopt it (migration 0003).
    identity: Mapped[str | None] = mapped_column(String(64))
    argv: Mapped[list[str] | None] = mapped_column(JSONValue)
    devices: Mapped[list[int] | None] = mapped_column(JSONValue)
    output: Mapped[str | None] = mapped_column(String(4096))
    asleep: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    vramd_version: Mapped[str | None] = mapped_column(String(32))
    adopted_at: Mapped[float | None] = mapped_column(Float)


class Event(Base):
    """Something that happened: a load, an eviction, a rejection, a state change, a flag."""

    __tablename__ = "events"
    # AUTOINCREMENT: ids are the cursor of event streams, so they must never go back.
    __table_args__ = (Index("ix_events_ts", "ts"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    service: Mapped[str | None] = mapped_column(String(64), index=True)
    instance_id: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONValue)


class MaintenanceRun(Base):
    """One run of a window: what it restarted or stopped, and when it ended."""

    __tablename__ = "maintenance_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    window: Mapped[str] = mapped_column(String(128), index=True)
    trigger: Mapped[str] = mapped_column(String(16))  # "schedule" | "manual"
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    actions: Mapped[list[Any]] = mapped_column(JSONValue)


class Incident(Base):
    """An out-of-memory failure with the evidence needed to diagnose it (docs/operations.md,
    "Fragmentation versus capacity")."""

    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    service: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # "load" | "request"
    verdict: Mapped[str | None] = mapped_column(String(32))  # "fragmentation" | "capacity"
    summary: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONValue)


# --------------------------------------------------------------------------- measurements


class DeviceSample(Base):
    """A device's memory at one moment (``resolution`` FINE) or over one minute (COARSE)."""

    __tablename__ = "device_samples"
    __table_args__ = (
        Index("ix_device_samples_device_ts", "device", "ts"),
        Index("ix_device_samples_resolution_ts", "resolution", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    device: Mapped[int] = mapped_column(Integer)
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    used_bytes: Mapped[int] = mapped_column(BigInteger)
    free_bytes: Mapped[int] = mapped_column(BigInteger)
    foreign_bytes: Mapped[int] = mapped_column(BigInteger)
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    resolution: Mapped[str] = mapped_column(String(4), default=FINE)


class InstanceSample(Base):
    """One instance's footprint at one moment (FINE) or over one minute (COARSE)."""

    __tablename__ = "instance_samples"
    __table_args__ = (
        Index("ix_instance_samples_service_ts", "service", "ts"),
        Index("ix_instance_samples_resolution_ts", "resolution", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    service: Mapped[str] = mapped_column(String(64))
    instance_id: Mapped[int] = mapped_column(Integer)
    device_bytes: Mapped[int] = mapped_column(BigInteger)
    host_bytes: Mapped[int] = mapped_column(BigInteger)
    kv_cache_bytes: Mapped[int | None] = mapped_column(BigInteger)
    in_flight: Mapped[int] = mapped_column(Integer)
    requests_served: Mapped[int] = mapped_column(Integer)
    resolution: Mapped[str] = mapped_column(String(4), default=FINE)


class ServiceStats(Base):
    """What vramd has learned about a service; keyed by name so it survives policy changes.

    ``learned_peak_bytes`` and ``learned_load_s`` are None until first measured: a zero
    would read as "needs nothing" to the admission arithmetic.
    """

    __tablename__ = "service_stats"

    service: Mapped[str] = mapped_column(String(64), primary_key=True)
    learned_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    learned_load_s: Mapped[float | None] = mapped_column(Float)
    loads: Mapped[int] = mapped_column(Integer, default=0)
    evictions: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    requests_served: Mapped[int] = mapped_column(Integer, default=0)
    flags: Mapped[list[str]] = mapped_column(JSONValue, default=list)
    last_error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[float | None] = mapped_column(Float)


class UsageHour(Base):
    """One client's use of one service in one hour (docs/operations.md, "Usage per client").

    ``hour`` is the hour's start (epoch seconds); ``errors`` counts the requests that did
    not end ``ok``, by code.
    """

    __tablename__ = "usage_hours"
    __table_args__ = (Index("ix_usage_hours_client_hour", "client", "hour"),)

    hour: Mapped[float] = mapped_column(Float, primary_key=True)
    client: Mapped[str] = mapped_column(String(64), primary_key=True)
    service: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[dict[str, int]] = mapped_column(JSONValue, default=dict)
    tokens_in: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_out: Mapped[int] = mapped_column(BigInteger, default=0)
    runtime_s: Mapped[float] = mapped_column(Float, default=0.0)
    images: Mapped[int] = mapped_column(Integer, default=0)
    audio_s: Mapped[float] = mapped_column(Float, default=0.0)
