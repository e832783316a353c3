"""Contracts owned by the provisioner: provision/unprovision jobs, installer callbacks, progress events.

Flow: the gateway accepts ``POST /controlnode/provision…``, answers 202 with a job id and sends
:class:`StartProvision` (``cmd.provision.start``, ``msg_id`` = job id so JetStream drops a duplicate
publish). The provisioner emits :class:`JobProgress` on ``evt.provision.job.<state>.<job_id>`` for every
transition and every installer step; the gateway's projector turns them into its read model.
Installer callbacks and cancel are request/reply (``req.provision.<verb>``) so the caller gets the
verdict (401 wrong token, 409 finished job) synchronously.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from karios.common.contracts.base import Command, Event, Query


class ProvisionSpec(BaseModel):
    """Every field of the seed's provision request (after validation by the gateway)."""

    bmc_ip: str
    vendor: str
    hostname: str = ""
    debian_version: str = "12"
    arch: str = "amd64"
    os_username: str = "debian"
    os_password_enc: str | None = None  # SecretBox, context "os:<bmc_ip>"
    root_pass_enc: str | None = None
    selected_disks: list[str] = Field(default_factory=list)
    pool_type: str = "single"
    selected_nic: str = ""
    selected_nic_legacy: str = ""
    selected_nic_mac: str = ""
    mac_address: str = ""
    prefix_id: int | None = None
    network_role: str = ""
    gpu_passthrough: Any = None
    controlnode_host: str = ""
    controlnode_port: str = ""
    device_id: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)  # accepted fields with no effect yet


class StartProvision(Command):
    TYPE = "karios.provision.start.v1"

    job_id: str
    job_type: str = "provision"  # provision | unprovision
    parent_id: str = ""
    spec: ProvisionSpec
    bmc_username: str | None = None  # unprovision may carry credentials (encrypted)
    bmc_password_enc: str | None = None


class JobProgress(Event):
    """One transition or installer step of a job. Never carries secrets or the job token."""

    TYPE = "karios.provision.job_progress.v1"

    job_id: str
    bmc_ip: str
    job_type: str = "provision"
    parent_id: str = ""
    state: str
    status: str  # running | completed | failed | cancelled | stuck (the seed's progress status)
    stage: str
    percent: int = 0
    message: str = ""
    node_ip: str = ""
    resource_name: str = ""
    attempt: int = 1


class CallbackRequest(Query):
    """An installer callback relayed by the gateway (``req.provision.step|complete|firstboot``)."""

    TYPE = "karios.provision.callback.v1"

    job_id: str = ""
    token: str = ""
    step: str = ""
    state: str = ""  # active | done | failed
    percent: int | None = None
    os_ip: str = ""
    os_password_enc: str | None = None
    bmc_ip: str = ""


class CancelJob(Query):
    TYPE = "karios.provision.cancel.v1"
    job_id: str


class QueueQuery(Query):
    TYPE = "karios.provision.queue_query.v1"


class QueueEntry(BaseModel):
    job_id: str
    bmc_ip: str
    job_type: str
    state: str
    position: int  # 1-based among queued jobs; 0 = active
    created_at: str


class JobView(BaseModel):
    job_id: str
    bmc_ip: str
    state: str
    status: str
    message: str = ""


# -- contracts the provisioner needs from the inventory (not answered by inventory yet) -----------


class BmcCredentialsQuery(Query):
    """``q.inventory.bmc_credentials``: the registry's BMC user and *encrypted* password."""

    TYPE = "karios.inventory.bmc_credentials_query.v1"
    bmc_ip: str


class BmcCredentials(BaseModel):
    bmc_ip: str
    username: str = ""
    password_enc: str = ""  # SecretBox, context "bmc:<bmc_ip>"


class AllocateIp(Query):
    """``req.inventory.allocate_ip``: one free address of NetBox prefix ``prefix_id`` for ``hostname``."""

    TYPE = "karios.inventory.allocate_ip.v1"
    prefix_id: int
    hostname: str
    mac: str = ""


class AllocatedIp(BaseModel):
    address: str  # CIDR, e.g. 10.0.0.5/24
    gateway: str = ""
    nameservers: list[str] = Field(default_factory=list)
