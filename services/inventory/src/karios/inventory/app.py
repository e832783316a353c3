"""Inventory service: the node registry, host/hardware lookups (NetBox or YAML), NetBox webhooks."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from karios.common.cache import SingleFlightCache
from karios.common.contracts.inventory import (
    AllocateIp,
    BmcAccess,
    BmcAccessQuery,
    BmcHardware,
    BmcHardwareQuery,
    DeviceChanged,
    Host,
    HostQuery,
    IpAllocation,
    NodeAccess,
    NodeAccessQuery,
    NodeQuery,
    NodeRegistered,
    NodeSummary,
    RegisterNode,
    RegisterNodeResult,
    SetPxeEnabled,
)
from karios.common.errors import Forbidden, NotFound, Unauthorized, ValidationFailed
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.common.telemetry import get_logger
from karios.inventory import registry, webhook
from karios.inventory.file_store import FileStore, StaticPool
from karios.inventory.lookups import Inventory, InventoryMetrics
from karios.inventory.mapping import HardwareRules
from karios.inventory.models import SCHEMA
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.settings import InventorySettings
from karios.inventory.store import InventoryStore, parse_ident

SERVICE = "inventory"
log = get_logger(__name__)


def build_store(settings: KariosSettings, inv: InventorySettings) -> InventoryStore:
    """NetBox when ``KARIOS_NETBOX_URL`` is set, else the YAML file (or the packaged demo data)."""
    if settings.netbox_url:
        token = settings.netbox_token.get_secret_value() if settings.netbox_token else None
        return NetBoxStore(
            settings.netbox_url,
            token,
            rules=HardwareRules(inv.disk_role, inv.gpu_role, inv.disk_module_profile, inv.gpu_module_profile),
            pxe_field=inv.pxe_field,
            timeout=inv.netbox_timeout,
            static_pool=inv.static_pool,
        )
    pool = (
        StaticPool(cidr=inv.static_pool, start=inv.static_pool_start, gateway=inv.static_gateway)
        if inv.static_pool
        else None
    )
    return FileStore.from_path(settings.inventory_file, pool=pool)


def create_app(
    settings: KariosSettings | None = None,
    *,
    inventory_settings: InventorySettings | None = None,
    store: InventoryStore | None = None,
) -> FastAPI:
    settings = settings or KariosSettings()
    inv_settings = inventory_settings or InventorySettings()
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    subjects = rt.bus.subjects
    store = store or build_store(settings, inv_settings)
    inventory = Inventory(
        store=store,
        cache=SingleFlightCache(
            ttl=inv_settings.cache_ttl,
            negative_ttl=inv_settings.negative_ttl,
            max_size=inv_settings.cache_size,
        ),
        metrics=InventoryMetrics(rt.registry),
    )
    if store.kind == "netbox":
        rt.extra_checks["netbox"] = inventory.ready

    # -- node registry ----------------------------------------------------------------------
    async def register_node(cmd: RegisterNode) -> RegisterNodeResult:
        assert rt.db is not None
        async with rt.db.session() as session, session.begin():
            result = await registry.upsert_node(session, cmd)
        await rt.bus.publish_event(
            NodeRegistered(
                bmc_ip=result.bmc_ip,
                created=result.created,
                hostname=result.hostname,
                node_ip=result.node_ip,
                vendor=cmd.vendor or "",
                is_control_node=cmd.is_control_node,
            ),
            subjects.evt("inventory", "node.registered", result.bmc_ip),
            entity=result.bmc_ip,
        )
        return result

    async def get_node(q: NodeQuery) -> NodeSummary:
        assert rt.db is not None
        async with rt.db.session() as session:
            row = await registry.get_node(session, bmc_ip=q.bmc_ip, node_ip=q.node_ip)
        if row is None:
            raise NotFound(
                f"no registered node with BMC IP {q.bmc_ip}" if q.bmc_ip else f"no node with IP {q.node_ip}"
            )
        return registry.summarize(row)

    async def list_nodes(_q: NodeQuery) -> list[NodeSummary]:
        assert rt.db is not None
        async with rt.db.session() as session:
            return [registry.summarize(r) for r in await registry.list_nodes(session)]

    async def node_access(q: NodeAccessQuery) -> list[NodeAccess]:
        assert rt.db is not None
        async with rt.db.session() as session:
            if q.bmc_ip or q.node_ip:
                row = await registry.get_node(session, bmc_ip=q.bmc_ip, node_ip=q.node_ip)
                if row is None:
                    what = f"BMC IP {q.bmc_ip}" if q.bmc_ip else f"IP {q.node_ip}"
                    raise NotFound(f"no registered node with {what}")
                rows = [row]
            else:
                rows = await registry.list_nodes(session)
        out = [a for a in (registry.node_access(r) for r in rows) if a is not None]
        return [a for a in out if not (q.compute_only and a.is_control_node)]

    async def bmc_access(q: BmcAccessQuery) -> BmcAccess:
        assert rt.db is not None
        async with rt.db.session() as session:
            row = await registry.get_node(session, bmc_ip=q.bmc_ip)
        if row is None:
            raise NotFound(f"no registered node with BMC IP {q.bmc_ip}", field="bmc_ip")
        return registry.bmc_access(row)

    # -- inventory lookups --------------------------------------------------------------------
    async def host_query(q: HostQuery) -> Host:
        return await inventory.host(parse_ident(mac=q.mac, name=q.name))

    async def set_pxe_enabled(q: SetPxeEnabled) -> Host:
        host = await inventory.set_pxe_enabled(parse_ident(ident=q.ident), q.enabled)
        await publish_change(_change_of(host))
        return host

    async def bmc_hardware(q: BmcHardwareQuery) -> BmcHardware:
        return await inventory.bmc_hardware(q.bmc_ip)

    async def allocate_ip(q: AllocateIp) -> IpAllocation:
        got = await store.allocate_ip(q.name, prefix_id=q.prefix_id)
        if got is None:
            raise NotFound(f"no device named {q.name} in the inventory ({store.kind})", field="name")
        return got

    async def publish_change(evt: DeviceChanged) -> None:
        entity = evt.name or (str(evt.device_id) if evt.device_id is not None else "unknown")
        await rt.bus.publish_event(evt, subjects.evt("inventory", "device.changed", entity), entity=entity)

    rt.bus.query_responder(subjects.request("inventory", "register_node"), RegisterNode, register_node)
    rt.bus.query_responder(subjects.query("inventory", "node"), NodeQuery, get_node)
    rt.bus.query_responder(subjects.query("inventory", "nodes"), NodeQuery, list_nodes)
    rt.bus.query_responder(subjects.query("inventory", "node_access"), NodeAccessQuery, node_access)
    rt.bus.query_responder(subjects.query("inventory", "bmc_access"), BmcAccessQuery, bmc_access)
    rt.bus.query_responder(subjects.query("inventory", "host"), HostQuery, host_query)
    rt.bus.query_responder(subjects.request("inventory", "set_pxe_enabled"), SetPxeEnabled, set_pxe_enabled)
    rt.bus.query_responder(subjects.query("inventory", "bmc_hardware"), BmcHardwareQuery, bmc_hardware)
    rt.bus.query_responder(subjects.request("inventory", "allocate_ip"), AllocateIp, allocate_ip)

    # Every replica (no queue group) drops its cache entries when any device changes.
    async def on_device_changed(evt: DeviceChanged) -> None:
        inventory.apply_change(evt)

    rt.bus.broadcast_handler(
        subjects.events_of_fact("inventory", "device.changed"), DeviceChanged, on_device_changed
    )

    async def on_stop(_rt: ServiceRuntime) -> None:
        await store.close()

    app = build_app(rt, title="Karios inventory", on_stop=on_stop)
    app.state.inventory = inventory

    @app.post(
        "/inventory/netbox-webhook",
        status_code=202,
        summary="NetBox webhook receiver: invalidates caches of the changed device",
        responses={
            401: {"description": "Missing or wrong X-Hook-Signature"},
            403: {"description": "No secret set"},
        },
    )
    async def netbox_webhook(request: Request) -> JSONResponse:
        secret = inv_settings.webhook_secret.get_secret_value() if inv_settings.webhook_secret else ""
        if not secret:
            raise Forbidden(
                "webhook receiver disabled: set KARIOS_INVENTORY_WEBHOOK_SECRET and the same secret "
                "on the NetBox webhook"
            )
        body = await request.body()
        if not webhook.signature_valid(body, request.headers.get(webhook.SIGNATURE_HEADER), secret):
            raise Unauthorized(f"{webhook.SIGNATURE_HEADER} missing or not the HMAC-SHA512 of the body")
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            raise ValidationFailed("body: not a JSON object", field="body") from None
        evt = webhook.device_changed_from_webhook(payload)
        if evt is None:
            return JSONResponse(
                status_code=202,
                content={"accepted": False, "reason": f"{payload.get('object_type')} is not tracked"},
            )
        inventory.apply_change(evt)
        await publish_change(evt)
        return JSONResponse(
            status_code=202, content={"accepted": True, "device": evt.name or evt.device_id, "macs": evt.macs}
        )

    return app


def _change_of(host: Host) -> DeviceChanged:
    return DeviceChanged(device_id=host.id, name=host.name, macs=[m for i in host.interfaces for m in i.macs])


__all__ = ["build_store", "create_app"]
