"""The services' connection pool on the real PostgreSQL (`karios.common.db.session.Database`).

A checkout costs no round trip (SQLAlchemy's pre-ping sent ``BEGIN; ; ROLLBACK;`` before every
transaction: a third of a short transaction's statements), and a pooled connection the server
ended — a restart, ``pg_terminate_backend`` — is still replaced before anyone uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from karios.common.db.session import Database

pytestmark = pytest.mark.integration


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[tuple[Database, list[str]]]:
    """The pool, and every simple-protocol statement its connections sent (asyncpg's query
    logger: ``BEGIN;``/``COMMIT;``/a ping's ``;`` — a prepared statement is not logged)."""
    database = Database(database_url)
    sent: list[str] = []

    @event.listens_for(database.engine.sync_engine, "connect")
    def _log(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.driver_connection.add_query_logger(lambda r: sent.append(r.query))

    yield database, sent
    await database.close()


async def _backend_pid(database: Database) -> int:
    async with database.session() as s, s.begin():
        return (await s.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()


async def test_a_checkout_sends_nothing_before_the_transaction(db: tuple[Database, list[str]]) -> None:
    database, sent = db
    pids = {await _backend_pid(database) for _ in range(5)}
    assert len(pids) == 1, "one pooled connection, reused"
    assert sent == ["BEGIN;", "COMMIT;"] * 5, sent


async def test_a_connection_the_server_ended_is_replaced_before_use(
    db: tuple[Database, list[str]], database_url: str
) -> None:
    database, _ = db
    first = await _backend_pid(database)
    dsn = sa.engine.make_url(database_url).set(drivername="postgresql")
    admin = await asyncpg.connect(dsn.render_as_string(hide_password=False))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", first)
        for _ in range(100):  # the backend gone, its socket closed
            if not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", first):
                break
            await asyncio.sleep(0.02)
    finally:
        await admin.close()
    await asyncio.sleep(0.05)  # the client's event loop reads the end of the stream
    second = await _backend_pid(database)  # no error reaches the caller
    assert second != first
