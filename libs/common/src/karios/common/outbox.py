"""Transactional outbox of a service's commands (issue 12 item 4, issue 28 item 2, ADR 0002).

A use case that changes state and implies a command (the gateway's job row + ``cmd.provision.start``,
the fabric-worker's apply job row + ``cmd.fabric.apply``) writes the command as a row of
``<schema>.command_outbox`` in the SAME transaction (:meth:`CommandOutbox.add`): both commit or
neither. The insert also ``NOTIFY``s ``outbox_command_outbox`` (payload: the queue) in that
transaction, so PostgreSQL delivers the wake-up exactly when the row becomes visible: on commit.

The relay (:class:`CommandOutbox`, one per replica, started with the app) is a batch loop:

1. **wake** on that NOTIFY (a raw asyncpg ``LISTEN`` connection); polling every
   :attr:`RelayConfig.poll_s` is only the backstop (faster while LISTEN is down);
2. **claim** up to :attr:`RelayConfig.batch` rows in one statement (``SELECT … FOR UPDATE SKIP
   LOCKED`` + a lease token: faststream-outbox's claim CTE), so replicas never claim the same row;
3. **publish** the whole batch concurrently through our own :meth:`Bus.send_command` (envelope
   headers, ``Nats-Msg-Id`` = the command's dedupe id), each awaiting JetStream's ack — while the
   next batch is claimed (rows committed meanwhile);
4. **mark** every acked row sent in one statement (a ``DELETE`` guarded by the lease token), and
   reschedule the failed ones in one statement (bus down: backoff, forever) — a row this service
   cannot read is moved to ``<schema>.command_outbox_dlq``;
5. publish the batch claimed ahead at once, or sleep until the next wake-up.

A relay that dies between 3 and 4 leaves its rows leased; after :attr:`RelayConfig.lease_s` any
relay claims them again and re-publishes, and JetStream drops the copies (same ``Nats-Msg-Id``
within the stream's 120 s duplicate window): a consumer gets each command once.

Each bus prefix has its own queue, so deployments sharing a database never relay each other's rows.
The tables (:func:`outbox_tables`) are created by each service's own migration
(:func:`create_outbox_tables`), in its own schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from faststream_outbox import make_dlq_table, make_outbox_table
from faststream_outbox.client import OutboxClient
from faststream_outbox.message import OutboxInnerMessage
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import SQLModel
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.bus.envelope import current_correlation
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Command
from karios.common.errors import KariosError
from karios.common.telemetry import context_from_headers, current_traceparent, get_logger

log = get_logger(__name__)

TABLE, DLQ_TABLE = "command_outbox", "command_outbox_dlq"
#: The NOTIFY channel of every outbox table named :data:`TABLE` (payload: the row's queue).
CHANNEL = f"outbox_{TABLE}"
#: Row header holding the command's dedupe id (a reconcile or reaper asks "still waiting here?").
MSG_ID_HEADER = "karios-msg-id"
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0  # backoff of a row whose publish failed (bus down)
MIN_WAIT_S = 0.05  # the shortest idle wait (a due row another relay is claiming right now)
DUE_CHECK_S = 1.0  # how often an idle relay asks when the next row comes due without a NOTIFY
#: Chaos-test hook: SIGKILL the process right after the commit, before any relay ran (from the
#: session's ``after_commit`` event of :meth:`CommandOutbox.add`). Unset in production; read once,
#: when the outbox is built, by :func:`kill_after_commit_hook`.
KILL_AFTER_COMMIT_ENV = "KARIOS_CHAOS_KILL_AFTER_OUTBOX_COMMIT"


@dataclass(frozen=True)
class RelayConfig:
    """How a relay claims and waits. The defaults are production's."""

    #: Rows claimed, published concurrently and marked per round (one claim and one mark
    #: statement each). A 1,000-command burst is a handful of rounds.
    batch: int = 256
    #: Backstop poll while LISTEN works (a lost NOTIFY, a row whose retry came due).
    poll_s: float = 5.0
    #: Poll while LISTEN is down (it is set up again every :attr:`listen_check_s`).
    poll_without_listen_s: float = 0.5
    #: A claimed row whose relay died is claimed again after this; longer than a round can take
    #: (every publish is bounded by 5 s), well inside JetStream's 120 s duplicate window.
    lease_s: float = 30.0
    #: The LISTEN connection is probed (``SELECT 1``, bounded) this often, so a silently dropped
    #: one is reopened instead of leaving the relay on the backstop poll.
    listen_check_s: float = 30.0


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
    correlationid: str | None = Field(default=None, description="The user action (the request's)")
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


