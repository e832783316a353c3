"""The gateway's read model of provisioning: ``jobs`` and ``provision_progresses`` (schema ``gateway``).

:class:`ProvisionProjector` is a durable JetStream consumer of ``evt.provision.>``; each event is
applied in one transaction with ``claim_message`` so a redelivered event changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Any

import nats.errors
import sqlalchemy as sa
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlmodel import Field, SQLModel

from karios.api_gateway.models import SCHEMA, processed_messages
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import JobProgress
from karios.common.db import Database, claim_message
from karios.common.telemetry import get_logger

log = get_logger(__name__)
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


def job_json(row: JobRow) -> dict[str, Any]:
    return {
        "created_at": row.created_at.isoformat(),
        "id": row.id,
        "job_status": row.job_status,
        "job_type": row.job_type,
        "metadata": row.metadata_,
        "node_ip": row.node_ip,
        "parent_id": row.parent_id,
        "progress": row.progress,
        "resource_name": row.resource_name,
        "status": row.status,
        "total_jobs": row.total_jobs,
        "updated_at": row.updated_at.isoformat(),
        "bmc_ip": row.bmc_ip,
        "message": row.message,
    }


def progress_json(row: ProvisionProgress) -> dict[str, Any]:
    return {
        "bmc_ip": row.bmc_ip,
        "created_at": row.created_at.isoformat(),
        "id": row.id,
        "job_id": row.job_id,
        "message": row.message,
        "percent_complete": row.percent_complete,
        "stage": row.stage,
        "status": row.status,
        "updated_at": row.updated_at.isoformat(),
    }


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
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None

    async def start(self) -> None:
        cfg = ConsumerConfig(
            durable_name=CONSUMER,
            filter_subject=self.bus.subjects.events_of("provision"),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=30,
            max_ack_pending=1000,
        )
        self._sub = await self.bus.js.pull_subscribe(
            self.bus.subjects.events_of("provision"),
            durable=CONSUMER,
            stream=self.bus.subjects.evt_stream,
            config=cfg,
        )
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                msgs = await self._sub.fetch(50, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("projector fetch failed", error=type(exc).__name__)
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                await self._handle(msg)

    async def _handle(self, msg: Any) -> None:
        try:
            env = json.loads(msg.data)
            if env.get("type") != JobProgress.TYPE:
                await msg.ack()
                return
            await apply_progress(self.db, env["id"], JobProgress.model_validate(env["data"]))
            await msg.ack()
        except Exception as exc:
            log.warning("projector could not apply event", subject=msg.subject, error=type(exc).__name__)
            await msg.nak(delay=1.0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
