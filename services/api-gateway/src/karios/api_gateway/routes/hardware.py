"""``/controlnode/bmc/{bmc_ip}/…`` — a server's hardware as its BMC reports it, and its BMC
credentials (issue 27). The provisioner owns the BMC drivers and the hardware records.

- ``POST …/inspect`` (operator): read the hardware now over Redfish; answers the new record. A
  bounded synchronous request, not a job: it only reads, and ends within the provisioner's
  deadline (60 s; the gateway waits 75 s, then 503 with ``details.outcome: unknown``).
- ``GET …/hardware`` (operator): the record of the last inspection (404 ``HARDWARE_NOT_INSPECTED``).
- ``GET …/hardware/diff`` (operator): that record against the inventory's (NetBox or the YAML
  file) record of the same server: serial, disks, NICs/MACs, GPUs only on one side or differing.
- ``POST …/rotate-credentials`` (fabric_admin): a new random BMC password, verified, stored
  encrypted; the old one is put back if a step fails. The password is never in the answer.
"""

from __future__ import annotations

from fastapi import APIRouter, Body, Depends, Path, Request
from pydantic import BaseModel, Field

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.hardware import (
    BmcCredentialsRotation,
    HardwareQuery,
    HardwareRecord,
    InspectHardware,
    RotateBmcCredentials,
)
from karios.common.contracts.inventory import BmcHardware, BmcHardwareQuery
from karios.common.errors import ValidationFailed
from karios.common.hardware_diff import HardwareDiff, hardware_diff
from karios.common.limits import IP_MAX, IP_SCHEMA
from karios.common.netaddr import normalize_ip
from karios.common.telemetry import get_logger

log = get_logger(__name__)

router = APIRouter(prefix="/controlnode/bmc", tags=["hardware"])
INSPECT_WAIT = 75.0  # the provisioner's inspection deadline (60 s) plus margin
ROTATE_WAIT = 90.0  # PATCH, login check, store, and a rollback if one of them fails
VENDORS = ("", "generic", "dell", "hp", "hpe", "lenovo", "supermicro", "cisco")

_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    422: {"description": "bmc_ip is not an IP address, or vendor is unknown (`field` names it)"},
    503: {"description": "Provisioner unavailable, or no answer in time (`details.outcome`)"},
}
BmcIp = Path(description="BMC IP address", max_length=IP_MAX, json_schema_extra=IP_SCHEMA)


class InspectBody(BaseModel):
    vendor: str = Field(
        "",
        max_length=32,
        description="BMC driver (dell, hpe, lenovo, supermicro, cisco, generic); "
        "empty: the registry's vendor, else detected from the BMC's service root",
    )


def _ip(bmc_ip: str) -> str:
    try:
        return normalize_ip(bmc_ip)
    except ValueError as exc:
        raise ValidationFailed(f"bmc_ip: {exc}", field="bmc_ip") from None


@router.post(
    "/{bmc_ip}/inspect",
    response_model=HardwareRecord,
    responses={
        **_ERRORS,
        422: {"description": "bmc_ip / vendor invalid, or the BMC refused the credentials"},
        502: {"description": "The BMC failed or did not finish within the deadline"},
    },
    summary="Inspect a server out of band: read its hardware from the BMC (Redfish) and store it",
)
async def inspect(
    request: Request,
    bmc_ip: str = BmcIp,
    body: InspectBody | None = Body(None),
    principal: Principal = Depends(require(Role.operator)),
) -> HardwareRecord:
    rt = request.app.state.runtime
    vendor = (body.vendor if body else "").strip().lower()
    if vendor not in VENDORS:
        raise ValidationFailed(f"vendor: {vendor!r} is not one of {', '.join(VENDORS[1:])}", field="vendor")
    ip = _ip(bmc_ip)
    rec: HardwareRecord = await rt.bus.request(
        rt.bus.subjects.request("provision", "inspect_hardware"),
        InspectHardware(bmc_ip=ip, vendor=vendor),
        timeout=INSPECT_WAIT,
        reply=HardwareRecord,
    )
    log.info("BMC inspected", bmc_ip=ip, by=principal.name, missing=len(rec.missing))
    return rec


@router.get(
    "/{bmc_ip}/hardware",
    response_model=HardwareRecord,
    responses={**_ERRORS, 404: {"description": "Never inspected: code HARDWARE_NOT_INSPECTED"}},
    summary="The server's hardware record from its last out-of-band inspection",
)
async def hardware(
    request: Request, bmc_ip: str = BmcIp, _p: Principal = Depends(require(Role.operator))
) -> HardwareRecord:
    rt = request.app.state.runtime
    return await rt.bus.request(  # type: ignore[no-any-return]
        rt.bus.subjects.query("provision", "hardware"),
        HardwareQuery(bmc_ip=_ip(bmc_ip)),
        reply=HardwareRecord,
    )


@router.get(
    "/{bmc_ip}/hardware/diff",
    response_model=HardwareDiff,
    responses={
        **_ERRORS,
        404: {
            "description": "Never inspected (code HARDWARE_NOT_INSPECTED), or no inventory device has "
            "this BMC IP"
        },
        502: {"description": "NetBox is down or answered an error"},
    },
    summary="What the BMC reported against the inventory: serial, disks, NICs/MACs, GPUs that differ",
)
async def hardware_diff_route(
    request: Request, bmc_ip: str = BmcIp, _p: Principal = Depends(require(Role.operator))
) -> HardwareDiff:
    rt = request.app.state.runtime
    ip = _ip(bmc_ip)
    rec: HardwareRecord = await rt.bus.request(
        rt.bus.subjects.query("provision", "hardware"), HardwareQuery(bmc_ip=ip), reply=HardwareRecord
    )
    inv: BmcHardware = await rt.bus.request(
        rt.bus.subjects.query("inventory", "bmc_hardware"), BmcHardwareQuery(bmc_ip=ip), reply=BmcHardware
    )
    return hardware_diff(rec, inv)


@router.post(
    "/{bmc_ip}/rotate-credentials",
    response_model=BmcCredentialsRotation,
    responses={
        **_ERRORS,
        404: {"description": "The BMC is not in the registry (register it first)"},
        409: {"description": "BMC_ROTATION_REFUSED: a job uses the BMC, or its credentials are in settings"},
        502: {
            "description": "BMC_ROTATION_FAILED: the new password was refused or did not work "
            "(`details.rolled_back` says whether the old one was put back)"
        },
    },
    summary="Rotate the BMC password: random, set through AccountService, verified, stored encrypted",
)
async def rotate_credentials(
    request: Request, bmc_ip: str = BmcIp, principal: Principal = Depends(require(Role.fabric_admin))
) -> BmcCredentialsRotation:
    rt = request.app.state.runtime
    ip = _ip(bmc_ip)
    done: BmcCredentialsRotation = await rt.bus.request(
        rt.bus.subjects.request("provision", "rotate_bmc_credentials"),
        RotateBmcCredentials(bmc_ip=ip, requested_by=principal.name),
        timeout=ROTATE_WAIT,
        reply=BmcCredentialsRotation,
    )
    log.info("BMC credentials rotated", bmc_ip=ip, username=done.username, by=principal.name)
    return done
