"""Thin handlers of bootapi: each HTTP route is one call into the app's
:class:`~karios.bootapi.server.BootServer` (or its template store / metrics); the bus handler
drops the host cache when the inventory reports a device change."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from karios.bootapi.hosts import CachedHostSource
from karios.bootapi.server import BootServer
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import DeviceChanged
from karios.common.instance import INSTANCE_HEADER, instance_id
from karios.common.telemetry import get_logger

TEXT = "text/plain; charset=utf-8"
log = get_logger(__name__)

router = APIRouter()

_IPXE_DOC = {200: {"content": {"text/plain": {}}, "description": "An iPXE script (installer or fallback)."}}
_TEXT_DOC = {
    200: {"content": {"text/plain": {}}, "description": "Rendered kickstart or preseed."},
    404: {"description": "Unknown host (or no catalog entry for it)."},
    502: {"description": "The inventory failed."},
}


def wire(bus: Bus, hosts: CachedHostSource) -> None:
    async def on_device_changed(event: DeviceChanged) -> None:
        # An event naming no device (config context, module type, …) drops every entry.
        dropped = hosts.invalidate_event(event)
        log.debug("host cache invalidated", device=event.name, dropped=dropped)

    # Every replica (no queue group) drops its own cache entries.
    bus.broadcast_handler(
        bus.subjects.events_of_fact("inventory", "device.changed"), DeviceChanged, on_device_changed
    )


def _server(request: Request) -> BootServer:
    return request.app.state.server  # type: ignore[no-any-return]


@router.get("/ipxe/{mac}", response_class=PlainTextResponse, responses=_IPXE_DOC, tags=["boot"])
async def ipxe(
    request: Request,
    mac: str = PathParam(
        description="MAC with `:`/`-`/`.` separators or bare hex; a trailing `.ipxe` is stripped."
    ),
) -> PlainTextResponse:
    """iPXE boot script for the host owning ``mac``; never 404 (fallback script instead)."""
    return PlainTextResponse(await _server(request).ipxe_script(mac), media_type=TEXT)


@router.get("/boot/ipxe", response_class=PlainTextResponse, responses=_IPXE_DOC, tags=["boot"])
async def boot_ipxe(
    request: Request,
    mac: str | None = Query(None, description="MAC in any notation."),
) -> PlainTextResponse:
    """Query-string alias of ``/ipxe/{mac}``."""
    return PlainTextResponse(await _server(request).ipxe_script(mac), media_type=TEXT)


@router.get("/ks/{ident}", response_class=PlainTextResponse, responses=_TEXT_DOC, tags=["boot"])
async def install_config(
    request: Request,
    ident: str = PathParam(description="MAC (auto-detected) or hostname; `.ks`/`.cfg` stripped."),
) -> PlainTextResponse:
    """Rendered kickstart (RHEL family) or preseed (Debian) for the host."""
    return PlainTextResponse(await _server(request).install_config(ident), media_type=TEXT)


@router.post(
    "/provisioned/{ident}",
    status_code=204,
    tags=["boot"],
    responses={
        204: {"description": "pxe_enabled cleared."},
        401: {"description": "Missing or wrong token."},
        404: {"description": "Unknown host."},
        503: {"description": "No provision token configured."},
        502: {"description": "The inventory write failed."},
    },
)
async def provisioned(request: Request, ident: str = PathParam(description="MAC or hostname.")) -> Response:
    """End-of-install callback: turns the host's PXE gate off.

    Token: ``Authorization: Bearer <token>`` or a bare ``token`` header.
    """
    await _server(request).provisioned(ident, request.headers)
    return Response(status_code=204)


@router.get("/healthz", response_class=PlainTextResponse, tags=["ops"])
async def healthz() -> PlainTextResponse:
    """Liveness: always ``200 ok``."""
    return PlainTextResponse("ok\n", media_type=TEXT)


@router.get(
    "/readyz",
    response_class=PlainTextResponse,
    tags=["ops"],
    responses={503: {"description": "No template set parsed yet."}},
)
async def readyz(request: Request) -> PlainTextResponse:
    """Readiness: 200 once a template set is parsed. Does not probe the inventory or NetBox."""
    store = request.app.state.store
    who = {INSTANCE_HEADER: instance_id()}  # which process answered (karios up checks it)
    if not store.ready:
        return PlainTextResponse("templates not loaded\n", status_code=503, media_type=TEXT, headers=who)
    return PlainTextResponse(f"ok generation={store.generation}\n", media_type=TEXT, headers=who)


@router.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
async def metrics_endpoint(request: Request) -> Response:
    """Prometheus metrics (``bootapi_*``)."""
    _server(request).metrics.set_ready(request.app.state.store.ready)
    return Response(generate_latest(_server(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)
