"""Host and hardware lookups in front of a store: cache, metrics, and invalidation.

What bootapi, the provisioner and the gateway get over the bus goes through here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from karios.common.cache import SingleFlightCache
from karios.common.contracts.inventory import BmcHardware, DeviceChanged, Host
from karios.common.errors import KariosError, NotFound
from karios.inventory.store import Ident, InventoryStore


def _device_tags(name: str, device_id: int | None, macs: list[str]) -> list[str]:
    """Cache tags of one device: a change event naming any of them drops the entry."""
    tags = [f"name:{name}"]
    if device_id is not None:
        tags.append(f"id:{device_id}")
    return tags + [f"mac:{m}" for m in macs]


def host_tags(host: Host) -> list[str]:
    return _device_tags(host.name, host.id, [m for i in host.interfaces for m in i.macs])


def hardware_tags(hw: BmcHardware) -> list[str]:
    return _device_tags(hw.device_name, hw.device_id, [m for n in hw.nics for m in n.macs])


def change_tags(evt: DeviceChanged) -> list[str]:
    tags = [f"mac:{m}" for m in evt.macs]
    if evt.device_id is not None:
        tags.append(f"id:{evt.device_id}")
    if evt.name:
        tags.append(f"name:{evt.name}")
    return tags


@dataclass
class InventoryMetrics:
    registry: CollectorRegistry
    lookups: Counter = field(init=False)
    duration: Histogram = field(init=False)
    hits: Counter = field(init=False)
    misses: Counter = field(init=False)
    invalidations: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.lookups = Counter(
            "karios_inventory_lookups",
            "Inventory lookups by field and result (ok|notfound|error)",
            ["field", "result"],
            registry=r,
        )
        self.duration = Histogram(
            "karios_inventory_lookup_duration_seconds",
            "Inventory lookup duration (cache included)",
            ["field"],
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.hits = Counter(
            "karios_inventory_cache_hits", "Lookups answered from the cache", ["field"], registry=r
        )
        self.misses = Counter(
            "karios_inventory_cache_misses", "Lookups that went to the store", ["field"], registry=r
        )
        self.invalidations = Counter(
            "karios_inventory_cache_invalidations", "Device changes applied to the cache", registry=r
        )


@dataclass
class Inventory:
    store: InventoryStore
    cache: SingleFlightCache[Any]
    metrics: InventoryMetrics

    async def _lookup(self, field_name: str, key: str, load: Any, tags: Any) -> Any:
        start = time.perf_counter()
        result = "error"
        try:
            got = await self.cache.get_or_load(key, load, tags)
            (self.metrics.hits if got.hit else self.metrics.misses).labels(field_name).inc()
            result = "ok" if got.value is not None else "notfound"
            return got.value
        finally:
            self.metrics.lookups.labels(field_name, result).inc()
            self.metrics.duration.labels(field_name).observe(time.perf_counter() - start)

    async def host(self, ident: Ident) -> Host:
        if ident.field == "mac":
            load = lambda: self.store.host_by_mac(ident.value)  # noqa: E731
        else:
            load = lambda: self.store.host_by_name(ident.value)  # noqa: E731
        host = await self._lookup(ident.field, ident.key, load, host_tags)
        if host is None:
            what = "interface with MAC" if ident.field == "mac" else "device named"
            raise NotFound(f"no {what} {ident.value} in the inventory ({self.store.kind})", field=ident.field)
        return host  # type: ignore[no-any-return]

    async def bmc_hardware(self, bmc_ip: str) -> BmcHardware:
        hw = await self._lookup(
            "bmc_ip", f"bmc:{bmc_ip}", lambda: self.store.bmc_hardware(bmc_ip), hardware_tags
        )
        if hw is None:
            raise NotFound(
                f"no device with BMC IP {bmc_ip} in the inventory ({self.store.kind}): "
                "set the device's out-of-band IP (oob_ip) to it",
                field="bmc_ip",
            )
        return hw  # type: ignore[no-any-return]

    async def set_pxe_enabled(self, ident: Ident, enabled: bool) -> Host:
        name = (await self.host(ident)).name if ident.field == "mac" else ident.value
        host = await self.store.set_pxe_enabled(name, enabled)
        if host is None:
            raise NotFound(f"no device named {name} in the inventory ({self.store.kind})", field="ident")
        self.apply_change(device_changed_for(host))
        return host

    def apply_change(self, evt: DeviceChanged) -> int:
        """Drop what the cache holds for a changed device (and every cached 'unknown')."""
        self.metrics.invalidations.inc()
        tags = change_tags(evt)
        if not tags:
            self.cache.clear()
            return -1
        return self.cache.invalidate(tags)

    async def ready(self) -> bool:
        try:
            return await self.store.ping()
        except KariosError:
            return False


def device_changed_for(host: Host) -> DeviceChanged:
    return DeviceChanged(device_id=host.id, name=host.name, macs=[m for i in host.interfaces for m in i.macs])
