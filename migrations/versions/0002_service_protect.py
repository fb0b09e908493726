"""services.protect_s: how long an idle instance keeps its memory (DESIGN section 4).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Admission version 2 adds the per-service ``protect`` key. The column is nullable:
NULL means ``never`` (rows written before this revision were stored under version 1,
whose rule was exactly that: a lower priority never evicted a higher one), a number is
seconds. The next policy apply rewrites every row with its effective value.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.add_column(sa.Column("protect_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.drop_column("protect_s")
