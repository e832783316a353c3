"""Firmware updates through a server's BMC (issue 27 item 5).

- ``POST /controlnode/bmc/{ip}/firmware-update`` (fabric_admin): 202 with the update record
  (state ``queued``; ``held`` with ``when: before_next_install``, run by the BMC's next provision
  job before its install); 409 ``FIRMWARE_UPDATE_REFUSED`` while a provision job or another update uses
  the BMC. Progress on SSE as ``firmware_progress`` (channels ``job:<update id>``, ``node:<ip>``).
- ``GET /controlnode/bmc/{ip}/firmware-updates/{update_id}`` (operator): the record, with the
  per-component versions before and after once it has ended.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, Field

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.firmware import (
    ApplyTime,
    FirmwareUpdateQuery,
    FirmwareUpdateView,
    StartFirmwareUpdate,
    UpdateWhen,
)
from karios.common.errors import ValidationFailed
from karios.common.limits import IP_MAX, IP_SCHEMA
from karios.common.netaddr import normalize_ip
from karios.common.telemetry import get_logger

log = get_logger(__name__)

router = APIRouter(prefix="/controlnode/bmc", tags=["hardware"])
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_IMAGE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}){0,7}$")
_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    422: {"description": "A field is invalid (`field` names it)"},
    503: {"description": "Provisioner unavailable, or no answer in time (`details.outcome`)"},
}
BmcIp = Path(description="BMC IP address", max_length=IP_MAX, json_schema_extra=IP_SCHEMA)


class FirmwareUpdateBody(BaseModel):
    image_url: str = Field(
        "", max_length=2048, description="http(s) URL the image is fetched from (or `image`, not both)"
    )
    image: str = Field(
        "",
        max_length=512,
        description="An image already registered: its path under the provisioner's images directory "
        "(served to the BMC at /images/<image>)",
    )
    sha256: str = Field(
        max_length=64, description="SHA-256 of the image (hex); checked before the BMC is given it"
    )
    targets: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Redfish URIs to update (FirmwareInventory members from the hardware record's "
        "`firmware[].uri`, or a System / Manager); empty: the BMC decides from the image",
    )
    apply_time: ApplyTime = Field(
        "immediate",
        description="immediate, or on_reset (staged, applied at the next reset: refused by a BMC that "
        "does not advertise OnReset)",
    )
    timeout_s: int = Field(1800, ge=10, le=14400, description="Seconds the BMC's task may run")
    when: UpdateWhen = Field(
        "now",
        description="now; or before_next_install: held until the BMC's next provision job, which runs it "
        "after its BMC check and before its medium (the same maintenance window) and fails if it fails",
    )


def _ip(bmc_ip: str) -> str:
    try:
        return normalize_ip(bmc_ip)
    except ValueError as exc:
        raise ValidationFailed(f"bmc_ip: {exc}", field="bmc_ip") from None


def _validated(ip: str, body: FirmwareUpdateBody, by: str) -> StartFirmwareUpdate:
    if bool(body.image) == bool(body.image_url):
        raise ValidationFailed("image_url: give exactly one of image_url and image", field="image_url")
    if body.image_url and not re.match(r"^https?://[^/\s]+", body.image_url):
        raise ValidationFailed("image_url: an http:// or https:// URL", field="image_url")
    if body.image_url and "@" in urlsplit(body.image_url).netloc:
        # the URL is stored, shown and announced: a password in it would leak
        raise ValidationFailed(
            "image_url: no credentials in the URL (register the image, or serve it without them)",
            field="image_url",
        )
    if body.image and (not _IMAGE.match(body.image) or ".." in body.image.split("/")):
        raise ValidationFailed("image: a relative path under the images directory", field="image")
    if not _SHA256.match(body.sha256):
        raise ValidationFailed("sha256: 64 hexadecimal digits", field="sha256")
    for target in body.targets:
        if not target.startswith("/redfish/v1/") or any(c.isspace() for c in target) or len(target) > 512:
            raise ValidationFailed(
                f"targets: {target[:80]!r} is not a Redfish URI (/redfish/v1/…)", field="targets"
            )
    return StartFirmwareUpdate(
        bmc_ip=ip,
        image_url=body.image_url,
        image=body.image,
        sha256=body.sha256.lower(),
        targets=body.targets,
        apply_time=body.apply_time,
        timeout_s=body.timeout_s,
        when=body.when,
        requested_by=by,
    )


@router.post(
    "/{bmc_ip}/firmware-update",
    status_code=202,
    response_model=FirmwareUpdateView,
    responses={
        **_ERRORS,
        409: {
            "description": "FIRMWARE_UPDATE_REFUSED: a provision job or another firmware update uses the BMC "
            "(`details.reason`: provision_job | firmware_update)"
        },
    },
    summary="Update firmware through the BMC (SimpleUpdate or a multipart push), followed to the end",
)
async def start_firmware_update(
    request: Request,
    body: FirmwareUpdateBody,
    bmc_ip: str = BmcIp,
    principal: Principal = Depends(require(Role.fabric_admin)),
) -> FirmwareUpdateView:
    rt = request.app.state.runtime
    q = _validated(_ip(bmc_ip), body, principal.name)
    view: FirmwareUpdateView = await rt.bus.request(
        rt.bus.subjects.request("provision", "start_firmware_update"), q, reply=FirmwareUpdateView
    )
    log.info("firmware update started", bmc_ip=q.bmc_ip, update_id=view.id, by=principal.name)
    return view


@router.get(
    "/{bmc_ip}/firmware-updates/{update_id}",
    response_model=FirmwareUpdateView,
    responses={**_ERRORS, 404: {"description": "FIRMWARE_UPDATE_NOT_FOUND"}},
    summary="A firmware update: state, the BMC task's progress and messages, versions before and after",
)
async def firmware_update(
    request: Request,
    bmc_ip: str = BmcIp,
    update_id: str = Path(max_length=64, description="The update's id (from the POST)"),
    _p: Principal = Depends(require(Role.operator)),
) -> FirmwareUpdateView:
    rt = request.app.state.runtime
    return await rt.bus.request(  # type: ignore[no-any-return]
        rt.bus.subjects.query("provision", "firmware_update"),
        FirmwareUpdateQuery(update_id=update_id, bmc_ip=_ip(bmc_ip)),
        reply=FirmwareUpdateView,
    )
