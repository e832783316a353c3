"""Discovery of unknown servers (issue 27 item 3): the live environment's report and the
operator's list and adoption. The provisioner keeps the records (``inspect/discovery*.py``).

- ``POST /controlnode/discovery/report`` (the discovery token of the boot, no operator token): a
  machine no host owned PXE-booted the live environment in discovery mode; its in-band hardware.
  The token (``X-Karios-Discovery-Token``) is checked first (401), then the report (422 naming the
  field); one record per machine (same boot MAC or serial: the same record, ``created`` false).
- ``GET /controlnode/discovered`` (operator): the discovered servers, newest report first, one
  page (``offset``, ``limit``: 100 by default, at most 1,000 — each record is ~2 KB).
- ``GET /controlnode/discovered/{id}`` (operator): one.
- ``POST /controlnode/discovered/{id}/adopt`` (operator): mark it adopted; with the inventory's
  NetBox write-back on the device is created (status ``planned``, ``netbox_written`` true and its
  id), else the answer is the NetBox device to create and the steps left. Adopting it again answers
  the same.
"""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from pydantic import BaseModel, Field, TypeAdapter

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readcache import discovered_key, read_cache
from karios.common.contracts.discovery import (
    AdoptDiscovered,
    Adoption,
    DiscoveredList,
    DiscoveredQuery,
    DiscoveredServer,
    DiscoveryRecorded,
    DiscoveryReport,
    RecordDiscovery,
)
from karios.common.discovery_token import TOKEN_MAX, DiscoveryTokens
from karios.common.errors import ValidationFailed
from karios.common.http import ErrorResponse
from karios.common.telemetry import get_logger

log = get_logger(__name__)

router = APIRouter(prefix="/controlnode", tags=["discovery"])
_ID = Path(description="The discovered server's id", max_length=64, pattern=r"^[A-Za-z0-9-]{1,64}$")
_ERRORS = {
    401: {"model": ErrorResponse, "description": "Missing or invalid token"},
    403: {"model": ErrorResponse, "description": "Role too low"},
    503: {"model": ErrorResponse, "description": "Provisioner unavailable"},
}
#: The provisioner marks it adopted and the inventory writes the NetBox device (with its write-back
#: on: a dozen NetBox calls, the provisioner gives it 20 s).
ADOPT_WAIT = 30.0
_SERVERS = TypeAdapter(list[DiscoveredServer])
_NOT_FOUND = {404: {"model": ErrorResponse, "description": "DISCOVERED_SERVER_NOT_FOUND"}}


def _tokens(request: Request) -> DiscoveryTokens:
    tokens = getattr(request.app.state, "discovery_tokens", None)
    if tokens is None:  # derived once per process from the key ring
        tokens = request.app.state.discovery_tokens = DiscoveryTokens.from_box(request.app.state.secret_box)
    return tokens


def discovery_token(
    request: Request,
    x_karios_discovery_token: str | None = Header(
        None, max_length=TOKEN_MAX, description="The discovery token on the boot's kernel line"
    ),
) -> str:
    """The MAC the discovery token was issued for; 401 before the body is looked at."""
    return _tokens(request).verify(x_karios_discovery_token, now=time.time())