Relayed = Callable[[Command], Awaitable[None]]
RelayedMany = Callable[[Sequence[Command]], Awaitable[None]]


@dataclass
class _Outcome:
    row: OutboxInnerMessage
    command: Command | None = None
    error: BaseException | None = None


class CommandOutbox:
    """A service's outbox: :meth:`add` in a use case's transaction, the relay started with the app.

    `tables` from :func:`outbox_tables`; `relayed` = the command contracts this service sends
    through it, by TYPE; `queue` defaults to ``<bus prefix>.cmd``; `name` names the tracer.
    `on_relayed` runs after a command was published and marked (bookkeeping, off the relay's
    path, one at a time); `on_relayed_many` gets every command published since its last call at
    once (one statement for a whole round instead of one transaction per command).
    `before_mark` is a test seam: called between the publish and the mark."""

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
        on_relayed_many: RelayedMany | None = None,
        registry: CollectorRegistry | None = None,
        config: RelayConfig | None = None,
        before_mark: Callable[[], None] | None = None,
    ) -> None:
        self.bus, self.engine, self.relayed, self.table = bus, engine, relayed, tables[0]
        self.config = config or RelayConfig()
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
        self.on_relayed, self.on_relayed_many = on_relayed, on_relayed_many
        self.before_mark = before_mark
        self.tracer = trace.get_tracer(f"karios.{name}.outbox")
        self.client = OutboxClient(engine, tables[0], dlq_table=tables[1])
        self.retry = RelayRetry()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._after: asyncio.Task[None] | None = None
        self._done: asyncio.Queue[Command] = asyncio.Queue()
        self.listening = False  # LISTEN is set up (else the relay polls)
        self.idle_waits = 0  # times the relay found nothing to claim and went to sleep
        self._due_at: float | None = None  # monotonic time the next row comes due without a NOTIFY
        self._due_checked = -math.inf
        self._kill_after_commit = kill_after_commit_hook()  # chaos tests only (None otherwise)

    # -- the writer's side ---------------------------------------------------------------

    async def add(
        self, session: AsyncSession, command: Command, subject: str, *, entity: str, msg_id: str
    ) -> None:
        """Queue ``command`` in the caller's open transaction (it commits or rolls back with it,
        and so does its NOTIFY: the relays wake when the row becomes visible)."""
        if type(command).TYPE not in self.relayed:
            raise ValueError(f"{type(command).TYPE} is not relayed by this outbox")
        row = OutboxRow(
            type=type(command).TYPE,
            subject=subject,
            entity=entity,
            msg_id=msg_id,
            traceparent=current_traceparent(),
            correlationid=current_correlation(),
            data=command.model_dump(mode="json"),
        )
        headers = {MSG_ID_HEADER: msg_id, "content-type": "application/json"}
        conn = await session.connection()  # the session's transaction (SQLModel frowns on execute())
        await self.client.insert(
            conn, queue=self.queue, payload=row.model_dump_json().encode(), headers=headers
        )
        if self._kill_after_commit is not None:
            # Dies as the COMMIT returns, before the event loop runs again: a relay woken by this
            # very NOTIFY (microseconds away now) cannot have published yet.
            hook = self._kill_after_commit
            sa.event.listen(session.sync_session, "after_commit", lambda _s: hook(), once=True)

    def waiting_msg_ids(self) -> sa.Select[Any]:
        """Dedupe ids of commands still waiting in this outbox (a subquery)."""
        return waiting_msg_ids(self.table)

    # -- the relay -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"outbox relay {self.queue}")
        self._after = asyncio.create_task(self._bookkeeping(), name=f"outbox bookkeeping {self.queue}")

    async def stop(self, timeout: float = 6.0) -> None:  # noqa: ASYNC109 (a drain bound)
        """Let the round in flight finish (its publishes are bounded by 5 s), then stop; rows of
        a round cut short are relayed by another replica after their lease (and deduped)."""
        self._stopping = True
        self._wake.set()
        task, after = self._task, self._after
        self._task = self._after = None
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if after is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.join(), timeout=2.0)
            after.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await after

    async def healthy(self) -> bool:
        """Readiness: the relay loop is alive and the database answers (within 1 s)."""
        if self._task is None or self._task.done():
            return False
        try:
            async with asyncio.timeout(1.0), self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except Exception:
            return False
        return True

    async def _run(self) -> None:
        """Reconnect with backoff around :meth:`_relay_loop` (database gone, connection broken)."""
        delay = 0.5
        while not self._stopping:
            try:
                async with self.engine.connect() as raw:
                    conn = await raw.execution_options(isolation_level="AUTOCOMMIT")
                    await self._relay_loop(conn)
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("outbox relay: database unavailable, retrying", queue=self.queue, error=repr(exc))
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _relay_loop(self, conn: Any) -> None:
        cfg = self.config
        listen: Any = None
        checked = -math.inf
        rows: Sequence[OutboxInnerMessage] = []
        claimed_nothing = False  # the last claim found no row (and no NOTIFY came since)
        try:
            while rows or not self._stopping:  # stopping: finish the rows already claimed
                now = time.monotonic()
                if now - checked >= cfg.listen_check_s and not self._stopping:
                    listen = await self._check_listen(listen)
                    checked = now
                if not rows and not (claimed_nothing and not self._wake.is_set()):
                    rows = await self._claim(conn)
                if not rows:
                    wait = cfg.poll_s if listen is not None else cfg.poll_without_listen_s
                    due = await self._due_in(conn)  # a retry's backoff, a dead relay's lease
                    self.idle_waits += 1
                    await self._sleep(wait if due is None else min(wait, max(MIN_WAIT_S, due)))
                    claimed_nothing = False
                    continue
                # One round: publish these rows while the next ones are claimed (the connection
                # runs one statement at a time: claim, then this round's mark).
                publishing = asyncio.ensure_future(self._publish_all(rows))
                try:
                    ahead = [] if self._stopping else await self._claim(conn)
                finally:
                    outcomes = await publishing
                await self._mark(conn, outcomes)
                rows, claimed_nothing = ahead, not ahead
        finally:
            await self._close_listen(listen)

    async def _claim(self, conn: Any) -> Sequence[OutboxInnerMessage]:
        """Up to a batch of rows of this queue, leased to this relay (SKIP LOCKED: one statement)."""
        self._wake.clear()  # a NOTIFY from here on is for a row this claim may not see
        cfg = self.config
        return await self.client.fetch(conn, [self.queue], limit=cfg.batch, lease_ttl_seconds=cfg.lease_s)

    async def _sleep(self, seconds: float) -> None:
        """Until a NOTIFY (or :meth:`stop`) or ``seconds``, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _publish_all(self, rows: Sequence[OutboxInnerMessage]) -> list[_Outcome]:
        """Every row published concurrently; each outcome once JetStream acked (or refused) it."""
        return await asyncio.gather(*(self._publish(row) for row in rows))

    async def _mark(self, conn: Any, outcomes: Sequence[_Outcome]) -> None:
        """Mark a round: sent (one DELETE), retry (one UPDATE), or dead-lettered (a row that can
        never be published)."""
        if self.before_mark is not None:
            self.before_mark()
        sent = [o for o in outcomes if o.command is not None]
        failed = [o for o in outcomes if o.command is None]
        async with conn.begin():  # autocommit: one statement each; begin() only scopes the Connection
            if sent:
                pairs = [(o.row.id, o.row.acquired_token) for o in sent if o.row.acquired_token is not None]
                marked = await self.client.delete_batch_with_lease(conn, pairs)
                if len(marked) < len(sent):
                    # Held past its lease (a stalled publish) and claimed again by another relay:
                    # that relay's copy is a duplicate JetStream drops (same Nats-Msg-Id).
                    lost = len(sent) - len(marked)
                    log.warning("outbox relay: lease lost before the mark", queue=self.queue, rows=lost)
            if failed:
                await self._reschedule(conn, failed)
        for o in sent:
            assert o.command is not None
            self.m_relayed.labels(type(o.command).TYPE).inc()
            if self.on_relayed is not None or self.on_relayed_many is not None:
                self._done.put_nowait(o.command)

    async def _publish(self, row: OutboxInnerMessage) -> _Outcome:
        try:
            parsed = OutboxRow.model_validate_json(row.payload)
            command = parsed.command(self.relayed)
        except Exception as exc:  # never publishable: the DLQ
            return _Outcome(row, error=exc)
        ctx = context_from_headers({"traceparent": parsed.traceparent} if parsed.traceparent else {})
        with self.tracer.start_as_current_span(f"relay {parsed.type}", context=ctx):
            try:
                # Returns once JetStream acked (a duplicate within the window is acked too).
                await self.bus.send_command(
                    command,
                    parsed.subject,
                    entity=parsed.entity,
                    msg_id=parsed.msg_id,
                    correlationid=parsed.correlationid,
                )
            except Exception as exc:
                return _Outcome(row, error=exc)
        return _Outcome(row, command=command)

    async def _reschedule(self, conn: Any, failed: Sequence[_Outcome]) -> None:
        now = datetime.now(UTC)
        retry: list[tuple[OutboxInnerMessage, float]] = []
        for o in failed:
            attempts = o.row.attempts_count + 1
            delay = self.retry.get_next_attempt_delay(
                first_attempt_at=o.row.first_attempt_at or now,
                last_attempt_at=now,
                attempts_count=attempts,
                exception=o.error,
            )
            if delay is None:
                await self._dead_letter(conn, o)
            else:
                retry.append((o.row, delay))
        if not retry:
            return
        self.m_waits.inc(len(retry))
        first = next(o.error for o in failed if o.error is not None)
        reason = first.message if isinstance(first, KariosError) else type(first).__name__
        log.warning(f"commands wait in the outbox: {reason}", queue=self.queue, rows=len(retry))
        await conn.execute(_reschedule_stmt(self.table), _reschedule_params(retry))
        self._due_checked = -math.inf  # ask when they come due

    async def _due_in(self, conn: Any) -> float | None:
        """:meth:`_next_due`, asked at most every :data:`DUE_CHECK_S` (every replica wakes on
        every commit; one indexed query a second is enough), at once after a reschedule of ours
        or once the known due time passed."""
        now = time.monotonic()
        if now - self._due_checked >= DUE_CHECK_S or (self._due_at is not None and self._due_at <= now):
            due = await self._next_due(conn)
            self._due_at, self._due_checked = (None if due is None else now + due), now
        return None if self._due_at is None else self._due_at - now

    async def _next_due(self, conn: Any) -> float | None:
        """Seconds until a row of this queue can be claimed without a NOTIFY: a rescheduled row's
        next attempt, or a lease (of a relay that died) running out; None if there is none."""
        t = self.table
        lease = sa.func.make_interval(0, 0, 0, 0, 0, 0, self.config.lease_s)
        due = sa.func.least(
            sa.func.min(t.c.next_attempt_at).filter(t.c.acquired_token.is_(None)),
            sa.func.min(t.c.acquired_at + lease).filter(t.c.acquired_token.is_not(None)),
        )
        query = sa.select(sa.extract("epoch", due - sa.func.now())).where(t.c.queue == self.queue)
        async with conn.begin():
            seconds = (await conn.execute(query)).scalar()
        return None if seconds is None else float(seconds)

    async def _dead_letter(self, conn: Any, o: _Outcome) -> None:
        assert o.row.acquired_token is not None
        payload = {"failure_reason": "retry_terminal", "last_exception": type(o.error).__name__}
        await self.client.delete_with_lease(conn, o.row.id, o.row.acquired_token, dlq_payload=payload)
        log.error(
            "outbox row dead-lettered: this service cannot publish it",
            queue=self.queue,
            row=o.row.id,
            error=type(o.error).__name__,
        )

    async def _bookkeeping(self) -> None:
        """The after-relay hooks for the commands published so far, off the relay's path: the
        publish is done, so a hook's error is logged, never a reason to relay again."""
        while True:
            done = [await self._done.get()]
            while not self._done.empty():
                done.append(self._done.get_nowait())
            try:
                if self.on_relayed_many is not None:
                    await self._run_hook(self.on_relayed_many, done)
                if self.on_relayed is not None:
                    for command in done:
                        await self._run_hook(self.on_relayed, command)
            finally:
                for _ in done:
                    self._done.task_done()

    async def _run_hook(self, hook: Callable[[Any], Awaitable[None]], arg: Any) -> None:
        try:
            await hook(arg)
        except Exception as exc:
            log.warning("after-relay bookkeeping failed", error=type(exc).__name__)

    # -- LISTEN ----------------------------------------------------------------------------

    async def _check_listen(self, listen: Any) -> Any:
        """The LISTEN connection, probed; reopened if it is gone (None: poll instead)."""
        if listen is not None:
            try:
                await asyncio.wait_for(listen.fetchval("SELECT 1"), timeout=5.0)
                return listen
            except Exception as exc:
                log.warning("outbox relay: LISTEN connection lost, reopening", error=repr(exc))
                await self._close_listen(listen)
        listen = await self._open_listen()
        self.listening = listen is not None
        return listen

    async def _open_listen(self) -> Any:
        if "asyncpg" not in (self.engine.url.drivername or ""):
            return None
        import asyncpg

        _, opts = self.engine.dialect.create_connect_args(self.engine.url)
        for key in ("prepared_statement_cache_size", "async_fallback", "async_creator_fn"):
            opts.pop(key, None)
        conn = None
        try:
            conn = await asyncpg.connect(**opts, timeout=5.0)
            await conn.add_listener(CHANNEL, self._on_notify)
            self._wake.set()  # rows committed while nobody listened: claim them now
            return conn
        except Exception as exc:
            log.warning("outbox relay: LISTEN unavailable, polling", queue=self.queue, error=repr(exc))
            await self._close_listen(conn)
            return None

    async def _close_listen(self, conn: Any) -> None:
        if conn is None:
            return
        try:
            await asyncio.wait_for(conn.close(), timeout=2.0)
        except Exception:
            conn.terminate()

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.queue:  # other services' and other prefixes' queues share the channel
            self._wake.set()


