"""GET /fabric-config/vtep-pool and transactional VTEP allocation on the real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from karios.common.bus.runtime import Bus
from karios.common.contracts.fabric import AllocateVtep, ReleaseVtep
from karios.common.contracts.nodes import ReleaseFabricNode
from karios.common.errors import Conflict
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


async def test_a_question_about_one_node_reads_that_nodes_rows_and_release_names_its_vtep(fabric, settings):
    # Issue 28: releasing, post-deploy-checking or diffing one node read every node's VTEP row
    # and host key. The repository answers for the nodes asked about, from the same table.
    await fabric.post(BASE)
    repo = fabric.worker.app.state.rollout.repo
    assert await repo.any_allocated() is False
    bus = await _bus(settings)
    try:
        subj = bus.subjects.request("fabric", "allocate_vtep")
        for i in (11, 12, 13):
            await bus.request(subj, AllocateVtep(node_ip=f"192.168.111.{i}"))
        assert await repo.any_allocated() is True
        assert await repo.allocations(["192.168.111.12", "192.168.111.99"]) == {
            "192.168.111.12": "10.255.0.2"
        }
        assert await repo.allocation_of("192.168.111.13") == "10.255.0.3"
        assert await repo.allocation_of("192.168.111.99") is None
        assert len(await repo.allocations()) == 3
        await repo.remember_host_keys(
            {"192.168.111.11": "ssh-ed25519 AAAA11", "192.168.111.12": "ssh-ed25519 AAAA12"}
        )
        assert await repo.host_keys(["192.168.111.12"]) == {"192.168.111.12": "ssh-ed25519 AAAA12"}
        assert len(await repo.host_keys()) == 2

        release = bus.subjects.request("fabric", "release_node")
        with pytest.raises(Conflict) as refused:  # holds a VTEP: tear it down first
            await bus.request(release, ReleaseFabricNode(node_ip="192.168.111.12"))
        assert refused.value.field == "node_ip"
        assert refused.value.details == {"node_ip": "192.168.111.12", "vtep_ip": "10.255.0.2"}
        done = await bus.request(release, ReleaseFabricNode(node_ip="192.168.111.99"))
        assert done["host_key_forgotten"] is False
    finally:
        await repo.forget_host_key("192.168.111.11")
        await repo.forget_host_key("192.168.111.12")
        await bus.stop()
