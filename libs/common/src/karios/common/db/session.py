"""Async SQLModel sessions on asyncpg, and the idempotent-consumer helper."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.errors import ServiceUnavailable


class Database:
    def __init__(self, url: str, *, pool_size: int = 5) -> None:
        self.url = url
        self.engine: AsyncEngine = create_async_engine(url, pool_size=pool_size, pool_pre_ping=True)
        # expire_on_commit=False: attribute access after commit would otherwise need I/O.
        self.sessions = async_sessionmaker(self.engine, class_=AsyncSession, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as s:
            yield s

    async def healthy(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except Exception:
            return False
        return True

    async def ping_or_raise(self) -> None:
        if not await self.healthy():
            raise ServiceUnavailable("database unreachable")

    async def close(self) -> None:
        await self.engine.dispose()


_processed_tables: dict[str, sa.Table] = {}


def processed_messages_table(metadata: sa.MetaData, schema: str) -> sa.Table:
    """The ``<schema>.processed_messages`` table of one service (one per owning schema)."""
    key = f"{schema}.processed_messages"
    if key in metadata.tables:
        return metadata.tables[key]
    return sa.Table(
        "processed_messages",
        metadata,
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("message_id", sa.String(64), primary_key=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )


async def claim_message(session: AsyncSession, table: sa.Table, consumer: str, message_id: str) -> bool:
    """Record ``message_id`` as processed inside the caller's transaction.

    Returns False if it was already processed (the caller must then skip its state change).
    The record commits or rolls back together with the state change, so a crash between
    the two cannot leave one without the other.
    """
    stmt = (
        pg_insert(table)
        .values(consumer=consumer, message_id=message_id, processed_at=datetime.now(UTC))
        .on_conflict_do_nothing()
        .returning(table.c.message_id)
    )
    result = await session.execute(stmt)
    return result.first() is not None
