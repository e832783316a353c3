"""Inventory service: the node registry, host/hardware lookups (NetBox or YAML), NetBox webhooks."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from karios.common.cache import SingleFlightCache
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.inventory.changelog import ChangeLogFollower, ChangeLogMetrics, PgLeaderLock
from karios.inventory.file_store import FileStore, StaticPool
from karios.inventory.handlers import webhook_router, wire
from karios.inventory.lookups import Inventory, InventoryMetrics
from karios.inventory.mapping import HardwareRules
from karios.inventory.models import SCHEMA
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.service import InventoryService
from karios.inventory.settings import InventorySettings
from karios.inventory.store import InventoryStore
from karios.inventory.writeback_service import WriteBack, WriteBackMetrics

SERVICE = "inventory"


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
    svc = InventoryService(rt.bus, rt.db, inventory, store)
    writeback = WriteBack(
        rt.bus, rt.db, store, inv_settings, WriteBackMetrics(rt.registry), on_change=svc.device_changed
    )
    wire(rt.bus, svc, writeback)
    follower: ChangeLogFollower | None = None
    if isinstance(store, NetBoxStore) and inv_settings.changelog_interval > 0:
        follower = ChangeLogFollower(
            store,
            svc.device_changed,
            interval=inv_settings.changelog_interval,
            lock=PgLeaderLock(rt.db) if rt.db is not None else None,
            metrics=ChangeLogMetrics(rt.registry),
        )

    async def on_start(_rt: ServiceRuntime) -> None:
        if follower is not None:
            follower.start()
        await writeback.start()

    async def on_stop(_rt: ServiceRuntime) -> None:
        if follower is not None:
            await follower.stop()
        await store.close()

    app = build_app(rt, title="Karios inventory", on_start=on_start, on_stop=on_stop)
    app.state.changelog = follower
    app.state.inventory = inventory
    app.state.writeback = writeback
    app.include_router(webhook_router(svc, inv_settings.webhook_secret))
    return app


__all__ = ["build_store", "create_app"]
