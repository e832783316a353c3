"""Inventory on the real bus (file-backed demo inventory): gateway routes, host lookups, pxe_enabled,
the node registry queries, and the NetBox webhook receiver."""

from __future__ import annotations

import asyncio
import json

import httpx
import nats
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.common.bus.subjects import Subjects
from karios.common.contracts.inventory import (
    AllocateIp,
    BmcAccessQuery,
    Host,
    HostQuery,
    NodeAccessQuery,
    SetPxeEnabled,
)
from karios.common.crypto import SecretBox
from karios.common.errors import NotFound, ValidationFailed
from karios.inventory.app import create_app as inventory_app
from karios.inventory.settings import InventorySettings
from karios.inventory.webhook import sign
from tests.fixtures.apps import ADMIN
from tests.fixtures.wait import wait_until

WEBHOOK_SECRET = "hook-s3cret"


@pytest.fixture
async def bus(settings):
    b = Bus.from_settings(settings, "test-client")
    await b.broker.connect()
    yield b
    await b.stop()


@pytest.fixture
async def inventory(settings, serve):
    return await serve(
        inventory_app(settings, inventory_settings=InventorySettings(webhook_secret=WEBHOOK_SECRET))
    )


async def test_gateway_lists_disks_nics_and_gpus_of_a_bmc(settings, serve, inventory):
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN) as c:
        r = await c.get("/controlnode/bmc/10.20.0.12/disks")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["device_name"] == "node-02"
        assert [(d["name"], d["size_gb"], d["bus"]) for d in body["disks"]] == [
            ("sda", 480.0, "sata"),
            ("nvme0", 7680.0, "nvme"),
        ]
        assert [n["name"] for n in body["nics"] if n["is_bmc"]] == ["bmc"]
        assert {n["name"]: n["macs"] for n in body["nics"]}["enp65s0f0"] == ["3c:ec:ef:00:02:01"]
        g = await c.get("/controlnode/bmc/10.20.0.12/gpus")
        assert g.status_code == 200
        assert [(x["model"], x["memory_gb"], x["pci_address"]) for x in g.json()["gpus"]] == [
            ("H100 PCIe", 80.0, "0000:81:00.0"),
            ("H100 PCIe", 80.0, "0000:82:00.0"),
        ]


async def test_unknown_or_invalid_bmc_is_404_or_422_never_500(settings, serve, inventory):
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN) as c:
        r = await c.get("/controlnode/bmc/10.99.0.1/disks")
        assert r.status_code == 404
        assert "no device with BMC IP 10.99.0.1" in r.json()["message"]
        r = await c.get("/controlnode/bmc/not-an-ip/gpus")
        assert r.status_code == 422 and r.json()["field"] == "bmc_ip"
        r = await c.get("/controlnode/bmc/10.20.0.12/disks", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401


async def test_netbox_down_is_a_502_with_a_clear_message(settings, serve):
    settings.netbox_url = "http://127.0.0.1:9"  # discard port: nothing listens
    settings.netbox_token = SecretStr("nbt_secret-token-value")
    await serve(inventory_app(settings, inventory_settings=InventorySettings(netbox_timeout=2)))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN) as c:
        r = await c.get("/controlnode/bmc/10.20.0.12/disks")
    assert r.status_code == 502, r.text
    assert r.json()["code"] == "UPSTREAM_ERROR"
    assert "cannot reach NetBox at http://127.0.0.1:9" in r.json()["message"]
    assert "secret-token" not in r.text


@pytest.mark.parametrize(
    "notation", ["d0:8e:79:00:01:01", "D0-8E-79-00-01-01", "d08e.7900.0101", "D08E79000101"]
)
async def test_host_lookup_by_mac_in_any_notation(bus, inventory, notation):
    raw = await bus.request(bus.subjects.query("inventory", "host"), HostQuery(mac=notation))
    host = Host.model_validate(raw)
    assert host.name == "node-01" and host.primary_ipv4 == "10.10.0.11/24" and host.pxe_enabled
    assert {i.name: i.macs for i in host.interfaces}["eno1"] == ["d0:8e:79:00:01:01"]


