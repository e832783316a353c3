"""The gateway's read model of provisioning: ``jobs`` and ``provision_progresses`` (schema ``gateway``).

:class:`ProvisionProjector` is a durable pull consumer (``Bus.pull_events``) of ``evt.provision.>``;
each fetch's events are applied in one transaction with ``claim_messages`` so a redelivered event
changes nothing, and a job keeps its newest state: events reach the projector out of order (gateway
replicas pull batches side by side; an event held by a replica that died comes back after the ack
wait), so the row records the stream sequence and the sending time of the event it shows, and an
older event is dropped (it was superseded: the history, in arrival order, keeps what was shown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa
from pydantic import BaseModel
from pydantic import Field as PField
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Field, SQLModel, select

from karios.api_gateway.models import SCHEMA, processed_messages
from karios.common.bus.deadletter import CommandFailed
from karios.common.bus.runtime import Bus
from karios.common.bus.streams import CMD_DUPLICATE_WINDOW_S
from karios.common.contracts.provision import JobProgress, QueueEntry, QueueQuery, StartProvision
from karios.common.db import Database, claim_messages
from karios.common.errors import KariosError
from karios.common.provisioning import TERMINAL_STATES
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)

CONSUMER = "gateway-provision-projector"
FAILED_CONSUMER = "gateway-provision-command-failed"
# A live job no provisioner knows after this long never reached one: twice the command dedupe
# window, so a command still held (or re-sent) within the window is not mistaken for a lost one.
LOST_AFTER_S = 2 * CMD_DUPLICATE_WINDOW_S
RECONCILE_EVERY_S = 30.0
NEVER_REACHED = "never reached a provisioner"
WORKER_JOB_TYPES = ("provision", "unprovision")  # *_batch parents are the gateway's own rows


def _now() -> datetime:
    return datetime.now(UTC)


class JobRow(SQLModel, table=True):
    """The seed's job fields (``GET /controlnode/job/{id}``)."""

    __tablename__ = "jobs"
    __table_args__ = {"schema": SCHEMA}

    id: str = Field(primary_key=True, max_length=64)
    job_type: str = Field(default="provision", max_length=32)
    job_status: str = Field(default="queued", max_length=32)  # the state machine's state
    status: str = Field(default="running", max_length=32)  # running|completed|failed|cancelled|stuck
    metadata_: str = Field(default="{}", sa_column_kwargs={"name": "metadata"})
    node_ip: str = Field(default="", max_length=64)
    bmc_ip: str = Field(default="", max_length=64, index=True)
    parent_id: str = Field(default="", max_length=64)
    progress: int = 0
    resource_name: str = Field(default="", max_length=255)
    total_jobs: int = 1
    message: str = ""
    log_tail: list[str] | None = Field(default=None, sa_type=sa.JSON)  # installer's last log lines
    # The event shown: its stream sequence and its sender's time (see :func:`superseded`).
    event_seq: int = Field(default=0, sa_type=sa.BigInteger)
    event_time: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class ProvisionProgress(SQLModel, table=True):
    __tablename__ = "provision_progresses"
    __table_args__ = {"schema": SCHEMA}

    id: int | None = Field(default=None, primary_key=True)
    bmc_ip: str = Field(max_length=64, index=True)
    job_id: str = Field(max_length=64, index=True)
    stage: str = Field(max_length=64)
    percent_complete: int = 0
    message: str = ""
    status: str = Field(max_length=32)
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class JobOut(BaseModel):
    """``GET/PATCH /controlnode/job/{id}``: the seed's job fields, plus ``bmc_ip``, ``message``
    and ``log_tail`` (the installer's last log lines, newest last)."""

    created_at: str
    id: str
    job_status: str = PField(description="The state machine's state (queued … completed, failed, …)")
    job_type: str = PField(description="provision | unprovision | <type>_batch")
    metadata: str = PField(description="JSON text: request fields with no effect, and PATCHed metadata")
    node_ip: str
    parent_id: str
    progress: int = PField(description="0-100")
    resource_name: str
    status: str = PField(description="running | completed | failed | cancelled | stuck")
    total_jobs: int
    updated_at: str
    bmc_ip: str
    message: str
    log_tail: list[str] = PField(default_factory=list, description="The installer's last log lines")


