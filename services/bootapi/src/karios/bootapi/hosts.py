"""Where host data comes from: the inventory over the bus, behind a boot-storm cache.

``HostSource`` is the store interface (matchbox's ``Store``): ``None`` means unknown; an
unreachable or failing inventory raises a :class:`KariosError` (never cached).
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Protocol

from pydantic import ValidationError

from karios.bootapi.metrics import BootapiMetrics
from karios.common.bus.runtime import Bus
from karios.common.cache import SingleFlightCache
from karios.common.contracts.inventory import DeviceChanged, Host, HostQuery, SetPxeEnabled
from karios.common.errors import KariosError, NotFound, UpstreamError
from karios.common.netaddr import mac_or_none, normalize_mac

_normalize_mac = lru_cache(maxsize=65536)(normalize_mac)  # hot: every /ipxe request


class HostSource(Protocol):
    async def by_mac(self, mac: str) -> Host | None: ...

    async def by_name(self, name: str) -> Host | None: ...

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None: ...


class BusHostSource:
    """The inventory service over NATS request/reply."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def _lookup(self, query: HostQuery) -> Host | None:
        try:
            result = await self.bus.request(self.bus.subjects.query("inventory", "host"), query)
        except NotFound:
            return None
        if result is None:
            return None
        try:
            return Host.model_validate(result)
        except ValidationError as exc:
            raise UpstreamError(
                f"inventory answered a malformed host: {exc.errors()[0].get('msg')}"
            ) from None

    async def by_mac(self, mac: str) -> Host | None:
        return await self._lookup(HostQuery(mac=mac))

    async def by_name(self, name: str) -> Host | None:
        return await self._lookup(HostQuery(name=name))

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        await self.bus.request(
            self.bus.subjects.request("inventory", "set_pxe_enabled"),
            SetPxeEnabled(ident=ident, enabled=enabled),
        )


class CachedHostSource:
    """The shared boot-storm cache (:class:`karios.common.cache.SingleFlightCache`) in front of a
    :class:`HostSource`: N concurrent misses for one key make one inventory call.

    Entries are tagged with the device's id, name and MACs, so ``invalidate`` (fed by
    ``device.changed`` events) drops every key of a device, and a lookup already in flight when
    the change arrives is returned but not stored.
    """

    def __init__(
        self,
        inner: HostSource,
        metrics: BootapiMetrics,
        *,
        ttl: float = 300.0,
        negative_ttl: float = 15.0,
        max_entries: int = 100_000,
        clock: Any = time.monotonic,
    ) -> None:
        self.inner, self.metrics = inner, metrics
        self._cache: SingleFlightCache[Host] = SingleFlightCache(
            ttl=ttl, negative_ttl=negative_ttl, max_size=max_entries, clock=clock
        )

    def __len__(self) -> int:
        return len(self._cache)

    async def by_mac(self, mac: str) -> Host | None:
        return await self._get("mac", _normalize_mac(mac))

    async def by_name(self, name: str) -> Host | None:
        return await self._get("name", name.lower())

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        await self.inner.set_pxe_enabled(ident, enabled)

    async def _get(self, field: str, value: str) -> Host | None:
        got = await self._cache.get_or_load(f"{field}:{value}", lambda: self._fetch(field, value), _tags)
        (self.metrics.cache_hits if got.hit else self.metrics.cache_misses).inc()
        if got.value is not None and not got.hit:
            # The same host answers for its name whichever key found it.
            self._cache.put(f"name:{got.value.name.lower()}", got.value, _tags(got.value))
        return got.value

    async def _fetch(self, field: str, value: str) -> Host | None:
        started = time.perf_counter()
        try:
            host = await (self.inner.by_mac(value) if field == "mac" else self.inner.by_name(value))
        except KariosError:
            self.metrics.lookups.labels(field, "error").inc()
            raise
        except Exception as exc:
            self.metrics.lookups.labels(field, "error").inc()
            raise UpstreamError(f"inventory lookup failed: {type(exc).__name__}") from exc
        finally:
            self.metrics.lookup_duration.labels(field).observe(time.perf_counter() - started)
        self.metrics.lookups.labels(field, "ok" if host else "notfound").inc()
        return host

    def invalidate(
        self, *, device_id: int | None = None, name: str = "", macs: list[str] | tuple[str, ...] = ()
    ) -> int:
        """Drop every entry of a device (by id, name or MAC, including cached misses); returns how many."""
        tags = {f"id:{device_id}"} if device_id is not None else set()
        if name:
            tags.add(f"name:{name.lower()}")
        tags |= {f"mac:{mac}" for mac in map(mac_or_none, macs) if mac is not None}
        # A MAC or name of a cached host stands for the whole host (its other keys go too).
        for tag in list(tags):
            host = self._cache.peek(tag)
            if host is not None:
                tags |= set(_tags(host))
        return self._cache.invalidate(tags, negatives=False)

    def invalidate_event(self, event: DeviceChanged) -> int:
        """Drop a changed device's entries; an event naming no device (no id, name or MAC)
        drops everything (returns -1)."""
        if event.device_id is None and not event.name and not event.macs:
            self.clear()
            return -1
        return self.invalidate(device_id=event.device_id, name=event.name, macs=event.macs)

    def clear(self) -> None:
        self._cache.clear()


def _tags(host: Host) -> list[str]:
    tags = [f"name:{host.name.lower()}"] + [f"mac:{m}" for i in host.interfaces for m in i.macs]
    return tags + ([f"id:{host.id}"] if host.id is not None else [])