async def test_host_lookup_by_name_unknown_and_bad_mac(bus, inventory):
    host = Host.model_validate(
        await bus.request(bus.subjects.query("inventory", "host"), HostQuery(name="node-02"))
    )
    assert host.oob_ip == "10.20.0.12"
    with pytest.raises(NotFound, match="no interface with MAC 00:00:00:00:00:01"):
        await bus.request(bus.subjects.query("inventory", "host"), HostQuery(mac="00:00:00:00:00:01"))
    with pytest.raises(ValidationFailed) as err:
        await bus.request(bus.subjects.query("inventory", "host"), HostQuery(mac="not-a-mac"))
    assert err.value.field == "mac"


async def test_pxe_enabled_round_trips_and_announces_the_change(settings, bus, inventory):
    subjects = Subjects(settings.bus_prefix)
    nc = await nats.connect(settings.nats_url)
    got: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(subjects.events_of("inventory"), cb=got.put)
    try:
        q = subjects.query("inventory", "host")
        assert (
            Host.model_validate(await bus.request(q, HostQuery(name="node-01"))).pxe_enabled is True
        )  # cached
        raw = await bus.request(
            subjects.request("inventory", "set_pxe_enabled"),
            SetPxeEnabled(ident="D0-8E-79-00-01-01", enabled=False),
        )
        assert Host.model_validate(raw).pxe_enabled is False
        # the cache honours the change: the next lookup by name sees it
        assert Host.model_validate(await bus.request(q, HostQuery(name="node-01"))).pxe_enabled is False
        msg = await asyncio.wait_for(got.get(), 5)
        assert msg.subject == subjects.evt("inventory", "device.changed", "node-01")
        data = json.loads(msg.data)["data"]
        assert data["name"] == "node-01" and "d0:8e:79:00:01:01" in data["macs"]
        raw = await bus.request(
            subjects.request("inventory", "set_pxe_enabled"), SetPxeEnabled(ident="node-01", enabled=True)
        )
        assert Host.model_validate(raw).pxe_enabled is True
        with pytest.raises(NotFound):
            await bus.request(
                subjects.request("inventory", "set_pxe_enabled"), SetPxeEnabled(ident="nope", enabled=True)
            )
    finally:
        await nc.close()


@pytest.fixture
async def forget_registered(settings):
    """Rows this test registers are deleted again: the session database is shared with other tests."""
    yield
    eng = create_async_engine(settings.database_url)
    async with eng.begin() as conn:
        await conn.execute(
            sa.text("DELETE FROM inventory.bmc_infos WHERE bmc_ip IN ('10.20.0.11', '10.20.0.12')")
        )
    await eng.dispose()