class ProgressOut(BaseModel):
    """One ``provision_progresses`` record (``POST /controlnode/provision/progress[/all]``)."""

    bmc_ip: str
    created_at: str
    id: int
    job_id: str = PField(description="active queue job id for UI cancel recovery")
    message: str = PField(description="detailed status message")
    percent_complete: int = PField(description="0-100")
    stage: str = PField(description='e.g. "Building ISO", "Mounting ISO", "Installing OS"')
    status: str = PField(description="running, completed, failed, cancelled, stuck")
    updated_at: str


def job_json(row: JobRow) -> dict[str, Any]:
    return JobOut(
        created_at=row.created_at.isoformat(),
        id=row.id,
        job_status=row.job_status,
        job_type=row.job_type,
        metadata=row.metadata_,
        node_ip=row.node_ip,
        parent_id=row.parent_id,
        progress=row.progress,
        resource_name=row.resource_name,
        status=row.status,
        total_jobs=row.total_jobs,
        updated_at=row.updated_at.isoformat(),
        bmc_ip=row.bmc_ip,
        message=row.message,
        log_tail=list(row.log_tail or []),
    ).model_dump()


def progress_json(row: ProvisionProgress) -> dict[str, Any]:
    assert row.id is not None
    return ProgressOut(
        bmc_ip=row.bmc_ip,
        created_at=row.created_at.isoformat(),
        id=row.id,
        job_id=row.job_id,
        message=row.message,
        percent_complete=row.percent_complete,
        stage=row.stage,
        status=row.status,
        updated_at=row.updated_at.isoformat(),
    ).model_dump()


def superseded(job: JobRow, seq: int, sent: datetime | None) -> bool:
    """The job shows an event newer than the one read at stream sequence ``seq``, sent at ``sent``.

    The stream's order decides; the sending time only tells a stream that was recreated (its
    sequence restarted: every new event has a lower one, and a later time) from a redelivery
    (lower sequence, earlier time — one job's events are sent one after another).
    """
    if not seq or seq >= job.event_seq:
        return False
    return sent is None or job.event_time is None or sent <= job.event_time


async def apply_progress(
    db: Database, message_id: str, ev: JobProgress, seq: int = 0, sent: datetime | None = None
) -> bool:
    """Apply one event read at stream sequence ``seq`` (0: unknown), sent at ``sent`` (False if it
    was applied before or superseded: a redelivered "queued" must not take a booting job back)."""
    return (await apply_many(db, [Delivered(message_id, ev, seq, sent)]))[0]


class Delivered(NamedTuple):
    """One event as the projector received it: envelope id, payload, stream sequence, sent at."""

    message_id: str
    event: JobProgress
    seq: int = 0
    sent: datetime | None = None


async def apply_many(db: Database, events: Sequence[Delivered]) -> list[bool]:
    """Apply a fetch's events in one transaction, in delivery order; for each, whether it
    changed the read model (see :func:`apply_progress`).

    The envelope ids are claimed in one statement and the jobs' rows locked in one, in id order
    (replicas applying batches side by side lock them in one order); each event is then judged
    against its job as the events before it in the batch left it — the same rules as one by one.
    """
    async with db.session() as s, s.begin():
        fresh = await claim_messages(s, processed_messages, CONSUMER, [d.message_id for d in events])
        ids = sorted({d.event.job_id for d in events if d.message_id in fresh})
        listed = sa.any_(sa.bindparam("ids", ids, type_=ARRAY(sa.String)))
        query = select(JobRow).where(JobRow.id == listed).order_by(JobRow.id).with_for_update()  # type: ignore[arg-type]
        jobs = {job.id: job for job in (await s.exec(query)).all()} if ids else {}
        applied: list[bool] = []
        for d in events:
            if d.message_id not in fresh:
                applied.append(False)
                continue
            fresh.discard(d.message_id)  # the same delivery twice in a fetch: applied once
            applied.append(_apply_one(s, jobs, d))
    return applied


