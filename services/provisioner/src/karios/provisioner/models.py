"""Tables owned by the provisioner (schema ``provision``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

SCHEMA = "provision"


def _now() -> datetime:
    return datetime.now(UTC)


class Job(SQLModel, table=True):
    """One provisioning attempt. The installer token is stored as its SHA-256 only."""

    __tablename__ = "jobs"
    __table_args__ = {"schema": SCHEMA}

    id: str = Field(primary_key=True, max_length=64)
    job_type: str = Field(default="provision", max_length=32)
    parent_id: str = Field(default="", max_length=64)
    bmc_ip: str = Field(max_length=64, index=True)
    vendor: str = Field(default="", max_length=32)
    hostname: str = Field(default="", max_length=255)
    state: str = Field(default="queued", max_length=32)
    message: str = Field(default="")
    percent: int = 0
    token_hash: str = Field(default="", max_length=64)
    os_ip: str = Field(default="", max_length=64)
    os_password_enc: str | None = None
    # when the installer's /complete was accepted: the token is then good for one /firstboot
    # within KARIOS_PROVISIONER_FIRSTBOOT_WINDOW, nothing else (jobs/tokens.py)
    installed_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    stage_deadline: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    # Worker phase (queued → building_media → mounting → booting): the replica working the job
    # holds a lease it renews (JobLease); an expired lease lets any replica claim and resume it.
    owner: str = Field(default="", max_length=128)
    attempts: int = 0  # how many times a worker took the job (first run = 1)
    token_enc: str | None = None  # the installer token, SecretBox context "job-token:<id>"
    reset_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))  # power reset
    # admission control: set when the job may start its BMC/media work (jobs/admission.py)
    admitted_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    method: str = Field(default="", max_length=32)  # install method: preseed | image | wipe
    log_tail: list[str] | None = Field(default=None, sa_type=sa.JSON)  # installer's last log lines
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class JobLease(SQLModel, table=True):
    """The lease of a worker-phase job (only those have one): renewed by its owner's heartbeat
    every ``lease_seconds / 3``, so kept apart from the wide job row (migration 0011)."""

    __tablename__ = "job_leases"
    __table_args__ = {"schema": SCHEMA, "postgresql_with": {"fillfactor": 50}}

    job_id: str = Field(primary_key=True, max_length=64, foreign_key=f"{SCHEMA}.jobs.id", ondelete="CASCADE")
    # '-infinity': handed back (a graceful stop), claimable at once
    lease_until: datetime = Field(sa_type=sa.DateTime(timezone=True))
