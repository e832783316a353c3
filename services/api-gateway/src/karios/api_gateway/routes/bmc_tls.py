"""``/controlnode/bmc-tls`` — the BMC certificates pinned on first contact (owned by the provisioner).

An operator sees each BMC's pinned SHA-256 fingerprint and clears one whose certificate was
replaced on purpose (the next provision pins the new one), like removing an SSH known_hosts line.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.bmc_tls import ClearTlsPin, TlsPinCleared, TlsPinList, TlsPinsQuery
from karios.common.errors import ValidationFailed
from karios.common.limits import IP_MAX, IP_SCHEMA
from karios.common.netaddr import normalize_ip
from karios.common.telemetry import get_logger

log = get_logger(__name__)

router = APIRouter(prefix="/controlnode/bmc-tls", tags=["provision"])

_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    422: {"description": "bmc_ip is not an IP address (`field` names it)"},
    503: {"description": "Provisioner unavailable"},
}


def _ip(bmc_ip: str) -> str:
    try:
        return normalize_ip(bmc_ip)
    except ValueError as exc:
        raise ValidationFailed(f"bmc_ip: {exc}", field="bmc_ip") from None


@router.get(
    "",
    response_model=TlsPinList,
    responses=_ERRORS,
    summary="BMC TLS certificates pinned on first contact (trust on first use)",
)
async def list_pins(
    request: Request,
    bmc_ip: str | None = Query(
        None, description="Only this BMC's pin", max_length=IP_MAX, json_schema_extra=IP_SCHEMA
    ),
    _p: Principal = Depends(require(Role.operator)),
) -> TlsPinList:
    rt = request.app.state.runtime
    query = TlsPinsQuery(bmc_ip=_ip(bmc_ip) if bmc_ip else None)
    return await rt.bus.request(rt.bus.subjects.query("provision", "tls_pins"), query, reply=TlsPinList)  # type: ignore[no-any-return]


@router.delete(
    "/{bmc_ip}",
    response_model=TlsPinCleared,
    responses={**_ERRORS, 404: {"description": "No pin for this BMC (`field` names bmc_ip)"}},
    summary="Forget a BMC's pinned certificate (its next contact pins the one it presents then)",
)
async def clear_pin(
    request: Request,
    bmc_ip: str = Path(description="BMC IP address", max_length=IP_MAX, json_schema_extra=IP_SCHEMA),
    principal: Principal = Depends(require(Role.fabric_admin)),
) -> TlsPinCleared:
    rt = request.app.state.runtime
    cleared: TlsPinCleared = await rt.bus.request(
        rt.bus.subjects.request("provision", "clear_tls_pin"),
        ClearTlsPin(bmc_ip=_ip(bmc_ip)),
        reply=TlsPinCleared,
    )
    log.info("BMC TLS pin cleared", bmc_ip=cleared.bmc_ip, sha256=cleared.fingerprint, by=principal.name)
    return cleared
