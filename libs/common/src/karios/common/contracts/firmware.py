"""Contracts of a firmware update through a server's BMC (issue 27 item 5).

``POST /controlnode/bmc/{ip}/firmware-update`` (fabric_admin) sends
``req.provision.start_firmware_update`` (:class:`StartFirmwareUpdate`): the provisioner refuses
(409 ``FIRMWARE_UPDATE_REFUSED``) while a provision job or another update uses the BMC, else
stores an update record and answers it at once (state ``queued``, or ``held`` with
``when=before_next_install``: the policy that runs updates before an install in the same maintenance
window — the BMC's next provision job runs its held updates, oldest first, after its BMC check and
before it builds and boots its medium, and fails if one does not succeed); the update runs in the
provisioner: the image's sha256 checked, the BMC's ``UpdateService.SimpleUpdate`` (or the vendor's
multipart push where the quirk table says so), the returned Task followed until it ends, and
the versions read back from ``FirmwareInventory``. ``GET /controlnode/bmc/{ip}/firmware-updates/{id}``
asks ``q.provision.firmware_update`` (:class:`FirmwareUpdateQuery`).

Progress: ``karios.evt.provision.firmware.progress.<bmc ip>`` (:class:`FirmwareUpdateProgress`), on
SSE as ``firmware_progress`` in the channels ``provision``, ``job:<update id>`` and ``node:<bmc ip>``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from karios.common.contracts.base import Event, Query
from karios.common.errors import Conflict, KariosError, NotFound, register_error
from karios.common.limits import BoundedIP

ApplyTime = Literal["immediate", "on_reset"]
UpdateMethod = Literal["simple_update", "multipart_push"]
UpdateState = Literal[
    "held", "queued", "verifying", "transferring", "running", "succeeded", "failed", "timed_out"
]
UpdateWhen = Literal["now", "before_next_install"]
#: The states an update does not leave.
FIRMWARE_TERMINAL = frozenset({"succeeded", "failed", "timed_out"})


class StartFirmwareUpdate(Query):
    """Update firmware through the BMC at ``bmc_ip``: one image (a URL, or a name under the
    provisioner's images directory), its sha256 (checked before the BMC sees it)."""

    TYPE = "karios.provision.start_firmware_update.v1"
    bmc_ip: BoundedIP
    image_url: str = Field(
        "", max_length=2048, description="http(s) URL of the image ('' when `image` is set)"
    )
    image: str = Field(
        "",
        max_length=512,
        description="An image already under the provisioner's images directory (served at /images/)",
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="The image's SHA-256, lower-case hex")
    targets: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Redfish URIs the update applies to (FirmwareInventory members, or a System/Manager); "
        "empty: the BMC decides from the image",
    )
    apply_time: ApplyTime = Field(
        "immediate",
        description="immediate: the BMC applies it now; on_reset: staged, applied at the next reset "
        "(refused by a BMC that does not advertise OnReset)",
    )
    timeout_s: int = Field(
        1800, ge=10, le=14400, description="Seconds the Task may run before the update times out"
    )
    when: UpdateWhen = Field(
        "now",
        description="now: run at once; before_next_install: held (state `held`) until the next provision "
        "job of this BMC, which runs it after its BMC check and before it builds and boots its medium "
        "(the same maintenance window); the job fails if the update does not succeed",
    )
    requested_by: str = Field("", max_length=128, description="Who asked (audit), never a secret")


class FirmwareUpdateQuery(Query):
    """One firmware update record."""

    TYPE = "karios.provision.firmware_update_query.v1"
    update_id: str = Field(max_length=64)
    bmc_ip: str = Field("", max_length=64, description="When set, the update must be of this BMC")


class FirmwareComponentResult(BaseModel):
    """One component's version before and after, read from the BMC's FirmwareInventory (or, for
    a System / Manager target, its BiosVersion / FirmwareVersion)."""

    id: str
    name: str = ""
    kind: str = "other"
    uri: str = ""
    version_before: str = ""
    version_after: str = ""
    outcome: Literal["updated", "unchanged", "added", "removed", "pending_reset"] = Field(
        description="updated: the version changed; unchanged: a target whose version did not change; "
        "pending_reset: unchanged and the update applies at the next reset; added/removed: the "
        "component appeared or disappeared"
    )


class FirmwareUpdateView(BaseModel):
    """A firmware update: what was asked, where it is, and what changed."""

    id: str
    bmc_ip: str
    state: UpdateState
    percent: int = Field(0, ge=0, le=100)
    method: UpdateMethod | Literal[""] = Field(
        "", description="How the image reached the BMC ('' not yet chosen)"
    )
    image_url: str = Field(description="The URL the BMC was (or is to be) given")
    image: str = Field("", description="The registered image it names ('' a URL was given)")
    sha256: str
    targets: list[str] = Field(default_factory=list)
    apply_time: ApplyTime = "immediate"
    timeout_s: int = 1800
    when: UpdateWhen = "now"
    provision_job_id: str = Field("", description="The provision job that ran it (when=before_next_install)")
    task_uri: str = Field("", description="The Task / task monitor the BMC answered with ('' none)")
    task_state: str = Field(
        "", description="The Task's last TaskState (New, Running, Completed, Exception, …)"
    )
    messages: list[str] = Field(
        default_factory=list, description="The Task's messages, newest last (bounded)"
    )
    components: list[FirmwareComponentResult] = Field(default_factory=list)
    error: str = ""
    requested_by: str = ""
    created_at: str
    updated_at: str
    finished_at: str = ""


class FirmwareUpdateProgress(Event):
    """A firmware update moved (state, percent, the Task's state or a new message)."""

    TYPE = "karios.provision.firmware_update_progress.v1"

    job_id: str = Field(description="The update's id (SSE channel job:<id>)")
    bmc_ip: str
    state: UpdateState
    percent: int = 0
    task_state: str = ""
    message: str = ""
    components: list[FirmwareComponentResult] = Field(
        default_factory=list, description="Set when the update has ended"
    )


@register_error
class FirmwareUpdateRefused(Conflict):
    """The update cannot start now: a provision job or another firmware update uses the BMC."""

    code = "FIRMWARE_UPDATE_REFUSED"
    http_status = 409


@register_error
class FirmwareBeforeInstallFailed(KariosError):
    """A firmware update held for the install did not succeed: the provision job fails before its
    medium is built (nothing is installed on a server whose flash failed)."""

    code = "FIRMWARE_UPDATE_FAILED"
    http_status = 502


@register_error
class FirmwareUpdateNotFound(NotFound):
    code = "FIRMWARE_UPDATE_NOT_FOUND"
    http_status = 404
