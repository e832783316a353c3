"""A ``DeviceChanged`` naming no device (NetBox config context, module type, platform, …) drops
every cached host; one naming a device drops only that one."""

from __future__ import annotations

from karios.bootapi.hosts import CachedHostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.common.contracts.inventory import DeviceChanged
from tests.fixtures.bootapi_hosts import ALMA, DEBIAN, FixedHosts


async def test_an_event_without_a_device_drops_every_entry():
    inner = FixedHosts()
    c = CachedHostSource(inner, BootapiMetrics())
    for mac in ("52:54:00:aa:00:11", "52:54:00:aa:00:13"):
        await c.by_mac(mac)
    assert len(inner.calls) == 2
    assert c.invalidate_event(DeviceChanged(device_id=ALMA.id)) > 0
    await c.by_mac("52:54:00:aa:00:13")  # DEBIAN stays cached
    assert len(inner.calls) == 2
    assert c.invalidate_event(DeviceChanged()) == -1 and len(c) == 0
    await c.by_mac("52:54:00:aa:00:13")
    assert inner.calls[-1] == ("mac", "52:54:00:aa:00:13") and len(inner.calls) == 3
    assert DEBIAN.id is not None
