"""Tables owned by the inventory service (schema ``inventory``)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from karios.common.db import processed_messages_table

SCHEMA = "inventory"


def _now() -> datetime:
    return datetime.now(UTC)


class BmcInfo(SQLModel, table=True):
    """The node registry: one row per server, keyed by BMC IP. Passwords are AES-GCM ciphertext."""

    __tablename__ = "bmc_infos"
    __table_args__ = {"schema": SCHEMA}

    bmc_ip: str = Field(primary_key=True, max_length=64)
    bmc_username: str | None = None
    bmc_password_enc: str | None = None
    os_hostname: str | None = None
    fqdn: str | None = None
    os_ip: str | None = Field(default=None, index=True)
    os_username: str | None = None
    os_password_enc: str | None = None
    primary_mac: str | None = None
    serial_number: str | None = None
    vendor: str | None = None
    atlas_device_id: int | None = None
    atlas_location_id: int | None = None
    atlas_rack_id: int | None = None
    atlas_site_id: int | None = None
    is_control_node: bool = False
    ssh_host_key: str | None = None
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


class ComputeNodeRow(SQLModel, table=True):
    """A compute node of the fabric, adopted by OS address or registered at first boot. The
    password and private key are SecretBox ciphertext (contexts ``node:`` / ``node-key:<node_ip>``);
    ``host_key`` is the key pinned at adoption (the fabric worker's pin store holds it too)."""

    __tablename__ = "compute_nodes"
    __table_args__ = {"schema": SCHEMA}

    node_ip: str = Field(primary_key=True, max_length=64)
    bmc_ip: str | None = Field(default=None, max_length=64, index=True)
    hostname: str | None = Field(default=None, max_length=253)
    ssh_port: int = 22
    os_username: str = Field(default="root", max_length=128)
    os_password_enc: str | None = None
    ssh_private_key_enc: str | None = None
    host_key: str | None = None
    host_key_fingerprint: str | None = Field(default=None, max_length=128)
    source: str = Field(default="adopted", max_length=16)
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


processed_messages = processed_messages_table(SQLModel.metadata, SCHEMA)