def _apply_one(s: Any, jobs: dict[str, JobRow], d: Delivered) -> bool:
    ev, seq, sent = d.event, d.seq, d.sent
    job = jobs.get(ev.job_id)
    if job is not None and superseded(job, seq, sent):
        log.info("superseded event dropped", job_id=job.id, state=ev.state, seq=seq, shown=job.event_seq)
        return False
    if job is not None and job.job_status in TERMINAL_STATES and ev.state != job.job_status:
        # Terminal is final (the state machine has no way out): a late event of a job the
        # gateway already ended (dead-lettered, never reached a provisioner) changes nothing.
        log.warning("event for an ended job ignored", job_id=job.id, state=ev.state)
        return False
    if job is None:
        job = jobs[ev.job_id] = JobRow(
            id=ev.job_id, job_type=ev.job_type, bmc_ip=ev.bmc_ip, parent_id=ev.parent_id
        )
        s.add(job)
    job.job_status, job.status, job.progress = ev.state, ev.status, ev.percent
    job.message = ev.message
    if ev.log_tail:
        job.log_tail = list(ev.log_tail)
    job.node_ip = ev.node_ip or job.node_ip
    job.resource_name = ev.resource_name or job.resource_name
    if seq:
        job.event_seq, job.event_time = seq, sent
    job.updated_at = _now()
    s.add(
        ProvisionProgress(
            bmc_ip=ev.bmc_ip,
            job_id=ev.job_id,
            stage=ev.stage,
            percent_complete=ev.percent,
            message=ev.message,
            status=ev.status,
        )
    )
    return True


def failure_event(job: JobRow, message: str, status: str = "failed") -> JobProgress:
    """The progress event that ends a job the gateway holds live but no worker has."""
    return JobProgress(
        job_id=job.id,
        bmc_ip=job.bmc_ip,
        job_type=job.job_type,
        parent_id=job.parent_id,
        state=status,
        status=status,
        stage="Failed" if status == "failed" else "Cancelled",
        percent=job.progress,
        message=message,
        node_ip=job.node_ip,
        resource_name=job.resource_name,
    )


async def live_job(db: Database, job_id: str) -> JobRow | None:
    """The gateway's row of ``job_id`` if it is still live (not in a terminal state)."""
    async with db.session() as s:
        row = await s.get(JobRow, job_id)
    return row if row is not None and row.job_status not in TERMINAL_STATES else None


async def end_job(bus: Bus, job: JobRow, message: str, status: str = "failed") -> JobProgress:
    """Publish the event that ends ``job`` (one per job and status: the stream dedupes it)."""
    ev = failure_event(job, message, status)
    await bus.publish_event(
        ev,
        bus.subjects.evt("provision", f"job.{status}", job.id),
        entity=job.id,
        msg_id=f"{job.id}:gateway:{status}",
    )
    # A job the gateway ends (it never reached a provisioner, or its command was dead-lettered):
    # the one "job ended" line of that job (the provisioner writes it for every other end).
    (log.info if status in ("cancelled", "completed") else log.error)(
        "job ended",
        job_id=job.id,
        bmc_ip=job.bmc_ip,
        outcome=status,
        reason=message[:500],
        ended_by="gateway",
    )
    return ev


