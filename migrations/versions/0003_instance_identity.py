"""instances: what a daemon needs to adopt a runtime another daemon started.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04

A runtime outlives the daemon that started it (docs/operations.md, "Restarts and
upgrades"); the next daemon adopts it when it is the same service under the same command.
It needs, beside pid, group, start time and port: ``identity`` (the SHA-256 of what
defines the service's process in the policy), ``argv`` as launched, ``devices`` it was
placed on, ``output`` (the base path of its output files), ``asleep`` (put to sleep:
not adopted, its weights are in host memory), ``vramd_version`` (of the daemon that
started it) and ``adopted_at`` (set by each daemon that adopts it). Rows written before
this revision have no identity, so their runtimes are never adopted, only reaped.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("identity", sa.String(length=64), nullable=True),
    sa.Column("argv", sa.JSON(), nullable=True),
    sa.Column("devices", sa.JSON(), nullable=True),
    sa.Column("output", sa.String(length=4096), nullable=True),
    sa.Column("asleep", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("vramd_version", sa.String(length=32), nullable=True),
    sa.Column("adopted_at", sa.Float(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        for column in COLUMNS:
            batch.add_column(column)


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column.name)