@router.post(
    "/discovery/report",
    response_model=DiscoveryRecorded,
    responses={
        401: {
            "model": ErrorResponse,
            "description": "DISCOVERY_TOKEN_INVALID (none, or not Karios') / DISCOVERY_TOKEN_EXPIRED",
        },
        422: {
            "model": ErrorResponse,
            "description": "A field of the report is invalid (named in `field`), or the boot MAC is "
            "not among its NICs",
        },
        503: _ERRORS[503],
    },
    summary="Hardware report of an unknown machine booted in discovery mode (discovery token)",
)
async def report(
    request: Request,
    body: DiscoveryReport,
    boot_mac: str = Depends(discovery_token),
) -> DiscoveryRecorded:
    if body.boot_mac is not None and body.boot_mac != boot_mac:
        raise ValidationFailed(
            f"boot_mac: {body.boot_mac} is not the MAC this boot's discovery token was issued for",
            field="boot_mac",
        )
    if body.nics and boot_mac not in {n.mac for n in body.nics}:
        raise ValidationFailed(f"nics: the boot MAC {boot_mac} is not among the reported NICs", field="nics")
    rt = request.app.state.runtime
    source = request.client.host if request.client else ""
    recorded: DiscoveryRecorded = await rt.bus.request(
        rt.bus.subjects.request("provision", "record_discovery"),
        RecordDiscovery(boot_mac=boot_mac, report=body, source_ip=source[:64]),
        reply=DiscoveryRecorded,
    )
    return recorded


@router.get(
    "/discovered",
    response_model=list[DiscoveredServer],
    responses=_ERRORS,
    summary="Servers that PXE-booted unknown and reported their hardware (discovery mode)",
    description="Newest report first, one page: `limit` servers (100 unless given, at most 1,000) "
    "after skipping `offset`; a page shorter than `limit` is the last.",
)
async def discovered(
    request: Request,
    status: Literal["", "discovered", "adopted"] = Query("", description="Only these ('' all)"),
    offset: int = Query(0, ge=0, le=2_147_483_647, description="Items to skip"),
    limit: int = Query(100, ge=1, le=1000, description="Page size"),
    _p: Principal = Depends(require(Role.operator)),
) -> Response:
    bus = request.app.state.runtime.bus

    async def load() -> bytes:
        found: DiscoveredList = await bus.request(
            bus.subjects.query("provision", "discovered"),
            DiscoveredQuery(status=status, offset=offset, limit=limit),
            reply=DiscoveredList,
        )
        return _SERVERS.dump_json(found.servers)

    # Shared for READ_TTL_S (api_gateway.readcache); every provision-channel event drops it.
    return await read_cache(request.app).response(discovered_key(status, offset, limit), load, request)


@router.get(
    "/discovered/{id}",
    response_model=DiscoveredServer,
    responses={**_ERRORS, **_NOT_FOUND},
    summary="One discovered server",
)
async def discovered_one(
    request: Request, id: str = _ID, _p: Principal = Depends(require(Role.operator))
) -> DiscoveredServer:
    rt = request.app.state.runtime
    found: DiscoveredList = await rt.bus.request(
        rt.bus.subjects.query("provision", "discovered"), DiscoveredQuery(id=id), reply=DiscoveredList
    )
    return found.servers[0]


class AdoptBody(BaseModel):
    hostname: str = Field(
        "",
        max_length=253,
        description="The device name it gets in the inventory ('' srv-<serial>, else srv-<boot MAC>)",
    )


@router.post(
    "/discovered/{id}/adopt",
    response_model=Adoption,
    responses={**_ERRORS, **_NOT_FOUND, 422: {"model": ErrorResponse, "description": "hostname invalid"}},
    summary="Adopt a discovered server: marked adopted; answers the NetBox device (planned) to add",
)
async def adopt(
    request: Request,
    id: str = _ID,
    body: AdoptBody | None = Body(None),
    principal: Principal = Depends(require(Role.operator)),
) -> Adoption:
    rt = request.app.state.runtime
    hostname = (body.hostname if body else "").strip().lower()
    try:
        query = AdoptDiscovered(id=id, hostname=hostname, requested_by=principal.name[:64])
    except ValueError:
        raise ValidationFailed(f"hostname: {hostname!r} is not a valid host name", field="hostname") from None
    done: Adoption = await rt.bus.request(
        rt.bus.subjects.request("provision", "adopt_discovered"), query, timeout=ADOPT_WAIT, reply=Adoption
    )
    log.info("discovered server adopted", id=id, hostname=done.server.hostname, by=principal.name)
    return done
