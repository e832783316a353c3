"""GET /fabric-config/vtep-pool and transactional VTEP allocation on the real PostgreSQL."""

from __future__ import annotations

import asyncio

from karios.common.bus.runtime import Bus
from karios.common.contracts.fabric import AllocateVtep, ReleaseVtep
from karios.fabric_worker.app import create_app as worker_app
from tests.fixtures.fabric import BASE, VIEWER


async def _bus(settings) -> Bus:
    bus = Bus.from_settings(settings, "test-client")
    await bus.broker.connect()
    return bus


async def test_pool_status_counts_allocations_and_a_released_address_is_reused(fabric, settings):
    r = await fabric.client.get("/controlnode/fabric-config/vtep-pool", headers=VIEWER)
    assert r.status_code == 404
    await fabric.post(BASE)
    r = await fabric.client.get("/controlnode/fabric-config/vtep-pool", headers=VIEWER)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "allocated": 0,
        "exhausted": False,
        "last_allocated_ip": "",
        "prefix_length": 24,
        "remaining": 253,
        "router_id_base": "10.255.0.1",
        "start_ip": "10.255.0.1",
        "subnet_cidr": "10.255.0.0/24",
        "total_usable": 253,
    }  # .254 is the switch
    bus = await _bus(settings)
    try:
        subj = bus.subjects.request("fabric", "allocate_vtep")
        a = await bus.request(subj, AllocateVtep(node_ip="192.168.111.11"))
        b = await bus.request(subj, AllocateVtep(node_ip="192.168.111.12"))
        again = await bus.request(subj, AllocateVtep(node_ip="192.168.111.11"))
        assert (a["vtep_ip"], b["vtep_ip"], again["vtep_ip"]) == ("10.255.0.1", "10.255.0.2", "10.255.0.1")
        assert again["created"] is False
        pool = (await fabric.client.get("/controlnode/fabric-config/vtep-pool", headers=VIEWER)).json()
        assert (pool["allocated"], pool["remaining"], pool["last_allocated_ip"]) == (2, 251, "10.255.0.2")
        await bus.request(
            bus.subjects.request("fabric", "release_vtep"), ReleaseVtep(node_ip="192.168.111.11")
        )
        c = await bus.request(subj, AllocateVtep(node_ip="192.168.111.13"))
        assert c["vtep_ip"] == "10.255.0.1"  # released address reused
    finally:
        await bus.stop()


async def test_fifty_concurrent_allocations_over_two_workers_get_fifty_distinct_addresses(
    fabric, settings, serve
):
    await serve(worker_app(settings))  # a second replica in the same queue group
    await fabric.post(BASE)
    bus = await _bus(settings)
    try:
        subj = bus.subjects.request("fabric", "allocate_vtep")
        results = await asyncio.gather(
            *(
                bus.request(subj, AllocateVtep(node_ip=f"192.168.111.{100 + i}"), timeout=30)
                for i in range(50)
            )
        )
    finally:
        await bus.stop()
    ips = [r["vtep_ip"] for r in results]
    assert len(set(ips)) == 50
    pool = (await fabric.client.get("/controlnode/fabric-config/vtep-pool", headers=VIEWER)).json()
    assert pool["allocated"] == 50 and pool["remaining"] == 203
