"""Thin handlers of the inventory: each bus handler takes its typed contract and is one call
into :class:`~karios.inventory.service.InventoryService`; the NetBox webhook route checks the
signature and the body, then hands the change to the service."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import (
    AllocateIp,
    BmcAccessQuery,
    BmcHardwareQuery,
    DeviceChanged,
    HostQuery,
    NodeAccessQuery,
    NodeQuery,
    RegisterNode,
    SetPxeEnabled,
)
from karios.common.contracts.netbox_writeback import WriteBackDevice
from karios.common.contracts.nodes import (
    AdoptNode,
    ComputeNodeQuery,
    ComputeNodesQuery,
    RegisterComputeNode,
    RemoveComputeNode,
)
from karios.common.errors import Forbidden, Unauthorized, ValidationFailed
from karios.inventory import webhook
from karios.inventory.service import InventoryService
from karios.inventory.writeback_service import WriteBack


def wire(bus: Bus, svc: InventoryService, writeback: WriteBack | None = None) -> None:
    sub = bus.subjects
    routes: list[tuple[str, type, Callable[..., Awaitable[Any]]]] = [
        (sub.request("inventory", "register_node"), RegisterNode, svc.register_node),
        (sub.query("inventory", "node"), NodeQuery, svc.get_node),
        (sub.query("inventory", "nodes"), NodeQuery, svc.list_nodes),
        (sub.query("inventory", "node_access"), NodeAccessQuery, svc.node_access),
        (sub.query("inventory", "bmc_access"), BmcAccessQuery, svc.bmc_access),
        (sub.query("inventory", "host"), HostQuery, svc.host),
        (sub.request("inventory", "set_pxe_enabled"), SetPxeEnabled, svc.set_pxe_enabled),
        (sub.query("inventory", "bmc_hardware"), BmcHardwareQuery, svc.bmc_hardware),
        (sub.request("inventory", "allocate_ip"), AllocateIp, svc.allocate_ip),
        (sub.request("inventory", "adopt_node"), AdoptNode, svc.adopt_node),
        (sub.request("inventory", "register_compute_node"), RegisterComputeNode, svc.register_compute_node),
        (sub.request("inventory", "remove_compute_node"), RemoveComputeNode, svc.remove_compute_node),
        (sub.query("inventory", "compute_nodes"), ComputeNodesQuery, svc.compute_nodes),
        (sub.query("inventory", "compute_node"), ComputeNodeQuery, svc.compute_node),
    ]
    for subject, model, handler in routes:
        bus.query_responder(subject, model, handler)
    if writeback is not None:  # answers `written: false` (and why) with the write-back off
        bus.query_responder(
            sub.request("inventory", "write_back_device"), WriteBackDevice, writeback.write_back_device
        )
    # Every replica (no queue group) drops its cache entries when any device changes.
    bus.broadcast_handler(
        sub.events_of_fact("inventory", "device.changed"), DeviceChanged, svc.on_device_changed
    )


def _signed_payload(body: bytes, signature: str | None, secret: str) -> dict[str, Any]:
    """The webhook body as a JSON object, once its HMAC signature is checked."""
    if not secret:
        raise Forbidden(
            "webhook receiver disabled: set KARIOS_INVENTORY_WEBHOOK_SECRET and the same secret "
            "on the NetBox webhook"
        )
    if not webhook.signature_valid(body, signature, secret):
        raise Unauthorized(f"{webhook.SIGNATURE_HEADER} missing or not the HMAC-SHA512 of the body")
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except ValueError:
        raise ValidationFailed("body: not a JSON object", field="body") from None
    return payload


def webhook_router(svc: InventoryService, webhook_secret: SecretStr | None) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/inventory/netbox-webhook",
        status_code=202,
        summary="NetBox webhook receiver: invalidates caches of the changed device",
        responses={
            401: {"description": "Missing or wrong X-Hook-Signature"},
            403: {"description": "No secret set"},
        },
    )
    async def netbox_webhook(request: Request) -> JSONResponse:
        secret = webhook_secret.get_secret_value() if webhook_secret else ""
        body = await request.body()
        payload = _signed_payload(body, request.headers.get(webhook.SIGNATURE_HEADER), secret)
        evt = webhook.device_changed_from_webhook(payload)
        if evt is None:
            return JSONResponse(
                status_code=202,
                content={"accepted": False, "reason": f"{payload.get('object_type')} is not tracked"},
            )
        await svc.device_changed(evt)
        return JSONResponse(
            status_code=202, content={"accepted": True, "device": evt.name or evt.device_id, "macs": evt.macs}
        )

    return router
