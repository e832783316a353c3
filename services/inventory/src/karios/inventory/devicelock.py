"""SQL: a transaction-scoped PostgreSQL advisory lock per NetBox device, so that two replicas (or an
inspection and an adoption) never write back to one device at once — the second reads what the
first wrote and finds nothing left to do."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import sqlalchemy as sa

from karios.common.db import Database

PREFIX = "karios.inventory.writeback:"


@contextlib.asynccontextmanager
async def device_lock(db: Database | None, key: str) -> AsyncIterator[None]:
    """Held until the block ends (no database: no other replica to keep out, no lock)."""
    if db is None:
        yield
        return
    async with db.session() as session, session.begin():
        await session.exec(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(PREFIX + key))))
        yield
