"""Async SQLModel sessions on asyncpg, and the idempotent-consumer helper.

No database call may hang a request: connecting, waiting for a pooled connection and every
statement are bounded (asyncpg ``timeout``/``command_timeout``, the pool's ``pool_timeout``, and
the server's ``statement_timeout`` as a backstop). A call that runs out of time, or finds the
database gone, surfaces as :class:`ServiceUnavailable` (HTTP 503 + ``Retry-After``) through
:func:`unavailable_database_error`; a full disk (SQLSTATE 53100) as :class:`StorageFull`, which
also turns the database's :class:`StorageAlarm` on (``/readyz`` check ``storage``) until a probe
write succeeds (:meth:`Database.probe_write`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.errors import ServiceUnavailable, StorageFull, resource_error
from karios.common.storage import StorageAlarm

#: Default bounds (seconds); services pass ``KariosSettings.db_*`` values.
CONNECT_TIMEOUT_S = 3.0
COMMAND_TIMEOUT_S = 5.0


def unavailable_database_error(exc: BaseException) -> ServiceUnavailable | None:
    """A :class:`ServiceUnavailable` when ``exc`` (or its cause) means the database is stalled,
    unreachable or dropped the connection, or is out of room (:class:`StorageFull`) or another
    resource (:func:`~karios.common.errors.resource_error`); ``None`` for any other error (a real
    bug: 500)."""
    short = resource_error(exc)
    if short is not None:
        return short
    seen: BaseException | None = exc
    for _ in range(5):  # the driver error is at most a few ``__cause__`` links down
        if seen is None:
            return None
        if isinstance(seen, ServiceUnavailable):
            return seen
        if isinstance(seen, TimeoutError | asyncio.TimeoutError | sa.exc.TimeoutError):
            return ServiceUnavailable("database did not answer in time")
        if isinstance(seen, ConnectionError | sa.exc.OperationalError | sa.exc.InterfaceError) or (
            isinstance(seen, sa.exc.DBAPIError) and seen.connection_invalidated
        ):
            return ServiceUnavailable("database unreachable")
        if type(seen).__name__ in _DRIVER_UNAVAILABLE:
            return ServiceUnavailable("database unreachable")
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return None


# asyncpg errors that mean "no usable connection / statement cancelled by its timeout".
_DRIVER_UNAVAILABLE = frozenset(
    {
        "QueryCanceledError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "CannotConnectNowError",
        "TooManyConnectionsError",
        "AdminShutdownError",
        "InterfaceError",
    }
)


_PROBE_TABLE = sa.text("CREATE TEMP TABLE karios_storage_probe (b text) ON COMMIT DROP")
_PROBE_ROW = sa.text("INSERT INTO karios_storage_probe VALUES ('probe')")
_PROBE_SQL = frozenset({_PROBE_TABLE.text, _PROBE_ROW.text})


class DatabaseUnreachable(ConnectionError):
    """Connecting failed with an OS error that is not a :class:`ConnectionError`.

    asyncpg lets the socket's own error through: ``FileNotFoundError`` for a Unix socket that is
    gone (PostgreSQL restarting), ``OSError`` for no route to the host, ``socket.gaierror`` for a
    name that does not resolve. Any of those while *connecting* means the database is unreachable
    (503), while the same class raised elsewhere is a bug (500): this names it where it is known.
    """


def _connect_or_unreachable(dialect, conn_rec, cargs, cparams):  # type: ignore[no-untyped-def]
    """``do_connect`` hook: the driver's connect, with an OS error renamed :class:`DatabaseUnreachable`."""
    try:
        return dialect.connect(*cargs, **cparams)
    except ConnectionError:
        raise
    except OSError as exc:  # the message is the OS's (no URL, no password)
        raise DatabaseUnreachable(f"database unreachable: {exc.strerror or type(exc).__name__}") from exc