async def test_registry_gives_ssh_and_bmc_access_as_ciphertext_only(
    settings, serve, bus, inventory, forget_registered
):
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN) as c:
        for body in (
            {
                "bmc_ip": "10.20.0.11",
                "os_hostname": "node-01",
                "os_ip": "10.10.0.11",
                "os_username": "karios",
                "os_password": "os-s3cret",
                "bmc_username": "root",
                "bmc_password": "bmc-s3cret",
                "vendor": "dell",
            },
            {"bmc_ip": "10.20.0.12", "bmc_username": "ADMIN", "bmc_password": "bmc-s3cret2"},  # no OS IP yet
        ):
            assert (await c.post("/controlnode/register", json=body)).status_code == 200
    box = SecretBox.from_settings(settings)
    # The session database is shared with other tests: look only at the nodes registered here.
    mine = ("10.20.0.11", "10.20.0.12")
    nodes = await bus.request(bus.subjects.query("inventory", "node_access"), NodeAccessQuery())
    nodes = [n for n in nodes if n["bmc_ip"] in mine]
    assert [n["node_ip"] for n in nodes] == ["10.10.0.11"]
    n = nodes[0]
    assert n["os_username"] == "karios" and "s3cret" not in json.dumps(nodes)
    assert box.decrypt(n["os_password_enc"], context=f"os:{n['bmc_ip']}") == "os-s3cret"
    compute = await bus.request(
        bus.subjects.query("inventory", "node_access"), NodeAccessQuery(compute_only=True)
    )
    assert [n for n in compute if n["bmc_ip"] in mine] == []
    # One node by its OS address (the fabric's per-node routes; read by key, issue 28): the same
    # record as in the whole set; an address not in the set is a 404.
    one = await bus.request(
        bus.subjects.query("inventory", "node_access"), NodeAccessQuery(node_ip="10.10.0.11")
    )
    assert one == [n]
    with pytest.raises(NotFound):
        await bus.request(
            bus.subjects.query("inventory", "node_access"), NodeAccessQuery(node_ip="10.10.0.99")
        )

    access = await bus.request(
        bus.subjects.query("inventory", "bmc_access"), BmcAccessQuery(bmc_ip="10.20.0.12")
    )
    assert access["username"] == "ADMIN" and "s3cret" not in json.dumps(access)
    assert box.decrypt(access["password_enc"], context="bmc:10.20.0.12") == "bmc-s3cret2"
    with pytest.raises(NotFound):
        await bus.request(bus.subjects.query("inventory", "bmc_access"), BmcAccessQuery(bmc_ip="10.20.0.99"))


async def test_static_ip_allocation_over_the_bus(bus, inventory):
    got = await bus.request(bus.subjects.request("inventory", "allocate_ip"), AllocateIp(name="node-03"))
    assert got["address"] == "10.10.0.100/24" and got["gateway"] == "10.10.0.1"
    again = await bus.request(bus.subjects.request("inventory", "allocate_ip"), AllocateIp(name="node-03"))
    assert again["address"] == got["address"] and again["created"] is False


async def test_webhook_checks_the_signature_and_emits_device_changed(settings, inventory):
    subjects = Subjects(settings.bus_prefix)
    nc = await nats.connect(settings.nats_url)
    got: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(subjects.evt("inventory", "device.changed", "node-02"), cb=got.put)
    await nc.flush()  # the server has the subscription before the webhook publishes
    body = json.dumps(
        {
            "event": "updated",
            "object_type": "dcim.device",
            "data": {"id": 2, "name": "node-02"},
            "username": "admin",
        }
    ).encode()
    url = "/inventory/netbox-webhook"
    try:
        async with httpx.AsyncClient(base_url=inventory.url) as c:
            r = await c.post(url, content=body, headers={"X-Hook-Signature": sign(body, "wrong")})
            assert r.status_code == 401 and "X-Hook-Signature" in r.json()["message"]
            r = await c.post(url, content=body)
            assert r.status_code == 401
            r = await c.post(
                url,
                content=body,
                headers={"X-Hook-Signature": sign(body, WEBHOOK_SECRET), "Content-Type": "application/json"},
            )
            assert r.status_code == 202 and r.json()["accepted"] is True
            msg = await asyncio.wait_for(got.get(), 30)  # stored before the 202; 5 s was missed under CI load
            assert json.loads(msg.data)["data"]["device_id"] == 2
            other = json.dumps({"event": "created", "object_type": "extras.tag", "data": {"id": 1}}).encode()
            r = await c.post(url, content=other, headers={"X-Hook-Signature": sign(other, WEBHOOK_SECRET)})
            assert r.status_code == 202 and r.json()["accepted"] is False
            junk = b"not json"
            r = await c.post(url, content=junk, headers={"X-Hook-Signature": sign(junk, WEBHOOK_SECRET)})
            assert r.status_code == 422
            metrics = (await c.get("/metrics")).text
            assert "karios_inventory_cache_invalidations_total" in metrics
    finally:
        await nc.close()


async def test_webhook_without_a_configured_secret_refuses_everything(settings, serve):
    inv = await serve(inventory_app(settings))
    body = b'{"object_type": "dcim.device", "data": {"id": 1}}'
    async with httpx.AsyncClient(base_url=inv.url) as c:
        r = await c.post(
            "/inventory/netbox-webhook", content=body, headers={"X-Hook-Signature": sign(body, "")}
        )
    assert r.status_code == 403 and "KARIOS_INVENTORY_WEBHOOK_SECRET" in r.json()["message"]


