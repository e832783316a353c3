"""The gateway's read model of provisioning: ``jobs`` and ``provision_progresses`` (schema ``gateway``).

:class:`ProvisionProjector` is a durable pull consumer (``Bus.pull_events``) of ``evt.provision.>``;
each event is applied in one transaction with ``claim_message`` so a redelivered event changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from pydantic import Field as PField
from sqlmodel import Field, SQLModel

from karios.api_gateway.models import SCHEMA, processed_messages
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import JobProgress
from karios.common.db import Database, claim_message

CONSUMER = "gateway-provision-projector"


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


async def apply_progress(db: Database, message_id: str, ev: JobProgress) -> bool:
    """Apply one event (False if it was applied before)."""
    async with db.session() as s, s.begin():
        if not await claim_message(s, processed_messages, CONSUMER, message_id):
            return False
        job = await s.get(JobRow, ev.job_id, with_for_update=True)
        if job is None:
            job = JobRow(id=ev.job_id, job_type=ev.job_type, bmc_ip=ev.bmc_ip, parent_id=ev.parent_id)
            s.add(job)
        job.job_status, job.status, job.progress = ev.state, ev.status, ev.percent
        job.message = ev.message
        if ev.log_tail:
            job.log_tail = list(ev.log_tail)
        job.node_ip = ev.node_ip or job.node_ip
        job.resource_name = ev.resource_name or job.resource_name
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


class ProvisionProjector:
    """Durable pull consumer of provision events → read model (shared by gateway replicas)."""

    def __init__(self, bus: Bus, db: Database) -> None:
        self.bus, self.db = bus, db
        self._consumer: Any = None

    async def _apply(self, ev: JobProgress, env: Any) -> None:
        await apply_progress(self.db, env.id, ev)

    async def start(self) -> None:
        self._consumer = await self.bus.pull_events(
            CONSUMER, self.bus.subjects.events_of("provision"), JobProgress, self._apply
        )

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
