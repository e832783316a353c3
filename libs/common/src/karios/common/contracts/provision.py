"""Contracts owned by the provisioner: provision/unprovision jobs, installer callbacks, progress events.

Flow: the gateway accepts ``POST /controlnode/provision…``, answers 202 with a job id and sends
:class:`StartProvision` (``cmd.provision.start``, ``msg_id`` = job id so JetStream drops a duplicate
publish). The provisioner emits :class:`JobProgress` on ``evt.provision.job.<state>.<job_id>`` for every
transition and every installer step; the gateway's projector turns them into its read model.
Installer callbacks and cancel are request/reply (``req.provision.<verb>``) so the caller gets the
verdict (401 wrong token, 409 finished job) synchronously.
"""

from __future__ import annotations

import functools
import hashlib
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
    # zfs | md; None: zfs for a pool of several disks on Karios's own image, else md
    # (karios.common.provisioning.resolve_pool_backend).
    pool_backend: str | None = None
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
    # None: the provisioner's default (KARIOS_PROVISIONER_INSTALL_METHOD); unprovision always wipes.
    ssh_authorized_keys: list[str] = Field(default_factory=list)  # OpenSSH public keys for os_username
    install_method: str | None = None  # image | preseed
    # An image of the catalog (contracts/images.py) instead of Karios's own ("": Karios's own);
    # installed by the image method: a whole-disk image to one disk, a root archive to the pool.
    image: str = ""
    mirror: str = ""  # host[:port]/dir of the Debian archive for this install ("" = deployment default)
    http_proxy: str = ""  # HTTP proxy the installer downloads through ("" = deployment default)
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
    attempt: int = 1  # which worker attempt (2+ after a provisioner restart handed the job over)
    log_tail: list[str] = Field(default_factory=list)  # the installer's last log lines (≤ 50)


class InstallerReport(BaseModel):
    """What an installer callback says (both versions of the callback request)."""

    step: str = ""
    state: str = ""  # active | done | failed
    percent: int | None = None
    message: str = ""  # the installer's own words (≤ 1 KB kept)
    log: list[str] = Field(default_factory=list)  # the installer's last log lines (≤ 50 × 300 kept)
    os_ip: str = ""
    os_password_enc: str | None = None  # SecretBox, context "os-job:<job_id>"
    bmc_ip: str = ""  # firstboot


class CallbackRequest(InstallerReport, Query):
    """An installer callback relayed by the gateway (``req.provision.step|complete|firstboot``).

    Superseded by :class:`CallbackRequestV2` (this version carried the job token in clear); no
    longer sent or accepted."""

    TYPE = "karios.provision.callback.v1"

    job_id: str = ""
    token: str = ""


def job_token_hash(token: str) -> str:
    """The job token as the provisioner stores it and the bus carries it: SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


class CallbackRequestV2(InstallerReport, Query):
    """An installer callback relayed by the gateway (``req.provision.step|complete|firstboot``).

    The job token never travels: the gateway sends its SHA-256 (:func:`job_token_hash`), which the
    provisioner compares in constant time with the job's. Which callback a token is good for, in
    which job state and how many times, is the provisioner's rule (docs/provisioning.md).
    """

    TYPE = "karios.provision.callback.v2"

    job_id: str = ""  # step, complete (firstboot names the BMC instead)
    token_sha256: str = ""  # SHA-256 (hex) of the job token the installer presented; "" = none


class CancelJob(Query):
    TYPE = "karios.provision.cancel.v1"
    job_id: str


class JobRequestQuery(Query):
    """What one provision job was asked to do (``q.provision.job_request``; 404 unknown job)."""

    TYPE = "karios.provision.job_request_query.v1"
    job_id: str


class JobRequestView(BaseModel):
    """A job's request as the provisioner stored it, without its secrets: the console's job page
    (hostname, OS, method) and its retry, which sends the same request again. A password is
    never answered, only whether the request carried one (a retry asks for it again)."""

    job_id: str
    job_type: str = "provision"
    bmc_ip: str
    vendor: str = ""
    hostname: str = ""
    debian_version: str = "12"
    install_method: str = Field("", description="The request's method ('': the deployment's default)")
    method: str = Field("", description="The method the job uses (image | preseed | wipe)")
    image: str = Field("", description="The catalog image the request named ('': Karios's own)")
    arch: str = "amd64"
    os_username: str = "debian"
    selected_disks: list[str] = Field(default_factory=list)
    pool_type: str = "single"
    pool_backend: str = Field("", description="How the pool is built: zfs | md ('' : not asked)")
    selected_nic: str = ""
    selected_nic_mac: str = ""
    ssh_authorized_keys: list[str] = Field(default_factory=list)
    mirror: str = ""
    http_proxy: str = ""
    gpu_passthrough: Any = None
    controlnode_host: str = ""
    controlnode_port: str = ""
    prefix_id: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    has_os_password: bool = False
    has_root_pass: bool = False


class QueueQuery(Query):
    """The provision queue, `limit` entries from `offset` (0: all of them). A reply is one NATS
    message (1 MB by default: ~5,000 entries), so the gateway asks for pages of
    :data:`QUEUE_PAGE`."""

    TYPE = "karios.provision.queue_query.v1"
    offset: int = Field(0, ge=0)
    limit: int = Field(0, ge=0)


QUEUE_PAGE = 2000  # queue entries per reply (~200 bytes each: ~400 KB of the 1 MB a message holds)


class QueueEntry(BaseModel):
    job_id: str
    bmc_ip: str
    job_type: str
    state: str
    position: int  # 1-based among queued jobs; 0 = active
    created_at: str
    vendor: str = ""
    # a queued job: why admission control holds it ("overall" | "vendor:<v>"; "" = being admitted)
    waiting_for: str = ""


class AdmissionQuery(Query):
    TYPE = "karios.provision.admission_query.v1"


class AdmissionLimits(BaseModel):
    overall: int  # admitted jobs at once (BMC probe, medium, insert, reset), all replicas
    per_vendor: int
    vendors: dict[str, int] = Field(default_factory=dict)  # per-vendor overrides of per_vendor


class Admission(BaseModel):
    """Admission control now: the limits and the admitted jobs (all replicas)."""

    limits: AdmissionLimits
    active: int  # admitted jobs not yet booting (queued once admitted, building_media, mounting)
    active_by_vendor: dict[str, int] = Field(default_factory=dict)
    queued: int


class ImageQuery(Query):
    """The image a provision would install, for the gateway's disk-size check before the 202."""

    TYPE = "karios.provision.image_query.v1"
    suite: str  # the Debian suite of the request's debian_version
    install_method: str | None = None  # the request's (None: the provisioner's default)