async def test_lookups_show_in_metrics(bus, inventory):
    for _ in range(3):
        with pytest.raises(NotFound):
            await bus.request(bus.subjects.query("inventory", "host"), HostQuery(mac="d0:8e:79:00:09:99"))
    await bus.request(bus.subjects.query("inventory", "host"), HostQuery(name="node-01"))
    async with httpx.AsyncClient(base_url=inventory.url) as c:
        text = (await c.get("/metrics")).text
    assert 'karios_inventory_lookups_total{field="mac",result="notfound"} 3.0' in text
    assert 'karios_inventory_lookups_total{field="name",result="ok"} 1.0' in text
    assert 'karios_inventory_cache_hits_total{field="mac"} 2.0' in text
    assert 'karios_inventory_cache_misses_total{field="mac"} 1.0' in text
    assert "karios_inventory_lookup_duration_seconds_bucket" in text


async def test_device_changed_from_the_bus_drops_the_cached_host_on_every_replica(settings, serve, bus):
    """What a second replica (or bootapi) sees: the event alone, not the write that caused it."""
    from karios.common.contracts.inventory import DeviceChanged

    running = [await serve(inventory_app(settings)) for _ in range(2)]
    caches = [r.app.state.inventory.cache for r in running]
    q = bus.subjects.query("inventory", "host")
    for _ in range(6):  # queue group: spread over both replicas until both hold the host
        await bus.request(q, HostQuery(name="node-02"))
        if all(c.peek("name:node-02") for c in caches):
            break
    for c in caches:  # make sure both hold it whichever replica answered
        if c.peek("name:node-02") is None:
            c.put("name:node-02", Host(id=2, name="node-02"), ["id:2", "name:node-02"])
    await bus.publish_event(
        DeviceChanged(device_id=2, name="node-02"),
        bus.subjects.evt("inventory", "device.changed", "node-02"),
        entity="node-02",
    )
    await wait_until(
        lambda: all(c.peek("name:node-02") is None for c in caches), what="every replica to drop node-02"
    )
    assert [c.peek("name:node-02") for c in caches] == [None, None]


async def test_the_whole_node_set_follows_every_write_even_one_made_in_sql(
    settings, serve, bus, inventory, forget_registered
):
    """The inventory keeps the whole node set while its tables are unchanged (issue 28): a write
    through the API, an UPDATE or a DELETE made in SQL (another replica, a restore) is seen by
    the next request, never a kept set."""
    subject = bus.subjects.query("inventory", "node_access")

    async def mine() -> list[dict]:
        return [n for n in await bus.request(subject, NodeAccessQuery()) if n["bmc_ip"] == "10.20.0.11"]

    gw = await serve(gateway_app(settings))
    body = {"bmc_ip": "10.20.0.11", "os_ip": "10.10.0.11", "os_username": "karios", "bmc_username": "root"}
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN) as c:
        assert (await c.post("/controlnode/register", json=body)).status_code == 200
        first = await mine()
        assert [n["os_username"] for n in first] == ["karios"]
        assert await mine() == first  # unchanged tables: the same set
        eng = create_async_engine(settings.database_url)
        try:
            async with eng.begin() as conn:
                edit = "UPDATE inventory.bmc_infos SET os_username = 'edited' WHERE bmc_ip = '10.20.0.11'"
                await conn.execute(sa.text(edit))
            assert [n["os_username"] for n in await mine()] == ["edited"]
            async with eng.begin() as conn:
                await conn.execute(sa.text("DELETE FROM inventory.bmc_infos WHERE bmc_ip = '10.20.0.11'"))
            assert await mine() == []
        finally:
            await eng.dispose()
        again = await c.post("/controlnode/register", json=body | {"os_username": "again"})
        assert again.status_code == 200
        assert [n["os_username"] for n in await mine()] == ["again"]
