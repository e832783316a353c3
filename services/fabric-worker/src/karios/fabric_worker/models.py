"""Tables owned by the fabric worker (schema ``fabric``)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from karios.common.db import processed_messages_table

SCHEMA = "fabric"
SINGLETON_ID = 1


def _now() -> datetime:
    return datetime.now(UTC)


class FabricConfigRow(SQLModel, table=True):
    """The cluster-wide fabric config: exactly one row (id 1). Secrets are AES-GCM ciphertext."""

    __tablename__ = "fabric_config"
    __table_args__ = {"schema": SCHEMA}

    id: int = Field(default=SINGLETON_ID, primary_key=True)
    data: dict = Field(sa_type=sa.JSON, description="FabricConfigFields as JSON (field names as the seed)")
    bgp_password_enc: str | None = None
    ospf_auth_key_enc: str | None = None
    rollout_status: str = ""
    frr_hmac_sha_capable: bool | None = None  # written by preflight only
    underlay_mtu: int = 0  # preflight consensus; 0 = unknown
    underlay_cidr: str = ""  # last preflight's underlay_cidr (apply falls back to management_cidr)
    node_overrides: list = Field(default_factory=list, sa_type=sa.JSON)  # last preflight's overrides
    preflight_nodes: list = Field(default_factory=list, sa_type=sa.JSON)  # last preflight's NodeSeen list
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class VtepAllocationRow(SQLModel, table=True):
    """One VTEP loopback address per node. The primary key makes a double hand-out impossible."""

    __tablename__ = "vtep_allocations"
    __table_args__ = {"schema": SCHEMA}

    vtep_ip: str = Field(primary_key=True, max_length=64)
    node_ip: str = Field(unique=True, max_length=64)
    seq: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, sa.Identity(), nullable=False))
    allocated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class SwitchAckAudit(SQLModel, table=True):
    """Every accepted VTEP-pool move: who acknowledged which switch snippet (or skipped the gate)."""

    __tablename__ = "switch_ack_audit"
    __table_args__ = {"schema": SCHEMA}

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    acked_by: str
    caller: str
    caller_role: str
    switch_nos: str
    switch_snippet_hash: str
    old_range: str
    new_range: str
    skipped: bool = False


class FabricJobRow(SQLModel, table=True):
    """One fabric apply / teardown job: its summary as ``GET /fabric-config/latest`` shows it."""

    __tablename__ = "fabric_jobs"
    __table_args__ = {"schema": SCHEMA}

    job_id: str = Field(primary_key=True, max_length=64)
    job_type: str = Field(max_length=32)
    job_status: str = Field(max_length=32)
    summary: dict = Field(sa_type=sa.JSON)
    seq: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, sa.Identity(), nullable=False))
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    # Lease: the replica running the job and when it last said so (0003). A running row whose
    # heartbeat is older than the lease belongs to a dead replica and is recovered by a peer.
    owner: str = Field(default="", max_length=128)
    heartbeat_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    cancel_requested: bool = False
    request: dict = Field(default_factory=dict, sa_type=sa.JSON)  # what the job was asked (node_ip, vnis)


class NodeBaselineRow(SQLModel, table=True):
    """One node's state before an apply touched it (SecretBox-encrypted: frr.conf holds the BGP
    password / OSPF key). Kept until the job ends, so a peer can roll the node back after a crash."""

    __tablename__ = "node_baselines"
    __table_args__ = {"schema": SCHEMA}

    job_id: str = Field(primary_key=True, max_length=64)
    node_ip: str = Field(primary_key=True, max_length=64)
    baseline_enc: str
    recorded_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class NodeHostKeyRow(SQLModel, table=True):
    """First-seen SSH host key per node (trust on first use; a changed key is an error)."""

    __tablename__ = "node_host_keys"
    __table_args__ = {"schema": SCHEMA}

    node_ip: str = Field(primary_key=True, max_length=64)
    host_key: str
    first_seen_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class NodeDriftRow(SQLModel, table=True):
    """The last drift check of one node (no secrets: FRR files are reduced to sha256)."""

    __tablename__ = "node_drift"
    __table_args__ = {"schema": SCHEMA}

    node_ip: str = Field(primary_key=True, max_length=64)
    fqdn: str = ""
    drifted: bool = False
    findings: list = Field(default_factory=list, sa_type=sa.JSON)  # DriftFinding dicts
    held: list = Field(default_factory=list, sa_type=sa.JSON)  # not reported yet: {kind, message, why} (0007)
    frr_config_sha256: str = ""
    intent_sha256: str = ""
    checked_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    since: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class DriftRoundRow(SQLModel, table=True):
    """One row (id 1): the drift-round lease. The replica whose UPDATE moves ``started_at`` past
    the interval runs the round; the others skip it."""

    __tablename__ = "drift_round"
    __table_args__ = {"schema": SCHEMA}

    id: int = Field(default=SINGLETON_ID, primary_key=True)
    owner: str = Field(default="", max_length=128)
    started_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    finished_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))


class AppliedConfigRow(SQLModel, table=True):
    """One row (id 1): the configuration the last apply gave the nodes (the config row's
    columns as JSON, secrets still ciphertext). Drift checks it while an edit is pending (0007)."""

    __tablename__ = "applied_config"
    __table_args__ = {"schema": SCHEMA}

    id: int = Field(default=SINGLETON_ID, primary_key=True)
    config: dict = Field(sa_type=sa.JSON)
    applied_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


processed_messages = processed_messages_table(SQLModel.metadata, SCHEMA)