def _replace_closed(dbapi_connection, connection_record, connection_proxy):  # type: ignore[no-untyped-def]
    """Pool ``checkout`` hook: a pooled connection the server closed is replaced before use.

    PostgreSQL ends its connections when it restarts or a backend is terminated; asyncpg sees the
    socket close as it happens (its protocol always reads), so ``is_closed()`` answers without a
    round trip. SQLAlchemy's ``pool_pre_ping`` did the same job with three (asyncpg's ping is
    ``BEGIN; SELECT; ROLLBACK``, for pgbouncer) on every checkout: a third of the statements a
    short transaction sends. A connection that dies unseen fails its first statement as a
    disconnect, which invalidates the whole pool (SQLAlchemy) and reaches the caller as the
    database unavailable — as a statement failing mid-transaction always did.
    """
    if dbapi_connection.driver_connection.is_closed():
        raise sa.exc.DisconnectionError("the database closed this connection")


class Database:
    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        command_timeout: float = COMMAND_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.command_timeout = command_timeout
        self.engine: AsyncEngine = create_async_engine(
            url,
            pool_size=pool_size,
            pool_timeout=connect_timeout + command_timeout,
            connect_args={
                "timeout": connect_timeout,
                "command_timeout": command_timeout,
                # Server-side backstop, a little longer so the client's timeout answers first.
                "server_settings": {"statement_timeout": str(int((command_timeout + 1) * 1000))},
            },
        )
        event.listen(self.engine.sync_engine, "do_connect", _connect_or_unreachable)
        event.listen(self.engine.sync_engine.pool, "checkout", _replace_closed)
        #: On while the last write failed for a full disk; every statement's error passes here
        #: (requests, background writers, relays alike), whatever the caller makes of it.
        self.storage = StorageAlarm("database")
        event.listen(self.engine.sync_engine, "handle_error", self._on_error)
        # expire_on_commit=False: attribute access after commit would otherwise need I/O.
        self.sessions = async_sessionmaker(self.engine, class_=AsyncSession, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as s:
            yield s

    async def healthy(self, timeout: float = 1.5) -> bool:  # noqa: ASYNC109 (a readiness bound)
        """``SELECT 1`` answered within ``timeout`` (readiness must answer at once, never hang)."""
        try:
            async with asyncio.timeout(timeout):
                async with self.engine.connect() as conn:
                    await conn.execute(sa.text("SELECT 1"))
        except Exception:
            return False
        return True

    def _on_error(self, context: sa.engine.ExceptionContext) -> None:
        if context.statement in _PROBE_SQL:
            return  # the probe still failing keeps the alarm on; it is no refused write of a caller
        if isinstance(resource_error(context.original_exception), StorageFull):
            self.storage.record_full()

    async def probe_write(self, timeout: float = 1.5) -> bool:  # noqa: ASYNC109 (a readiness bound)
        """Whether the database can write a new page now: a temporary table (gone with the
        rolled-back transaction) gets one row, which needs a fresh block on disk — the write a
        full disk refuses. Clears the storage alarm when it succeeds."""
        try:
            async with asyncio.timeout(timeout):
                async with self.engine.connect() as conn:
                    trans = await conn.begin()
                    try:
                        await conn.execute(_PROBE_TABLE)
                        await conn.execute(_PROBE_ROW)
                    finally:
                        await trans.rollback()
        except Exception:
            return False
        self.storage.record_ok()
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
    return bool(await claim_messages(session, table, consumer, [message_id]))


async def claim_messages(
    session: AsyncSession, table: sa.Table, consumer: str, message_ids: Collection[str]
) -> set[str]:
    """:func:`claim_message` for many messages in one statement: those not processed before.

    The ids are inserted in sorted order: two transactions claiming overlapping sets (replicas
    handed the same redelivered events) wait on each other's rows in one order, never crosswise.
    """
    if not message_ids:
        return set()
    # One array parameter (one statement text, its prepared statement reused, whatever the count).
    ids = sa.func.unnest(sa.bindparam("ids", sorted(set(message_ids)), type_=ARRAY(sa.String)))
    rows = sa.select(sa.literal(consumer), ids, sa.literal(datetime.now(UTC), sa.DateTime(timezone=True)))
    stmt = (
        pg_insert(table)
        .from_select(["consumer", "message_id", "processed_at"], rows)
        .on_conflict_do_nothing()
        .returning(table.c.message_id)
    )
    return {r[0] for r in await (await session.connection()).execute(stmt)}
