"""Tables owned by the gateway (schema ``gateway``): API tokens and the read models; and the
request bodies of the provisioning routes (the seed's field names)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, StrictInt
from pydantic import Field as PField
from sqlmodel import Field, SQLModel

from karios.common.db import processed_messages_table
from karios.common.limits import (
    BoundedIP,
    Ident,
    Int32Id,
    IPText,
    Label,
    Name,
    SafeText,
    Secret,
    SshPassword,
    Text,
    Vendor,
)
from karios.common.provisioning import VENDORS

SCHEMA = "gateway"


def _now() -> datetime:
    return datetime.now(UTC)


class ApiToken(SQLModel, table=True):
    """An operator token. Only its SHA-256 is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = {"schema": SCHEMA}

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=200, unique=True)
    role: str = Field(max_length=32)
    token_hash: str = Field(max_length=64, unique=True, index=True)
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    revoked: bool = False


processed_messages = processed_messages_table(SQLModel.metadata, SCHEMA)


# -- provisioning request bodies ----------------------------------------------------------
NO_EFFECT = "No effect: accepted for compatibility and kept in the job's metadata"


class ProvisionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    bmc_IP: BoundedIP = PField(
        description="BMC IP address (required; must be in the inventory); one running job per BMC"
    )
    vendor: Vendor = PField(description=f"BMC driver (required): {' | '.join(VENDORS)}")
    hostname: Label = PField("", description="OS hostname: lowercase letters, digits and '-' (max 63)")
    debian_version: Text = PField("12", description="12/bookworm or 13/trixie (the OS catalog's releases)")
    arch: Text = PField("amd64", description="Only amd64 media are built")
    os_username: Name = PField("debian", description="OS user created by the installer (a Linux user name)")
    os_password: SshPassword | None = PField(
        None, description="OS password (default adminadmin); Karios logs in with it over SSH"
    )
    root_pass: Secret | None = PField(None, description="Root password; root login disabled when unset")
    selected_disks: list[Name] = PField(
        default_factory=list, max_length=64, description="Install disks (sda or /dev/sda)"
    )
    pool_type: Text = PField(
        "single",
        description="single|stripe|mirror|raidz1|raidz2: an OpenZFS pool of the selected disks (root on "
        "ZFS), "
        "or md RAID -/0/1/5/6 with pool_backend md",
    )
    pool_backend: Literal["zfs", "md"] | None = PField(
        None,
        description="zfs: an OpenZFS pool, root on a dataset, /boot ext4 on every disk; md: Linux md RAID "
        "(single: a plain ext4 partition). Default: zfs for a pool of several disks on Karios's own image, "
        "md otherwise (single, install_method preseed, a catalog root archive)",
    )
    selected_nic: Text = PField("", description="Installer interface name (default: auto)")
    selected_nic_legacy: Text = PField("", description=NO_EFFECT)
    selected_nic_mac: Text = PField("", description="MAC of the selected NIC")
    mac_address: Text = PField("", description=NO_EFFECT)
    prefix_id: Int32Id | None = PField(
        None, description="Static address from this inventory prefix (NetBox) or the file inventory's pool"
    )
    network_role: Text = PField("", description=NO_EFFECT)
    gpu_passthrough: Any = PField(None, description="true, [vendor:device ids] or {device_ids, iommu}")
    controlnode_host: Text = PField("", description="Callback host the installer uses (default: public URL)")
    controlnode_port: Name = PField("", description="Callback port")
    device_id: Int32Id | None = PField(None, description=NO_EFFECT)
    ssh_authorized_keys: list[Text] = PField(
        default_factory=list,
        max_length=16,
        description="OpenSSH public keys (one per item) authorized for os_username on the installed system",
    )
    install_method: Literal["image", "preseed"] | None = PField(
        None,
        description="image: a live environment writes a prebuilt Debian root filesystem (complete and "
        "fast); preseed: the Debian installer (needs a complete mirror). Default: the provisioner's "
        "KARIOS_PROVISIONER_INSTALL_METHOD",
    )
    image: Label = PField(
        "",
        description="An image of the catalog (GET /controlnode/images) to install instead of Karios's own "
        "Debian: a whole-disk image is written to one disk (pool_type single) with a cloud-init seed, a "
        "root archive onto the pool. Implies install_method image. Default: Karios's own image",
    )
    mirror: Text = PField(
        "", description="Debian archive for this install, host[:port]/dir or URL (default: the deployment's)"
    )
    http_proxy: Text = PField(
        "", description="HTTP proxy the installer downloads through, http://host:port (default: deployment's)"
    )
    branch: Text = PField("", description=NO_EFFECT)
    cache_dir: Text = PField("", description=NO_EFFECT)
    kubernetes_cluster_name: Text = PField("", description=NO_EFFECT)
    kubernetes_cluster_type: Text = PField("", description=NO_EFFECT)
    location: Text = PField("", description=NO_EFFECT)
    output_iso: Text = PField("", description=NO_EFFECT)
    pxe_path: Text = PField("", description=NO_EFFECT)
    pxe_server: Text = PField("", description=NO_EFFECT)
    rack_number: Text = PField("", description=NO_EFFECT)
    sys_iuri: Text = PField("", description=NO_EFFECT)
    vm_slot: Text = PField("", description=NO_EFFECT)
    zone: Text = PField("", description=NO_EFFECT)
    parent_id: Ident = PField("", description="Batch job id: jobs started by one UI action share it")


class Accepted(BaseModel):
    job_id: str
    message: str
    status: str = "queued"
    success: bool = True


class BmcIpBody(BaseModel):
    bmc_ip: BoundedIP


class StepBody(BaseModel):
    # Installer callbacks are machine-written: an unknown field or a percent sent as a string is a
    # bug in the installer script, answered 422 like every other body (issue 24 D8).
    model_config = ConfigDict(extra="forbid")
    step: SafeText = PField(min_length=1, max_length=200, description="Stage key (network, partitioning, …)")
    state: Literal["active", "done", "failed"]
    percent: StrictInt | None = PField(None, ge=0, le=100, description="Default: the stage's percentage")
    message: SafeText | None = PField(
        None, max_length=16384, description="The installer's own words (the first 1 KB is kept)"
    )
    log: list[SafeText] | None = PField(
        None, max_length=1000, description="The installer's last log lines (the last 50 × 300 chars are kept)"
    )


class CompleteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    os_ip: IPText = ""
    os_password: SshPassword | None = None
    message: SafeText | None = PField(
        None, max_length=16384, description="Summary (e.g. a wipe's per-disk results; first 1 KB kept)"
    )
    log: list[SafeText] | None = PField(
        None, max_length=1000, description="The installer's last log lines (the last 50 × 300 chars are kept)"
    )


class FirstbootBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bmc_ip: BoundedIP
    os_ip: BoundedIP


class UnprovisionBody(BaseModel):
    bmc_ip: BoundedIP
    bmc_user: Name | None = None
    bmc_pass: Secret | None = None
    vendor: Vendor = "generic"


class JobPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: Text | dict[str, Any] | None = None
    resource_name: SafeText | None = PField(None, max_length=255)
