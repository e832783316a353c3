"""``GET /controlnode/bmc/{bmc_ip}/disks`` and ``/gpus`` — hardware a UI chooses from (owned by inventory)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, Field

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.inventory import BmcHardware, BmcHardwareQuery, Disk, Gpu, Nic
from karios.common.errors import ValidationFailed
from karios.common.limits import IP_MAX, IP_SCHEMA
from karios.common.netaddr import normalize_ip

router = APIRouter(prefix="/controlnode", tags=["inventory"])

_RESPONSES = {
    404: {"description": "No device has this BMC (out-of-band) IP"},
    422: {"description": "bmc_ip is not an IP address"},
    502: {"description": "NetBox is down or answered an error"},
    503: {"description": "Inventory service unavailable"},
}


class BmcDisksResponse(BaseModel):
    bmc_ip: str
    device_id: int | None = None
    device_name: str = Field(description="NetBox device name")
    disks: list[Disk] = Field(description="Disks (inventory items with the disk role, or disk modules)")
    nics: list[Nic] = Field(description="Interfaces with their MACs; `is_bmc` marks the BMC's NIC")


class BmcGpusResponse(BaseModel):
    bmc_ip: str
    device_id: int | None = None
    device_name: str
    gpus: list[Gpu]


async def _hardware(request: Request, bmc_ip: str) -> BmcHardware:
    try:
        bmc_ip = normalize_ip(bmc_ip)
    except ValueError as exc:
        raise ValidationFailed(f"bmc_ip: {exc}", field="bmc_ip") from None
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.query("inventory", "bmc_hardware"), BmcHardwareQuery(bmc_ip=bmc_ip), reply=BmcHardware
    )


@router.get(
    "/bmc/{bmc_ip}/disks",
    response_model=BmcDisksResponse,
    summary="Get available disks and NICs for a BMC",
    description="Fetch disk and NIC information from the inventory (NetBox) for UI selection.",
    responses=_RESPONSES,
)
async def bmc_disks(
    request: Request,
    bmc_ip: str = Path(description="BMC IP address", max_length=IP_MAX, json_schema_extra=IP_SCHEMA),
    _p: Principal = Depends(require(Role.viewer)),
) -> BmcDisksResponse:
    hw = await _hardware(request, bmc_ip)
    return BmcDisksResponse(
        bmc_ip=hw.bmc_ip, device_id=hw.device_id, device_name=hw.device_name, disks=hw.disks, nics=hw.nics
    )


@router.get(
    "/bmc/{bmc_ip}/gpus",
    response_model=BmcGpusResponse,
    summary="Get available GPUs for a BMC",
    description="Fetch GPU inventory information from the inventory (NetBox) for UI selection.",
    responses=_RESPONSES,
)
async def bmc_gpus(
    request: Request,
    bmc_ip: str = Path(description="BMC IP address", max_length=IP_MAX, json_schema_extra=IP_SCHEMA),
    _p: Principal = Depends(require(Role.viewer)),
) -> BmcGpusResponse:
    hw = await _hardware(request, bmc_ip)
    return BmcGpusResponse(bmc_ip=hw.bmc_ip, device_id=hw.device_id, device_name=hw.device_name, gpus=hw.gpus)