class ProvisionProjector:
    """Durable pull consumer of provision events → read model (shared by gateway replicas),
    plus the dead-letter consumer and the periodic reconcile of live jobs."""

    def __init__(
        self,
        bus: Bus,
        db: Database,
        *,
        lost_after: float = LOST_AFTER_S,
        reconcile_every: float = RECONCILE_EVERY_S,
        waiting: Callable[[], Any] | None = None,
        ack_wait: float = 30.0,
    ) -> None:
        self.bus, self.db, self.waiting, self.ack_wait = bus, db, waiting, ack_wait
        self.lost_after, self.reconcile_every = lost_after, reconcile_every
        self._consumers: list[Any] = []
        self._loop: asyncio.Task[None] | None = None

    async def _apply(self, envs: list[Any]) -> None:
        """A fetch's events in one transaction (a storm's ~5 events per job: one commit per
        fetch of up to 50, not one per event)."""
        await apply_many(self.db, [Delivered(e.id, e.data, e.stream_seq, e.time) for e in envs])

    async def _dead_lettered(self, ev: CommandFailed, _env: Any) -> None:
        """A ``StartProvision`` given up on: its job fails with the bus's human reason."""
        if ev.command_type != StartProvision.TYPE:
            return
        job = await live_job(self.db, ev.command_id)
        if job is not None:
            await end_job(self.bus, job, f"the provisioner could not take the job: {ev.message}")

    async def relayed_many(self, commands: Sequence[Any]) -> None:
        """The outbox relay published ``commands``: a queued job's clock restarts there, so a
        command that waited out a long bus outage is not taken for a lost one (one statement
        per batch, not one per job)."""
        ids = [c.job_id for c in commands if isinstance(c, StartProvision)]
        if ids:
            async with self.db.session() as s, s.begin():
                await s.exec(
                    sa.update(JobRow)
                    .where(JobRow.id.in_(ids), JobRow.job_status == "queued")  # type: ignore[attr-defined]
                    .values(updated_at=_now())
                )

    async def reconcile(self, job_ids: Collection[str] | None = None) -> list[str]:
        """Fail the live jobs (of ``job_ids`` if given) older than ``lost_after`` that no
        provisioner knows and whose command is not waiting in the outbox (``waiting``: a
        subquery of their dedupe ids); their ids. Without an answer from the provisioners (bus down, none
        running) nothing is failed: the request raises and the next round tries again.
        """
        cutoff = _now() - timedelta(seconds=self.lost_after)
        query = (
            select(JobRow)
            .where(JobRow.job_status.notin_(TERMINAL_STATES))  # type: ignore[attr-defined]
            .where(JobRow.job_type.in_(WORKER_JOB_TYPES))  # type: ignore[attr-defined]
            .where(JobRow.updated_at < cutoff)
        )
        if self.waiting is not None:  # a command still in the outbox has not been lost (bus down)
            query = query.where(JobRow.id.notin_(self.waiting()))  # type: ignore[attr-defined]
        if job_ids is not None:
            query = query.where(JobRow.id.in_(list(job_ids)))  # type: ignore[attr-defined]
        async with self.db.session() as s:
            rows = (await s.exec(query)).all()
        if not rows:
            return []
        entries = await self.bus.request(self.bus.subjects.query("provision", "queue"), QueueQuery())
        known = {QueueEntry.model_validate(e).job_id for e in entries}
        lost = [r for r in rows if r.id not in known]
        for job in lost:
            if await live_job(self.db, job.id) is not None:  # not ended meanwhile
                log.warning("job never reached a provisioner", job_id=job.id, bmc_ip=job.bmc_ip)
                await end_job(self.bus, job, NEVER_REACHED)
        return [j.id for j in lost]

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reconcile_every)
            try:
                await self.reconcile()
            except (KariosError, OSError, TimeoutError) as exc:
                log.warning("job reconcile skipped", error=type(exc).__name__)

    async def start(self) -> None:
        self._consumers.append(
            await self.bus.pull_events(
                CONSUMER,
                self.bus.subjects.events_of("provision"),
                JobProgress,
                self._apply,
                many=True,
                ack_wait=self.ack_wait,
            )
        )
        self._consumers.append(
            await self.bus.pull_events(
                FAILED_CONSUMER,
                self.bus.subjects.events_of_fact("provision", "command_failed"),
                CommandFailed,
                self._dead_lettered,
            )
        )
        self._loop = asyncio.create_task(self._reconcile_loop(), name="gateway-job-reconcile")

    async def stop(self) -> None:
        await cancel_and_wait(self._loop)
        for consumer in self._consumers:
            await consumer.stop()
