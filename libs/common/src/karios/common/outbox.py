"""Transactional outbox of a service's commands (issue 12 item 4, ADR 0002), on ``faststream-outbox``.

A use case that changes state and implies a command (the gateway's job row + ``cmd.provision.start``,
the fabric-worker's apply job row + ``cmd.fabric.apply``) writes the command as a row of
``<schema>.command_outbox`` in the SAME transaction (:meth:`CommandOutbox.add`): both commit or
neither. A relay (a ``faststream-outbox`` subscriber on that table, one per replica) publishes
each row through our own :meth:`Bus.send_command` (envelope headers, ``Nats-Msg-Id`` = the
command's dedupe id) and the row is deleted only after JetStream acked the publish.

- Relay right after commit: the insert NOTIFYs ``outbox_command_outbox`` and every replica's
  relay LISTENs, so the row is claimed within milliseconds; polling (0.5 s … 5 s) is the backstop.
- Several replicas: a row is claimed with ``FOR UPDATE SKIP LOCKED`` + a lease token, so one
  replica relays it; ``Nats-Msg-Id`` dedupe (120 s window) is the safety net for a relay that
  died between the publish and the delete.
- Bus down: the publish fails fast (503) and the row is retried with backoff (at most every
  :data:`RETRY_MAX_S`) for as long as it takes; nothing is dropped. A row that can never be
  published (a payload this service cannot read) is moved to ``<schema>.command_outbox_dlq``.
- Each bus prefix has its own queue, so deployments sharing a database never relay each other's rows.

The tables (:func:`outbox_tables`) are created by each service's own migration
(:func:`create_outbox_tables`), in its own schema.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from faststream_outbox import OutboxBroker, make_dlq_table, make_outbox_table
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field
from sqlmodel import SQLModel
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Command
from karios.common.errors import KariosError
from karios.common.telemetry import context_from_headers, current_traceparent, get_logger

log = get_logger(__name__)

TABLE, DLQ_TABLE = "command_outbox", "command_outbox_dlq"
#: Row header holding the command's dedupe id (a reconcile or reaper asks "still waiting here?").
MSG_ID_HEADER = "karios-msg-id"
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0  # backoff of a row whose publish failed (bus down)
POLL_MIN_S, POLL_MAX_S = 0.5, 5.0  # the poller: the backstop of LISTEN/NOTIFY
LEASE_S = 30.0  # a claimed row whose relay died is claimed again after this (publish timeout: 5 s)
#: Rows relayed at once per replica (each worker holds one database connection and one publish in
#: flight). 1 worker relayed a 1,000-command backlog at ~40/s (one JetStream ack + one delete per
#: row in turn): the largest wait of the 1,000-host storm. Order between rows is not needed: each
#: command is its own job's, and ``Nats-Msg-Id`` dedupes a re-relay.
RELAY_WORKERS = 4
#: Relayed rows are deleted in batches of up to this many while a backlog drains (at once when
#: the queue runs dry, and always before the lease ends); a relay that dies before the delete
#: re-publishes those rows after the lease, and JetStream drops them as duplicates (``Nats-Msg-Id``).
DELETE_BATCH = 20
#: Chaos-test hook: SIGKILL the process right after the commit, before any relay ran. Unset in
#: production; read once by :func:`kill_after_commit_hook`.
KILL_AFTER_COMMIT_ENV = "KARIOS_CHAOS_KILL_AFTER_OUTBOX_COMMIT"


def outbox_tables(schema: str) -> tuple[sa.Table, sa.Table]:
    """The outbox and its DLQ table in `schema` (registered on ``SQLModel.metadata``)."""
    outbox = make_outbox_table(sa.MetaData(), TABLE).to_metadata(SQLModel.metadata, schema=schema)
    dlq = make_dlq_table(sa.MetaData(), DLQ_TABLE).to_metadata(SQLModel.metadata, schema=schema)
    return outbox, dlq


class OutboxRow(BaseModel):
    """What one outbox row carries: everything :meth:`Bus.send_command` needs."""

    type: str = Field(description="The command's contract TYPE (a key of the relayed table)")
    subject: str
    entity: str = ""
    msg_id: str = Field(description="Nats-Msg-Id: the command's dedupe id (a job id)")
    traceparent: str | None = None
    data: dict[str, Any]

    def command(self, relayed: dict[str, type[Command]]) -> Command:
        model = relayed.get(self.type)
        if model is None:
            raise ValueError(f"this service relays no command of type {self.type}")
        return model.model_validate(self.data)


class RelayRetry:
    """Bus unavailable (or any retryable error): try again with backoff, forever. Anything else
    (a row this service cannot read) is terminal: the row goes to the DLQ table."""

    def get_next_attempt_delay(
        self,
        *,
        first_attempt_at: datetime,
        last_attempt_at: datetime,
        attempts_count: int,
        exception: BaseException | None = None,
    ) -> float | None:
        retryable = exception is None or isinstance(exception, TimeoutError | OSError)
        retryable = retryable or (isinstance(exception, KariosError) and exception.retryable)
        if not retryable:
            return None
        return min(RETRY_FIRST_S * 2 ** min(max(attempts_count - 1, 0), 8), RETRY_MAX_S)


class RelayLog:
    """faststream-outbox's log lines into the service log. A publish refused because the bus is
    down (the row waits; that is the design) is one short warning per attempt, no traceback."""

    def __init__(self, logger: logging.Logger, waits: Counter | None = None) -> None:
        self.logger, self.waits = logger, waits

    def log(self, level: int, msg: Any, /, *, exc_info: Any = None, extra: Any = None) -> None:
        if isinstance(exc_info, KariosError) and exc_info.retryable:
            self.logger.warning("command waits in the outbox: %s", exc_info.message, extra=extra)
            if self.waits is not None:
                self.waits.inc()
            return
        self.logger.log(level, msg, exc_info=exc_info, extra=extra)


Relayed = Callable[[Command], Awaitable[None]]


class CommandOutbox:
    """A service's outbox: :meth:`add` in a use case's transaction, the relay started with the app.

    `tables` from :func:`outbox_tables`; `relayed` = the command contracts this service sends
    through it, by TYPE; `queue` defaults to ``<bus prefix>.cmd``; `name` names the logger/tracer."""

    def __init__(
        self,
        bus: Bus,
        engine: Any,
        *,
        tables: tuple[sa.Table, sa.Table],
        relayed: dict[str, type[Command]],
        name: str,
        queue: str = "",
        on_relayed: Relayed | None = None,
        registry: CollectorRegistry | None = None,
        workers: int = RELAY_WORKERS,
    ) -> None:
        self.bus, self.relayed, self.table = bus, relayed, tables[0]
        self.m_relayed = Counter(
            "karios_outbox_relayed_total",
            "Commands published from the outbox (after JetStream's ack)",
            ["command"],
            registry=registry,
        )
        self.m_waits = Counter(
            "karios_outbox_publish_retries_total",
            "Relay attempts that found the bus unavailable (the command waits and is retried)",
            registry=registry,
        )
        self.queue = queue or f"{bus.subjects.prefix}.cmd"
        self.on_relayed = on_relayed
        self.tracer = trace.get_tracer(f"karios.{name}.outbox")
        self.broker = OutboxBroker(
            engine,
            outbox_table=tables[0],
            dlq_table=tables[1],
            graceful_timeout=5.0,
            logger=RelayLog(logging.getLogger(f"karios.{name.replace('-', '_')}.outbox"), self.m_waits),
            log_level=logging.DEBUG,  # "Received"/"Processed" per row; errors stay at ERROR
            last_exception_renderer=lambda exc: type(exc).__name__,  # never a payload in the DLQ text
        )
        self.broker.subscriber(
            self.queue,
            retry_strategy=RelayRetry(),
            max_workers=workers,
            fetch_batch_size=max(20, 2 * workers),
            terminal_flush_batch_size=DELETE_BATCH,
            min_fetch_interval=POLL_MIN_S,
            max_fetch_interval=POLL_MAX_S,
            lease_ttl_seconds=LEASE_S,
        )(self._relay)

    async def add(
        self, session: AsyncSession, command: Command, subject: str, *, entity: str, msg_id: str
    ) -> None:
        """Queue ``command`` in the caller's open transaction (it commits or rolls back with it)."""
        if type(command).TYPE not in self.relayed:
            raise ValueError(f"{type(command).TYPE} is not relayed by this outbox")
        row = OutboxRow(
            type=type(command).TYPE,
            subject=subject,
            entity=entity,
            msg_id=msg_id,
            traceparent=current_traceparent(),
            data=command.model_dump(mode="json"),
        )
        await self.broker.publish(
            row.model_dump(mode="json"), queue=self.queue, session=session, headers={MSG_ID_HEADER: msg_id}
        )

    async def _relay(self, row: OutboxRow) -> None:
        command = row.command(self.relayed)
        ctx = context_from_headers({"traceparent": row.traceparent} if row.traceparent else {})
        with self.tracer.start_as_current_span(f"relay {row.type}", context=ctx):
            # Returns once JetStream acked; raising keeps the row (retried per RelayRetry).
            await self.bus.send_command(command, row.subject, entity=row.entity, msg_id=row.msg_id)
        self.m_relayed.labels(row.type).inc()
        if self.on_relayed is not None:
            try:
                await self.on_relayed(command)
            except Exception as exc:  # the publish is done: never relay again for a bookkeeping error
                log.warning("after-relay bookkeeping failed", msg_id=row.msg_id, error=type(exc).__name__)

    def waiting_msg_ids(self) -> sa.Select[Any]:
        """Dedupe ids of commands still waiting in this outbox (a subquery)."""
        return waiting_msg_ids(self.table)

    async def healthy(self) -> bool:
        """Readiness: the relay's loops are alive and the database answers (within 1 s)."""
        return bool(await self.broker.ping(timeout=1.0))

    async def start(self) -> None:
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()


