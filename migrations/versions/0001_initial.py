"""Initial schema: rules, history and measurements (DESIGN section 8).

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written from an autogenerate run against an empty database, then ordered by concept.
Parents come first and go last: services and maintenance_windows reference
policy_versions. Dropping a table drops its indexes with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # -- rules ---------------------------------------------------------------
    op.create_table(
        "policy_versions",
        sa.Column("version", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=1024), nullable=False),
        sa.Column("applied_at", sa.Float(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("version", name="pk_policy_versions"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_policy_versions_sha256", "policy_versions", ["sha256"])
    op.create_index(
        "uq_policy_versions_active",
        "policy_versions",
        ["active"],
        unique=True,
        sqlite_where=sa.text("active"),
    )

    op.create_table(
        "services",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("cwd", sa.String(length=4096), nullable=True),
        sa.Column("health", sa.String(length=1024), nullable=False),
        sa.Column("metrics", sa.String(length=1024), nullable=True),
        sa.Column("upstream_model", sa.String(length=256), nullable=True),
        sa.Column("residency", sa.String(length=32), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preload", sa.Boolean(), nullable=False),
        sa.Column("estimate_bytes", sa.BigInteger(), nullable=False),
        sa.Column("cap_bytes", sa.BigInteger(), nullable=True),
        sa.Column("on_cap", sa.String(length=16), nullable=False),
        sa.Column("idle_ttl_s", sa.Float(), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("queue_max", sa.Integer(), nullable=False),
        sa.Column("queue_timeout_s", sa.Float(), nullable=False),
        sa.Column("startup_timeout_s", sa.Float(), nullable=False),
        sa.Column("stop_timeout_s", sa.Float(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=True),
        sa.Column("restart", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["policy_version"],
            ["policy_versions.version"],
            name="fk_services_policy_version_policy_versions",
        ),
        sa.PrimaryKeyConstraint("name", name="pk_services"),
    )
    op.create_index("ix_services_policy_version", "services", ["policy_version"])

    op.create_table(
        "maintenance_windows",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("cron", sa.String(length=128), nullable=True),
        sa.Column("start_at", sa.Float(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("restart", sa.JSON(), nullable=False),
        sa.Column("allow", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["policy_version"],
            ["policy_versions.version"],
            name="fk_maintenance_windows_policy_version_policy_versions",
        ),
        sa.PrimaryKeyConstraint("name", name="pk_maintenance_windows"),
    )

    # -- history -------------------------------------------------------------
    op.create_table(
        "instances",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("service", sa.String(length=64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pgid", sa.Integer(), nullable=False),
        sa.Column("proc_start_time", sa.Float(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("device", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ready_at", sa.Float(), nullable=True),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("reaped", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_instances"),
    )
    op.create_index("ix_instances_service", "instances", ["service"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("service", sa.String(length=64), nullable=True),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_service", "events", ["service"])
    op.create_index("ix_events_ts", "events", ["ts"])

    op.create_table(
        "maintenance_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("window", sa.String(length=128), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("actions", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_maintenance_runs"),
    )
    op.create_index("ix_maintenance_runs_window", "maintenance_runs", ["window"])

    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("service", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
    )
    op.create_index("ix_incidents_service", "incidents", ["service"])
    op.create_index("ix_incidents_ts", "incidents", ["ts"])

    # -- measurements --------------------------------------------------------
    op.create_table(
        "device_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("used_bytes", sa.BigInteger(), nullable=False),
        sa.Column("free_bytes", sa.BigInteger(), nullable=False),
        sa.Column("foreign_bytes", sa.BigInteger(), nullable=False),
        sa.Column("budget_bytes", sa.BigInteger(), nullable=False),
        sa.Column("resolution", sa.String(length=4), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_device_samples"),
    )
    op.create_index("ix_device_samples_device_ts", "device_samples", ["device", "ts"])
    op.create_index("ix_device_samples_resolution_ts", "device_samples", ["resolution", "ts"])

    op.create_table(
        "instance_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("service", sa.String(length=64), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("device_bytes", sa.BigInteger(), nullable=False),
        sa.Column("host_bytes", sa.BigInteger(), nullable=False),
        sa.Column("kv_cache_bytes", sa.BigInteger(), nullable=True),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("requests_served", sa.Integer(), nullable=False),
        sa.Column("resolution", sa.String(length=4), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_instance_samples"),
    )
    op.create_index("ix_instance_samples_service_ts", "instance_samples", ["service", "ts"])
    op.create_index("ix_instance_samples_resolution_ts", "instance_samples", ["resolution", "ts"])

    op.create_table(
        "service_stats",
        sa.Column("service", sa.String(length=64), nullable=False),
        sa.Column("learned_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("learned_load_s", sa.Float(), nullable=True),
        sa.Column("loads", sa.Integer(), nullable=False),
        sa.Column("evictions", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("requests_served", sa.Integer(), nullable=False),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("service", name="pk_service_stats"),
    )


def downgrade() -> None:
    for table in (
        "service_stats",
        "instance_samples",
        "device_samples",
        "incidents",
        "maintenance_runs",
        "events",
        "instances",
        "maintenance_windows",
        "services",
        "policy_versions",
    ):
        op.drop_table(table)