class ImageInfo(BaseModel):
    method: str  # the install method such a job uses
    suite: str
    # What the image takes once installed (its manifest); None: unknown (not built yet, or a
    # method without an image, like preseed) — the gateway then checks nothing.
    installed_bytes: int | None = None


class JobView(BaseModel):
    job_id: str
    bmc_ip: str
    state: str
    status: str
    message: str = ""
    log_tail: list[str] = Field(default_factory=list)


# BMC credentials (``q.inventory.bmc_access`` → BmcAccess) and static addresses
# (``req.inventory.allocate_ip`` → IpAllocation) are inventory contracts: see contracts/inventory.py.


# -- rules shared by the gateway (422 at the door) and the provisioner (preseed) -----------------

# pool_type (the UI's ZFS-style names) → (Linux md-RAID level, min disks, max disks); a ZFS pool
# (pool_backend zfs) takes the same disk counts (provisioning.ZFS_VDEVS).
POOL_TYPES: dict[str, tuple[int | None, int, int | None]] = {
    "single": (None, 1, 1),
    "stripe": (0, 2, None),
    "mirror": (1, 2, None),
    "raidz1": (5, 3, None),
    "raidz2": (6, 4, None),
}

DEBIAN_SUITES = {"12": "bookworm", "13": "trixie", "bookworm": "bookworm", "trixie": "trixie"}


def check_pool(pool_type: str | None, disks: list[str]) -> tuple[str, int | None]:
    """(pool type, md level) or ValidationFailed naming ``pool_type``/``selected_disks``."""
    from karios.common.errors import ValidationFailed

    name = (pool_type or "single").lower()
    if name not in POOL_TYPES:
        raise ValidationFailed(
            f"pool_type: {pool_type!r} is not one of {', '.join(POOL_TYPES)}", field="pool_type"
        )
    level, lo, hi = POOL_TYPES[name]
    if not disks and name == "single":
        return name, level
    if len(disks) < lo or (hi is not None and len(disks) > hi):
        want = f"exactly {lo}" if hi == lo else f"at least {lo}"
        raise ValidationFailed(
            f"selected_disks: pool_type {name} needs {want} disks, got {len(disks)}", field="selected_disks"
        )
    return name, level


@functools.cache
def debian_suites() -> dict[str, str]:
    """``debian_version`` spellings → suite, from the OS catalog shared with bootapi.

    A Debian entry of the catalog (installer ``preseed``, platform ``debian-<N>``) with
    ``vars.suite`` makes that release provisionable: adding a release is one YAML file.
    """
    from karios.common.oscatalog import default_set_dir, load_catalog

    suites: dict[str, str] = {}
    for entry in load_catalog(default_set_dir() / "catalog").entries:
        suite = str(entry.vars.get("suite", "")) if entry.installer == "preseed" else ""
        for platform in entry.platforms if suite else ():
            if platform.startswith("debian-") and platform[7:].isdigit():
                suites[platform[7:]] = suite
                suites[suite] = suite
    return suites or dict(DEBIAN_SUITES)


def check_debian_version(version: str | None) -> str:
    """The suite of ``debian_version`` ("12", "13.1", "bookworm") or ValidationFailed."""
    from karios.common.errors import ValidationFailed

    suites = debian_suites()
    key = (version or "12").strip().lower().split(".")[0]
    if key not in suites:
        known = ", ".join(sorted(k for k in suites if k.isdigit()))
        raise ValidationFailed(
            f"debian_version: {version!r} is not in the OS catalog (known: {known})", field="debian_version"
        )
    return suites[key]
