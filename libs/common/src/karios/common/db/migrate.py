"""Alembic migrations, one schema (and one version table) per owning service.

Each service ships ``migrations/`` (``env.py`` calls :func:`run_env`, ``versions/`` holds
hand-reviewed revisions). :func:`upgrade` runs one service's chain programmatically.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import sqlalchemy as sa
from alembic import command, context
from alembic.config import Config
from sqlalchemy.ext.asyncio import create_async_engine


def alembic_config(script_location: Path, url: str, schema: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["karios_schema"] = schema
    return cfg


def upgrade(script_location: Path, url: str, schema: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(script_location, url, schema), revision)


def run_env(target_metadata: sa.MetaData) -> None:
    """Body of every service's ``env.py`` (online, async)."""
    cfg = context.config
    schema = cfg.attributes["karios_schema"]
    url = cfg.get_main_option("sqlalchemy.url")

    def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
        table_schema = (
            getattr(obj, "schema", None)
            if type_ == "table"
            else getattr(obj.table, "schema", None)
            if hasattr(obj, "table")
            else schema
        )
        return table_schema == schema

    def do_run(connection: sa.Connection) -> None:
        connection.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table_schema=schema,
            include_schemas=True,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()

    async def run_async() -> None:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            # Serialise concurrent upgrades of the same schema (several replicas starting at once).
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:s))"), {"s": schema})
            await conn.run_sync(do_run)
        await engine.dispose()

    asyncio.run(run_async())


async def ensure_database(url: str) -> None:
    """Create the database named in ``url`` if it does not exist (embedded default, tests)."""
    u = sa.engine.make_url(url)
    admin = create_async_engine(u.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            exists = (
                await conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname=:n"), {"n": u.database})
            ).first()
            if not exists:
                # Another service may create it at the same moment.
                with contextlib.suppress(sa.exc.IntegrityError, sa.exc.ProgrammingError):
                    await conn.execute(sa.text(f'CREATE DATABASE "{u.database}"'))
    finally:
        await admin.dispose()
