"""The boot-storm cache: single-flight, negative caching, bounds, invalidation."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from karios.common.cache import SingleFlightCache
from karios.common.contracts.inventory import DeviceChanged, Host, HostInterface
from karios.common.errors import UpstreamError
from karios.inventory.lookups import Inventory, InventoryMetrics, host_tags
from karios.inventory.store import parse_ident
from tests.fixtures.wait import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowStore:
    """A store whose MAC lookups take a while and are counted (stands in for NetBox)."""

    kind = "fake"

    def __init__(self, hosts: dict[str, Host], delay: float = 0.05) -> None:
        self.hosts = hosts
        self.delay = delay
        self.calls = 0
        self.fail = False

    async def host_by_mac(self, mac: str) -> Host | None:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise UpstreamError("NetBox down")
        return self.hosts.get(mac)

    async def host_by_name(self, name: str) -> Host | None:
        self.calls += 1
        return next((h for h in self.hosts.values() if h.name == name), None)

    async def set_pxe_enabled(self, name: str, enabled: bool) -> Host | None:
        host = await self.host_by_name(name)
        if host:
            host.pxe_enabled = enabled
        return host

    async def bmc_hardware(self, bmc_ip: str):  # type: ignore[no-untyped-def]
        return None

    async def allocate_ip(self, name: str):  # type: ignore[no-untyped-def]
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


MAC = "aa:bb:cc:dd:ee:01"


def make_inventory(store: SlowStore, **cache_kw) -> Inventory:  # type: ignore[no-untyped-def]
    return Inventory(
        store=store, cache=SingleFlightCache(**cache_kw), metrics=InventoryMetrics(CollectorRegistry())
    )


def node(mac: str = MAC, name: str = "node-01", dev_id: int = 7) -> Host:
    return Host(id=dev_id, name=name, interfaces=[HostInterface(name="eno1", macs=[mac])])


async def test_100_concurrent_lookups_of_one_uncached_mac_make_one_store_call():
    store = SlowStore({MAC: node()})
    inv = make_inventory(store)
    notations = ["aa:bb:cc:dd:ee:01", "AA-BB-CC-DD-EE-01", "aabb.ccdd.ee01", "AABBCCDDEE01"]
    results = await asyncio.gather(*(inv.host(parse_ident(mac=notations[i % 4])) for i in range(100)))
    assert store.calls == 1
    assert {r.name for r in results} == {"node-01"}
    reg = inv.metrics.registry
    assert reg.get_sample_value("karios_inventory_cache_misses_total", {"field": "mac"}) == 1
    assert reg.get_sample_value("karios_inventory_cache_hits_total", {"field": "mac"}) == 99
    assert reg.get_sample_value("karios_inventory_lookups_total", {"field": "mac", "result": "ok"}) == 100


async def test_unknown_mac_is_cached_briefly_then_asked_again():
    clock = Clock()
    store = SlowStore({}, delay=0)
    inv = make_inventory(store, negative_ttl=5, clock=clock)
    for _ in range(3):
        with pytest.raises(Exception, match="no interface with MAC aa:bb:cc:dd:ee:01"):
            await inv.host(parse_ident(mac=MAC))
    assert store.calls == 1
    clock.now += 6
    store.hosts[MAC] = node()
    assert (await inv.host(parse_ident(mac=MAC))).name == "node-01"
    assert store.calls == 2
    assert (
        inv.metrics.registry.get_sample_value(
            "karios_inventory_lookups_total", {"field": "mac", "result": "notfound"}
        )
        == 3
    )


async def test_found_host_expires_after_ttl():
    clock = Clock()
    store = SlowStore({MAC: node()}, delay=0)
    inv = make_inventory(store, ttl=60, clock=clock)
    await inv.host(parse_ident(mac=MAC))
    clock.now += 59
    await inv.host(parse_ident(mac=MAC))
    assert store.calls == 1
    clock.now += 2
    await inv.host(parse_ident(mac=MAC))
    assert store.calls == 2


async def test_errors_reach_every_waiter_and_are_not_cached():
    store = SlowStore({MAC: node()})
    store.fail = True
    inv = make_inventory(store)
    results = await asyncio.gather(
        *(inv.host(parse_ident(mac=MAC)) for _ in range(10)), return_exceptions=True
    )
    assert all(isinstance(r, UpstreamError) for r in results)
    assert store.calls == 1
    assert (
        inv.metrics.registry.get_sample_value(
            "karios_inventory_lookups_total", {"field": "mac", "result": "error"}
        )
        == 10
    )
    store.fail = False
    assert (await inv.host(parse_ident(mac=MAC))).name == "node-01"
    assert store.calls == 2


async def test_a_caller_giving_up_does_not_cancel_the_load_for_the_others():
    store = SlowStore({MAC: node()}, delay=0.3)
    inv = make_inventory(store)
    first = asyncio.create_task(inv.host(parse_ident(mac=MAC)))
    second = asyncio.create_task(inv.host(parse_ident(mac=MAC)))
    await wait_until(lambda: store.calls == 1, interval=0.005, what="the shared load to start")
    first.cancel()
    assert (await second).name == "node-01"
    assert store.calls == 1


async def test_size_is_bounded_least_recently_used_first():
    cache: SingleFlightCache[str] = SingleFlightCache(max_size=3)
    for k in "abcd":
        cache.put(k, k.upper())
    assert len(cache) == 3
    assert cache.peek("a") is None
    assert cache.peek("d") == "D"


async def test_device_change_drops_its_entries_by_id_name_and_mac_and_all_unknowns():
    store = SlowStore({MAC: node(), "aa:bb:cc:dd:ee:02": node("aa:bb:cc:dd:ee:02", "node-02", 8)}, delay=0)
    inv = make_inventory(store)
    await inv.host(parse_ident(mac=MAC))
    await inv.host(parse_ident(name="node-01"))
    await inv.host(parse_ident(mac="aa:bb:cc:dd:ee:02"))
    with pytest.raises(Exception, match="no interface"):
        await inv.host(parse_ident(mac="aa:bb:cc:dd:ee:99"))
    calls = store.calls
    inv.apply_change(DeviceChanged(device_id=7))
    await inv.host(parse_ident(mac=MAC))
    await inv.host(parse_ident(name="node-01"))
    await inv.host(parse_ident(mac="aa:bb:cc:dd:ee:02"))  # another device: still cached
    assert store.calls == calls + 2
    store.hosts["aa:bb:cc:dd:ee:99"] = node("aa:bb:cc:dd:ee:99", "node-99", 99)
    inv.apply_change(DeviceChanged(name="node-99", macs=["aa:bb:cc:dd:ee:99"]))
    assert (await inv.host(parse_ident(mac="aa:bb:cc:dd:ee:99"))).name == "node-99"


async def test_a_load_racing_an_invalidation_is_not_stored():
    store = SlowStore({MAC: node()}, delay=0.2)
    inv = make_inventory(store)
    task = asyncio.create_task(inv.host(parse_ident(mac=MAC)))
    await wait_until(lambda: store.calls == 1, interval=0.005, what="the load to start")
    inv.apply_change(DeviceChanged(device_id=7))
    await task
    await inv.host(parse_ident(mac=MAC))
    assert store.calls == 2


def test_host_tags_cover_id_name_and_every_mac():
    h = Host(
        id=3, name="n", interfaces=[HostInterface(name="a", macs=["aa:aa:aa:aa:aa:aa", "bb:bb:bb:bb:bb:bb"])]
    )
    assert set(host_tags(h)) == {"id:3", "name:n", "mac:aa:aa:aa:aa:aa:aa", "mac:bb:bb:bb:bb:bb:bb"}
