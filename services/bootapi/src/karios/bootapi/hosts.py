"""Where host data comes from: the inventory over the bus, behind a boot-storm cache.

``HostSource`` is the store interface (matchbox's ``Store``): ``None`` means unknown; an
unreachable or failing inventory raises a :class:`KariosError` (never cached).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Protocol

from pydantic import ValidationError

from karios.bootapi.metrics import BootapiMetrics
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import DeviceChanged, Host, HostQuery, SetPxeEnabled
from karios.common.errors import KariosError, NotFound, UpstreamError
from karios.common.netaddr import normalize_mac


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


_MISSING = object()


class CachedHostSource:
    """TTL + LRU cache with single-flight: N concurrent misses for one key make one inventory call.

    ``invalidate`` (fed by ``device.changed`` events) drops every key of a device and marks
    lookups already in flight as stale, so an answer fetched before the change is not stored.
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
        self.ttl, self.negative_ttl, self.max_entries, self.clock = ttl, negative_ttl, max_entries, clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, Host | None]] = OrderedDict()
        self._inflight: dict[tuple[str, str], asyncio.Future[Host | None]] = {}
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def by_mac(self, mac: str) -> Host | None:
        return await self._get(("mac", normalize_mac(mac)))

    async def by_name(self, name: str) -> Host | None:
        return await self._get(("name", name.lower()))

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        await self.inner.set_pxe_enabled(ident, enabled)

    def _cached(self, key: tuple[str, str]) -> Any:
        hit = self._entries.get(key)
        if hit is None:
            return _MISSING
        expires, host = hit
        if expires < self.clock():
            del self._entries[key]
            return _MISSING
        self._entries.move_to_end(key)
        return host

    async def _get(self, key: tuple[str, str]) -> Host | None:
        cached = self._cached(key)
        if cached is not _MISSING:
            self.metrics.cache_hits.inc()
            return cached  # type: ignore[no-any-return]
        flight = self._inflight.get(key)
        if flight is not None:
            # Joined an in-flight lookup: served without another inventory call.
            self.metrics.cache_hits.inc()
            return await asyncio.shield(flight)
        self.metrics.cache_misses.inc()
        fut: asyncio.Future[Host | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        epoch = self._epoch
        try:
            host = await self._fetch(key)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: joiners re-raise it themselves
            raise
        else:
            fut.set_result(host)
            if epoch == self._epoch:
                self._store(key, host)
            return host
        finally:
            self._inflight.pop(key, None)

    async def _fetch(self, key: tuple[str, str]) -> Host | None:
        field, value = key
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

    def _store(self, key: tuple[str, str], host: Host | None) -> None:
        now = self.clock()
        self._entries[key] = (now + (self.ttl if host else self.negative_ttl), host)
        self._entries.move_to_end(key)
        if host is not None:
            # The same host answers for its name and every MAC it has.
            self._entries[("name", host.name.lower())] = (now + self.ttl, host)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def invalidate(
        self, *, device_id: int | None = None, name: str = "", macs: list[str] | tuple[str, ...] = ()
    ) -> int:
        """Drop every entry of a device (by id, name or MAC, including cached misses); returns how many."""
        self._epoch += 1
        dropped = 0
        names = {name.lower()} if name else set()
        ids = {device_id} if device_id is not None else set()
        keys: set[tuple[str, str]] = {("name", n) for n in names}
        for m in macs:
            try:
                keys.add(("mac", normalize_mac(m)))
            except ValueError:
                continue
        for key in list(keys):
            hit = self._entries.get(key)
            if hit is not None and hit[1] is not None:  # a MAC of a cached host: drop the whole host
                names.add(hit[1].name.lower())
                if hit[1].id is not None:
                    ids.add(hit[1].id)
        for key, (_exp, host) in list(self._entries.items()):
            if key in keys or (host is not None and (host.name.lower() in names or host.id in ids)):
                del self._entries[key]
                dropped += 1
        return dropped

    def invalidate_event(self, event: DeviceChanged) -> None:
        self.invalidate(device_id=event.device_id, name=event.name, macs=event.macs)

    def clear(self) -> None:
        self._epoch += 1
        self._entries.clear()