def waiting_msg_ids(table: sa.Table) -> sa.Select[Any]:
    """Dedupe ids of commands still waiting in the outbox `table` (a subquery)."""
    return sa.select(table.c.headers[MSG_ID_HEADER].astext)


def kill_after_commit_hook() -> Callable[[], None] | None:
    """The chaos hook (see :data:`KILL_AFTER_COMMIT_ENV`), or None (always, outside chaos tests)."""
    if os.environ.get(KILL_AFTER_COMMIT_ENV) != "1":
        return None
    return lambda: os.kill(os.getpid(), signal.SIGKILL)


def create_outbox_tables(op: Any, schema: str) -> None:
    """Alembic ``upgrade()`` body: the tables :func:`outbox_tables` declares (faststream-outbox
    0.19's columns, partial indexes and CHECK), in `schema`."""
    from sqlalchemy.dialects.postgresql import JSONB

    ts, t, d = sa.DateTime(timezone=True), TABLE, DLQ_TABLE
    op.create_table(
        t,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("headers", JSONB(), nullable=True),
        sa.Column("attempts_count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("deliveries_count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("created_at", ts, nullable=False, server_default=sa.func.now()),
        sa.Column("next_attempt_at", ts, nullable=False, server_default=sa.func.now()),
        sa.Column("first_attempt_at", ts, nullable=True),
        sa.Column("last_attempt_at", ts, nullable=True),
        sa.Column("acquired_at", ts, nullable=True),
        sa.Column("acquired_token", sa.Uuid(), nullable=True),
        sa.Column("timer_id", sa.String(255), nullable=True),
        sa.CheckConstraint("(acquired_token IS NULL) = (acquired_at IS NULL)", name=f"{t}_lease_ck"),
        schema=schema,
    )
    cols = ["queue", "next_attempt_at", "id"]
    for name, where in (("pending", "acquired_token IS NULL"), ("leased", "acquired_token IS NOT NULL")):
        op.create_index(f"{t}_{name}_idx", t, cols, schema=schema, postgresql_where=sa.text(where))
    op.create_index(
        f"{t}_timer_id_uq",
        t,
        ["queue", "timer_id"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text("timer_id IS NOT NULL"),
    )
    op.create_table(
        d,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("original_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("headers", JSONB(), nullable=True),
        sa.Column("deliveries_count", sa.BigInteger(), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("failed_at", ts, nullable=False, server_default=sa.func.now()),
        sa.Column("failure_reason", sa.String(64), nullable=False),
        sa.Column("last_exception", sa.String(), nullable=True),
        sa.Column("timer_id", sa.String(255), nullable=True),
        schema=schema,
    )
    op.create_index(f"{d}_queue_failed_idx", d, ["queue", "failed_at"], schema=schema)
