"""The boot-storm cache: one inventory call per key however many hosts ask, and prompt invalidation."""

from __future__ import annotations

import asyncio

import pytest

from karios.bootapi.hosts import CachedHostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.common.contracts.inventory import DeviceChanged
from karios.common.errors import UpstreamError
from tests.fixtures.bootapi_hosts import ALMA, FixedHosts
from tests.fixtures.wait import wait_until


class SlowHosts(FixedHosts):
    """Each lookup takes a while (NetBox: ~100 ms), so concurrent misses overlap."""

    def __init__(self, delay: float = 0.05, fail: bool = False) -> None:
        super().__init__()
        self.delay, self.fail = delay, fail

    async def by_mac(self, mac):
        self.calls.append(("mac", mac))
        await asyncio.sleep(self.delay)
        if self.fail:
            raise UpstreamError("netbox timeout")
        return self._by_mac(mac)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cache(inner, **kw) -> CachedHostSource:
    return CachedHostSource(inner, BootapiMetrics(), **kw)


async def test_a_thousand_concurrent_misses_make_one_inventory_call():
    inner = SlowHosts()
    c = cache(inner)
    results = await asyncio.gather(*(c.by_mac("52:54:00:aa:00:11") for _ in range(1000)))
    assert {r.name for r in results} == {ALMA.name}
    assert inner.calls == [("mac", "52:54:00:aa:00:11")]
    reg = c.metrics.registry
    assert reg.get_sample_value("bootapi_netbox_cache_misses_total") == 1
    assert reg.get_sample_value("bootapi_netbox_cache_hits_total") == 999
    assert reg.get_sample_value("bootapi_netbox_lookups_total", {"field": "mac", "result": "ok"}) == 1


async def test_notations_share_one_cache_entry():
    inner = FixedHosts()
    c = cache(inner)
    for mac in ("52:54:00:AA:00:11", "52-54-00-aa-00-11", "525400aa0011"):
        await c.by_mac(mac)
    assert len(inner.calls) == 1


async def test_errors_reach_every_waiter_and_are_not_cached():
    inner = SlowHosts(fail=True)
    c = cache(inner)
    results = await asyncio.gather(
        *(c.by_mac("52:54:00:aa:00:11") for _ in range(50)), return_exceptions=True
    )
    assert all(isinstance(r, UpstreamError) for r in results)
    assert len(inner.calls) == 1
    inner.fail = False
    assert (await c.by_mac("52:54:00:aa:00:11")).name == ALMA.name
    assert len(inner.calls) == 2


async def test_found_hosts_expire_after_ttl_and_misses_sooner():
    inner, clock = FixedHosts(), Clock()
    c = cache(inner, ttl=300, negative_ttl=15, clock=clock)
    await c.by_mac("52:54:00:aa:00:11")
    await c.by_mac("52:54:00:ff:ff:ff")
    clock.now += 20
    await c.by_mac("52:54:00:aa:00:11")
    await c.by_mac("52:54:00:ff:ff:ff")
    assert inner.calls.count(("mac", "52:54:00:ff:ff:ff")) == 2
    assert inner.calls.count(("mac", "52:54:00:aa:00:11")) == 1
    clock.now += 300
    await c.by_mac("52:54:00:aa:00:11")
    assert inner.calls.count(("mac", "52:54:00:aa:00:11")) == 2


@pytest.mark.parametrize(
    "event",
    [
        DeviceChanged(device_id=11),
        DeviceChanged(name="NODE-A1.lab.example"),
        DeviceChanged(macs=["52-54-00-aa-00-11"]),
        DeviceChanged(macs=["aa:bb:cc:00:00:01"]),  # another MAC of the same device, not the cached key
    ],
    ids=["by-id", "by-name", "by-mac", "by-other-mac"],
)
async def test_device_changed_drops_every_key_of_the_device(event):
    inner = FixedHosts()
    c = cache(inner)
    await c.by_mac("52:54:00:aa:00:11")
    await c.by_mac("aa:bb:cc:00:00:01")
    await c.by_name("node-a1.lab.example")
    await c.by_mac("52:54:00:aa:00:12")
    before = len(inner.calls)
    assert c.invalidate(device_id=event.device_id, name=event.name, macs=event.macs) >= 1
    await c.by_mac("52:54:00:aa:00:11")
    await c.by_mac("52:54:00:aa:00:12")  # another device: still cached
    assert inner.calls[before:] == [("mac", "52:54:00:aa:00:11")]


async def test_a_new_device_replaces_a_cached_miss():
    inner = FixedHosts([])
    c = cache(inner)
    assert await c.by_mac("52:54:00:aa:00:11") is None
    inner.hosts[ALMA.name] = ALMA
    c.invalidate(name=ALMA.name, macs=["52:54:00:aa:00:11"])
    assert (await c.by_mac("52:54:00:aa:00:11")).name == ALMA.name


async def test_an_answer_fetched_before_an_invalidation_is_not_stored():
    inner = SlowHosts(delay=0.2)
    c = cache(inner)
    first = asyncio.create_task(c.by_mac("52:54:00:aa:00:11"))
    await wait_until(lambda: len(inner.calls) == 1, interval=0.005, what="the lookup to start")
    c.invalidate(device_id=11)
    await first
    await c.by_mac("52:54:00:aa:00:11")
    assert len(inner.calls) == 2


async def test_cache_size_is_bounded():
    inner = FixedHosts([])
    c = cache(inner, max_entries=100)
    for i in range(250):
        await c.by_mac(f"52:54:00:00:{i // 256:02x}:{i % 256:02x}")
    assert len(c) == 100
