"""Migrations: the models and the Alembic revisions describe the same schema, startup
migrates by itself, the ``alembic`` command works from the repo root, and a failing
migration leaves the database as it was."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from service.errors import StoreError
from service.store import Store, migrations_dir, open_store
from service.store.models import Base

REPO = Path(__file__).resolve().parents[2]
ALEMBIC = Path(sys.executable).parent / "alembic"


def head_revision() -> str:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def schema_differences(store: Store) -> list[object]:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "render_as_batch": True}
        )
        return list(compare_metadata(context, Base.metadata))


def sqlite_scalar(path: Path, sql: str) -> object:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        conn.close()
    return {name for (name,) in rows} - {"sqlite_sequence"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(tmp_path / "new" / "vramd.db")
    yield store
    store.close()


def test_fresh_database_is_migrated_to_head(store: Store) -> None:
    with store.engine.connect() as conn:
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    assert version == head_revision()
    assert tables(store.path) == {t.name for t in Base.metadata.sorted_tables} | {"alembic_version"}


def test_models_and_migrations_agree(store: Store) -> None:
    assert schema_differences(store) == []


def test_connections_use_wal_foreign_keys_and_a_busy_timeout(store: Store) -> None:
    with store.session() as s:
        assert s.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert s.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
        assert s.execute(text("PRAGMA busy_timeout")).scalar_one() == 5000
        assert s.execute(text("PRAGMA synchronous")).scalar_one() == 1  # NORMAL


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(IntegrityError, match="FOREIGN KEY"), store.session() as s:
        s.execute(
            text(
                "INSERT INTO maintenance_windows (name, origin, duration_s, timezone, restart,"
                " allow, created_at, policy_version)"
                " VALUES ('w', 'policy', 1, 'UTC', '\"all\"', '[]', 0, 42)"
            )
        )


def test_opening_twice_is_idempotent(store: Store) -> None:
    again = open_store(store.path)
    try:
        assert schema_differences(again) == []
        with again.engine.connect() as conn:
            count = conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one()
        assert count == 1
    finally:
        again.close()


def test_alembic_command_upgrades_and_downgrades_from_the_repo_root(tmp_path: Path) -> None:
    path = tmp_path / "cli.db"
    env = {**os.environ, "VRAMD_DB": str(path)}
    env.pop("VRAMD_MIGRATIONS", None)

    def alembic(*args: str, **extra_env: str) -> None:
        result = subprocess.run(
            [str(ALEMBIC), "-c", "alembic.ini", *args],
            cwd=REPO,
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr

    alembic("upgrade", "head")
    assert sqlite_scalar(path, "SELECT version_num FROM alembic_version") == head_revision()
    assert sqlite_scalar(path, "PRAGMA journal_mode") == "wal"  # same engine settings

    # -x db= wins over $VRAMD_DB, which here points somewhere else.
    alembic("-x", f"db={path}", "downgrade", "base", VRAMD_DB=str(tmp_path / "other.db"))
    assert tables(path) == {"alembic_version"}
    assert not (tmp_path / "other.db").exists()

    store = open_store(path)  # and back up, by the daemon's own path
    try:
        assert schema_differences(store) == []
    finally:
        store.close()


BROKEN_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "9999_broken"
down_revision = HEAD
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("half_done", sa.Column("id", sa.Integer, primary_key=True))
    op.execute(STATEMENT)


def downgrade() -> None:
    op.drop_table("half_done")
"""


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("INSERT INTO policy_versions (text) VALUES ('x')", "NOT NULL"),
        # Foreign keys are off while migrating; the check before the commit catches this.
        (
            "INSERT INTO maintenance_windows (name, origin, duration_s, timezone, restart,"
            " allow, created_at, policy_version)"
            " VALUES ('w', 'policy', 1, 'UTC', '1', '[]', 0, 42)",
            "broken foreign keys",
        ),
    ],
)
def test_failed_migration_leaves_the_database_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statement: str, message: str
) -> None:
    path = tmp_path / "vramd.db"
    open_store(path).close()
    head = head_revision()
    broken = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "versions" / "9999_broken.py").write_text(
        f"STATEMENT = {statement!r}\nHEAD = {head!r}\n{BROKEN_REVISION}"
    )
    monkeypatch.setenv("VRAMD_MIGRATIONS", str(broken))

    with pytest.raises(StoreError, match=message) as info:
        open_store(path)

    assert str(path) in str(info.value)
    assert sqlite_scalar(path, "SELECT version_num FROM alembic_version") == head
    assert "half_done" not in tables(path)


def test_missing_migrations_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMD_MIGRATIONS", str(tmp_path / "nowhere"))
    with pytest.raises(StoreError, match="VRAMD_MIGRATIONS"):
        open_store(tmp_path / "vramd.db")


def test_a_version_1_database_keeps_its_rules_and_reads_protect_as_never(tmp_path: Path) -> None:
    """0002 adds services.protect_s to a database written before it: rows stay, and the
    missing figure reads as version 1's rule (a lower priority never evicted)."""
    path = tmp_path / "old.db"
    env = {k: v for k, v in os.environ.items() if k != "VRAMD_MIGRATIONS"}
    result = subprocess.run(
        [str(ALEMBIC), "-c", "alembic.ini", "-x", f"db={path}", "upgrade", "0001"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO policy_versions (version, text, sha256, source, applied_at, active)"
            " VALUES (1, 'version: 1', 'x', 'test', 0, 1)"
        )
        conn.execute(
            "INSERT INTO services (name, kind, models, command, env, health, residency,"
            " priority, preload, estimate_bytes, on_cap, idle_ttl_s, max_concurrency,"
            " queue_max, queue_timeout_s, startup_timeout_s, stop_timeout_s, restart, spec,"
            " policy_version) VALUES ('chat', 'chat', '[\"m\"]', '[\"x\"]', '{}', '/health',"
            " 'warm', 300, 0, 1, 'restart', 0, 4, 64, 120, 120, 15, '{}', '{}', 1)"
        )
    conn.close()
    store = open_store(path)
    try:
        assert schema_differences(store) == []
        with store.engine.connect() as c:
            row = c.execute(text("SELECT name, priority, protect_s FROM services")).one()
        assert tuple(row) == ("chat", 300, None)
    finally:
        store.close()
