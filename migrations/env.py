"""Alembic environment for vramd's SQLite database.

Two ways in:

- the daemon (``service.store.engine.open_store``) passes its own connection in
  ``config.attributes["connection"]``, so migrations run with the daemon's pragmas and
  inside its transaction handling;
- the ``alembic`` command builds an engine with the same settings from, in this order,
  the ``sqlalchemy.url`` option, ``-x db=PATH`` (or a URL), or ``$VRAMD_DB``.

``render_as_batch`` because SQLite can alter little in place: batch mode rebuilds the
table. Foreign keys are switched off for the run (a rebuilt parent table would otherwise
take its children's rows, or fail) and checked again before the commit.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from service.errors import StoreError
from service.store.engine import make_engine
from service.store.models import Base

config = context.config
target_metadata = Base.metadata

# Only the command line configures logging; inside the daemon that is the daemon's job.
if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    db = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get("VRAMD_DB")
    if not db:
        raise SystemExit(
            "no database given: run with -x db=PATH or set VRAMD_DB (e.g. data/vramd.db)"
        )
    if "://" in db:
        return db
    return f"sqlite:///{os.path.abspath(db)}"


def _set_foreign_keys(connection: Connection, on: bool) -> None:
    # PRAGMA foreign_keys is ignored inside a transaction, so it goes straight to the
    # driver before SQLAlchemy begins one.
    if connection.dialect.name == "sqlite" and not connection.in_transaction():
        connection.connection.driver_connection.execute(  # type: ignore[union-attr]
            f"PRAGMA foreign_keys = {'ON' if on else 'OFF'}"
        )


def _check_foreign_keys(connection: Connection) -> None:
    if connection.dialect.name != "sqlite":
        return
    broken = connection.execute(text("PRAGMA foreign_key_check")).fetchall()
    if broken:
        raise StoreError(
            f"migrating {connection.engine.url.database} would leave rows with broken "
            f"foreign keys {broken[:5]}; nothing was changed"
        )


def run_migrations(connection: Connection) -> None:
    _set_foreign_keys(connection, False)
    try:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,
            compare_type=True,
            # Our engine emits a real BEGIN, so SQLite DDL is transactional: a failed
            # upgrade leaves the file at the previous revision.
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()
            _check_foreign_keys(connection)
    finally:
        _set_foreign_keys(connection, True)


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        render_as_batch=True,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    engine = make_engine(make_url(database_url()))
    try:
        with engine.connect() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
