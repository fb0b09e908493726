"""usage_hours: each client's use of each service, per hour.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

Requests, errors by code, tokens in and out, runtime seconds, images and audio seconds,
per (hour, client, service) (docs/operations.md, "Usage per client"). Kept like events:
rows are small, one per client and service per hour of use.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_hours",
        sa.Column("hour", sa.Float(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("service", sa.String(length=64), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("tokens_in", sa.BigInteger(), nullable=False),
        sa.Column("tokens_out", sa.BigInteger(), nullable=False),
        sa.Column("runtime_s", sa.Float(), nullable=False),
        sa.Column("images", sa.Integer(), nullable=False),
        sa.Column("audio_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "client", "service", name=op.f("pk_usage_hours")),
    )
    op.create_index("ix_usage_hours_client_hour", "usage_hours", ["client", "hour"])


def downgrade() -> None:
    op.drop_index("ix_usage_hours_client_hour", table_name="usage_hours")
    op.drop_table("usage_hours")