def _reschedule_stmt(table: sa.Table) -> sa.Update:
    """One UPDATE for every failed row of a round: back to pending after its delay, still only
    if it holds this relay's lease."""
    t = table
    ids, tokens = ARRAY(t.c.id.type), ARRAY(t.c.acquired_token.type)
    delays, attempts = ARRAY(sa.Float()), ARRAY(sa.BigInteger())
    failed = (
        sa.func.unnest(
            sa.cast(sa.bindparam("ids", type_=ids), ids),
            sa.cast(sa.bindparam("tokens", type_=tokens), tokens),
            sa.cast(sa.bindparam("delays", type_=delays), delays),
            sa.cast(sa.bindparam("attempts", type_=attempts), attempts),
        )
        .table_valued("id", "token", "delay", "attempts")
        .render_derived(name="failed")
    )
    return (
        sa.update(t)
        .where(t.c.id == failed.c.id, t.c.acquired_token == failed.c.token)
        .values(
            next_attempt_at=sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, failed.c.delay),
            attempts_count=failed.c.attempts,
            first_attempt_at=sa.func.coalesce(t.c.first_attempt_at, sa.func.now()),
            last_attempt_at=sa.func.now(),
            acquired_at=None,
            acquired_token=None,
        )
    )


def _reschedule_params(retry: Sequence[tuple[OutboxInnerMessage, float]]) -> dict[str, list[Any]]:
    return {
        "ids": [row.id for row, _ in retry],
        "tokens": [row.acquired_token or uuid.UUID(int=0) for row, _ in retry],
        "delays": [delay for _, delay in retry],
        "attempts": [row.attempts_count + 1 for row, _ in retry],
    }


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
