"""``POST /controlnode/register`` — put a node in the registry (owned by inventory)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.inventory import RegisterNode, RegisterNodeResult
from karios.common.crypto import SecretBox
from karios.common.errors import ServiceUnavailable
from karios.common.limits import (
    BoundedIP,
    HostName,
    Int32Id,
    LoginName,
    Name,
    OptBoundedIP,
    Secret,
    SshPassword,
    Vendor,
)
from karios.common.netaddr import OptMacStr

router = APIRouter(prefix="/controlnode", tags=["nodes"])


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    bmc_ip: BoundedIP = Field(description="BMC IP address; the registry key (required)")
    bmc_username: Name | None = Field(None, description="BMC user")
    bmc_password: Secret | None = Field(None, description="BMC password (write-only; encrypted at rest)")
    os_hostname: HostName | None = Field(None, description="Hostname, e.g. mgmt-01")
    fqdn: HostName | None = Field(None, description="Fully qualified domain name")
    os_ip: OptBoundedIP = Field(None, description="OS IP address")
    os_username: LoginName | None = Field(None, description="SSH username (default root)")
    os_password: SshPassword | None = Field(
        None, description="SSH password (write-only; encrypted at rest; SASLprep must take it)"
    )
    primary_mac: OptMacStr = Field(None, description="Primary NIC MAC")
    serial_number: Name | None = Field(None, description="Serial number, used as UUID")
    vendor: Vendor | None = Field(None, description="Hardware vendor")
    atlas_device_id: Int32Id | None = Field(None, description="NetBox device id")
    atlas_location_id: Int32Id | None = Field(None, description="NetBox location id")
    atlas_rack_id: Int32Id | None = Field(None, description="NetBox rack id")
    atlas_site_id: Int32Id | None = Field(None, description="NetBox site id")


class RegisterResponse(BaseModel):
    created: bool = Field(
        description="true if a new record was created, false if an existing one was updated"
    )
    hostname: str
    message: str
    node_ip: str
    success: bool


@router.post(
    "/register",
    response_model=RegisterResponse,
    summary="Register the control node (1st node) in bmc_infos",
    responses={
        422: {"description": "Invalid field (named in `field`)"},
        503: {
            "description": "Inventory unavailable (SERVICE_UNAVAILABLE), or its database's disk full "
            "(STORAGE_FULL: nothing was stored; retry after Retry-After once space is freed)"
        },
    },
)
async def register(
    body: RegisterRequest, request: Request, _p: Principal = Depends(require(Role.operator))
) -> RegisterResponse:
    rt = request.app.state.runtime
    box: SecretBox = request.app.state.secret_box
    cmd = RegisterNode(
        **body.model_dump(exclude={"bmc_password", "os_password"}),
        bmc_password_enc=box.encrypt(body.bmc_password, context=f"bmc:{body.bmc_ip}")
        if body.bmc_password
        else None,
        os_password_enc=box.encrypt(body.os_password, context=f"os:{body.bmc_ip}")
        if body.os_password
        else None,
        is_control_node=True,
    )
    try:
        result = await rt.bus.request(
            rt.bus.subjects.request("inventory", "register_node"), cmd, reply=RegisterNodeResult
        )
    except ServiceUnavailable as exc:
        if (exc.details or {}).get("outcome") != "unknown":
            raise  # never reached inventory: nothing was applied
        # Sent, but no answer in time: say so instead of implying nothing happened.
        raise ServiceUnavailable(
            f"inventory did not answer in time; node {body.bmc_ip} may have been registered. "
            "Registering is idempotent (keyed by bmc_ip): retrying is safe",
            details={"outcome": "unknown", "bmc_ip": str(body.bmc_ip)},
        ) from None
    verb = "registered" if result.created else "updated"
    return RegisterResponse(
        created=result.created,
        hostname=result.hostname,
        node_ip=result.node_ip,
        success=True,
        message=f"node {result.bmc_ip} {verb}",
    )
