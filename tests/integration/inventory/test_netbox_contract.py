"""Contract tests against a real NetBox 4.7 (tests/lab/netbox.sh): the adapter, the bus and the
gateway routes on objects these tests create through the API (and delete afterwards).

Skipped with the reason when the lab script is missing or fails; under CI=true that fails instead.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pynetbox
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.common.bus.subjects import Subjects
from karios.common.cache import SingleFlightCache
from karios.common.contracts.inventory import Host, HostQuery, SetPxeEnabled
from karios.common.errors import Forbidden, NotFound, UpstreamError
from karios.inventory.app import create_app as inventory_app
from karios.inventory.lookups import Inventory, InventoryMetrics
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.settings import InventorySettings
from karios.inventory.store import parse_ident
from tests.fixtures.apps import ADMIN, REQUIRE
from tests.lab.netbox_lab import LabDevice, NetBoxLab

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "lab" / "netbox.sh"
WEBHOOK_SECRET = "contract-hook-secret"

# On a fresh machine the first test waits on the lab's lock while NetBox is installed and its
# database migrated in the background (scripts/test.sh starts it; 5-30 min, most on a loaded
# machine): past the suite's 300 s per-test limit.
pytestmark = [pytest.mark.lab, pytest.mark.netbox, pytest.mark.timeout(2700)]


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"NetBox lab unavailable: {reason} — CI requires it", pytrace=False)
    pytest.skip(f"NetBox lab unavailable: {reason}")


@pytest.fixture(scope="session")
def netbox_env() -> dict[str, str]:
    """``tests/lab/netbox.sh up --with-worker`` (cached: seconds when already built), then its env."""
    if not SCRIPT.exists():
        _unavailable(f"{SCRIPT.relative_to(ROOT)} is missing")
    try:
        proc = subprocess.run(
            [str(SCRIPT), "up", "--with-worker"], capture_output=True, text=True, timeout=1800, check=False
        )
    except subprocess.TimeoutExpired:
        _unavailable("`netbox.sh up` took more than 30 minutes")
    if proc.returncode != 0:
        _unavailable(f"`netbox.sh up` exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if not env.get("NETBOX_URL") or not env.get("NETBOX_TOKEN"):
        _unavailable(f"`netbox.sh up` printed no NETBOX_URL/NETBOX_TOKEN: {proc.stdout[-300:]!r}")
    return env


@pytest.fixture(scope="session")
def nb_lab(netbox_env):
    nb = pynetbox.api(netbox_env["NETBOX_URL"], token=netbox_env["NETBOX_TOKEN"])
    lab = NetBoxLab(nb)
    try:
        lab.shared()
        lab.base()
        lab.items_device = lab.device_with_items()  # type: ignore[attr-defined]
        lab.modules_device = lab.device_with_modules()  # type: ignore[attr-defined]
        yield lab
    finally:
        lab.cleanup()


@pytest.fixture
def node(nb_lab) -> LabDevice:
    return nb_lab.items_device


@pytest.fixture
async def store(netbox_env):
    s = NetBoxStore(netbox_env["NETBOX_URL"], netbox_env["NETBOX_TOKEN"])
    yield s
    await s.close()


@pytest.fixture
def nb_settings(settings, netbox_env):
    settings.netbox_url = netbox_env["NETBOX_URL"]
    settings.netbox_token = SecretStr(netbox_env["NETBOX_TOKEN"])
    return settings


@pytest.fixture
async def bus(nb_settings):
    b = Bus.from_settings(nb_settings, "contract-test")
    await b.broker.connect()
    yield b
    await b.stop()


# -- the adapter ------------------------------------------------------------------------------


async def test_device_with_2_nics_2_disks_1_gpu(store, node):
    hw = await store.bmc_hardware(node.bmc_ip)
    assert hw is not None and hw.device_name == node.name
    assert [(d.name, d.size_gb, d.pci_address) for d in hw.disks] == [
        ("nvme0", 3840.0, "0000:41:00.0"),
        ("nvme1", 3840.0, "0000:42:00.0"),
    ]
    assert [(g.name, g.model) for g in hw.gpus] == [("gpu0", "L40S")]
    nics = {n.name: n for n in hw.nics}
    assert nics["eno1"].macs == [node.macs["eno1"]] and nics["eno2"].macs == [node.macs["eno2"]]
    assert [n.name for n in hw.nics if n.is_bmc] == ["bmc"]


async def test_modules_in_module_bays_and_bmc_ip_only_on_an_interface(store, nb_lab):
    dev = nb_lab.modules_device
    hw = await store.bmc_hardware(dev.bmc_ip)
    assert hw is not None and hw.device_name == dev.name
    assert [(d.size_gb, d.bus) for d in hw.disks] == [(960.0, "ssd")]
    assert [(g.memory_gb, g.pci_address) for g in hw.gpus] == [(80.0, "0000:81:00.0")]
    assert [n.name for n in hw.nics if n.is_bmc] == ["ipmi"]


async def test_unknown_bmc_and_mac_are_none(store, nb_lab):
    assert await store.bmc_hardware("192.0.2.254") is None
    assert await store.host_by_mac("02:ff:ff:ff:ff:fe") is None
    assert await store.host_by_name("kc-no-such-device") is None


@pytest.mark.parametrize("notation", ["colon", "dash", "dot", "bare"])
async def test_mac_lookup_in_all_four_notations(store, node, notation):
    mac = node.macs["eno2"]
    hexs = mac.replace(":", "")
    text = {
        "colon": mac.upper(),
        "dash": mac.replace(":", "-"),
        "dot": f"{hexs[0:4]}.{hexs[4:8]}.{hexs[8:12]}",
        "bare": hexs.upper(),
    }[notation]
    host = await store.host_by_mac(parse_ident(mac=text).value)
    assert host is not None and host.name == node.name
    assert host.primary_ipv4 == node.primary_ipv4 and host.oob_ip == node.bmc_ip
    assert host.platform.startswith("kc-alma-") and host.site.startswith("kc-site-")


async def test_pxe_enabled_round_trips(store, node):
    assert (await store.host_by_name(node.name)).pxe_enabled is True  # unset counts as true
    try:
        assert (await store.set_pxe_enabled(node.name, False)).pxe_enabled is False
        assert (await store.host_by_mac(node.macs["eno1"])).pxe_enabled is False
        assert (await store.set_pxe_enabled(node.name, True)).pxe_enabled is True
        assert (await store.host_by_name(node.name)).custom_fields["pxe_enabled"] is True
    finally:
        await store.set_pxe_enabled(node.name, True)
    assert await store.set_pxe_enabled("kc-no-such-device", False) is None


async def test_a_read_only_token_reads_but_its_pxe_write_is_a_clear_403(netbox_env, nb_lab, node):
    ro = NetBoxStore(netbox_env["NETBOX_URL"], nb_lab.read_only_token())
    try:
        assert (await ro.host_by_name(node.name)).name == node.name
        with pytest.raises(Forbidden) as err:
            await ro.set_pxe_enabled(node.name, False)
        assert "no write permission" in err.value.message and err.value.http_status == 403
    finally:
        await ro.close()


async def test_a_bad_token_is_a_502_naming_the_token(netbox_env, node):
    bad = NetBoxStore(netbox_env["NETBOX_URL"], "nbt_nokey.invalidtoken")
    try:
        with pytest.raises(UpstreamError) as err:
            await bad.host_by_name(node.name)
        assert "refused the token" in err.value.message and "invalidtoken" not in err.value.message
    finally:
        await bad.close()


async def test_single_flight_100_concurrent_lookups_one_netbox_lookup(store, node):
    inv = Inventory(store=store, cache=SingleFlightCache(), metrics=InventoryMetrics(CollectorRegistry()))
    before = store.calls
    hosts = await asyncio.gather(*(inv.host(parse_ident(mac=node.macs["eno1"])) for _ in range(100)))
    assert {h.name for h in hosts} == {node.name}
    # one lookup = 4 NetBox round trips (interface by MAC, device, its interfaces, its IPs)
    assert store.calls - before == 4


# -- end to end: gateway → bus → inventory → NetBox -----------------------------------------------


async def test_gateway_endpoints_return_the_device(nb_settings, serve, node):
    await serve(inventory_app(nb_settings))
    gw = await serve(gateway_app(nb_settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=30) as c:
        disks = await c.get(f"/controlnode/bmc/{node.bmc_ip}/disks")
        assert disks.status_code == 200, disks.text
        assert len(disks.json()["disks"]) == 2 and disks.json()["device_name"] == node.name
        assert {n["name"] for n in disks.json()["nics"]} == {"bmc", "eno1", "eno2"}
        gpus = await c.get(f"/controlnode/bmc/{node.bmc_ip}/gpus")
        assert gpus.status_code == 200 and [g["name"] for g in gpus.json()["gpus"]] == ["gpu0"]
        missing = await c.get("/controlnode/bmc/192.0.2.253/disks")
        assert missing.status_code == 404 and "192.0.2.253" in missing.json()["message"]


async def test_bus_host_lookup_and_pxe_write(nb_settings, serve, bus, node):
    await serve(inventory_app(nb_settings))
    subjects = bus.subjects
    hexs = node.macs["eno1"].replace(":", "")
    host = Host.model_validate(await bus.request(subjects.query("inventory", "host"), HostQuery(mac=hexs)))
    assert host.name == node.name
    try:
        raw = await bus.request(
            subjects.request("inventory", "set_pxe_enabled"),
            SetPxeEnabled(ident=node.name, enabled=False),
            timeout=30,
        )
        assert raw["pxe_enabled"] is False
        again = Host.model_validate(
            await bus.request(subjects.query("inventory", "host"), HostQuery(mac=hexs))
        )
        assert again.pxe_enabled is False  # the write invalidated the cached host
    finally:
        await bus.request(
            subjects.request("inventory", "set_pxe_enabled"),
            SetPxeEnabled(ident=node.name, enabled=True),
            timeout=30,
        )
    with pytest.raises(NotFound):
        await bus.request(subjects.query("inventory", "host"), HostQuery(mac="02:ff:ff:ff:ff:fd"))


async def test_netbox_webhook_reaches_the_receiver_and_emits_device_changed(nb_settings, serve, nb_lab, node):
    """NetBox's own rqworker signs and POSTs the change; the receiver announces it on the bus."""
    import nats

    inv = await serve(
        inventory_app(nb_settings, inventory_settings=InventorySettings(webhook_secret=WEBHOOK_SECRET))
    )
    subjects = Subjects(nb_settings.bus_prefix)
    nc = await nats.connect(nb_settings.nats_url)
    got: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(subjects.evt("inventory", "device.changed", node.name), cb=got.put)
    nb = nb_lab.nb
    hook = nb.extras.webhooks.create(
        {
            "name": f"kc-hook-{nb_lab.suffix}-{inv.url.rsplit(':', 1)[1]}",
            "payload_url": f"{inv.url}/inventory/netbox-webhook",
            "http_method": "POST",
            "http_content_type": "application/json",
            "secret": WEBHOOK_SECRET,
            "ssl_verification": False,
        }
    )
    rule = nb.extras.event_rules.create(
        {
            "name": f"kc-rule-{nb_lab.suffix}-{hook.id}",
            "object_types": ["dcim.device"],
            "event_types": ["object_updated"],
            "action_type": "webhook",
            "action_object_type": "extras.webhook",
            "action_object_id": hook.id,
            "enabled": True,
        }
    )
    try:
        dev = nb.dcim.devices.get(node.id)
        dev.update({"description": f"touched {nb_lab.suffix}"})
        try:
            msg = await asyncio.wait_for(got.get(), 60)
        except TimeoutError:
            pytest.fail(
                "no device.changed event within 60 s: is the NetBox rqworker running "
                "(netbox.sh up --with-worker)?"
            )
        data = json.loads(msg.data)["data"]
        assert data["device_id"] == node.id and data["name"] == node.name
    finally:
        rule.delete()
        hook.delete()
        await nc.close()


async def test_static_ip_is_allocated_from_the_requested_prefix_once(store, nb_lab):
    """The provisioner's ``prefix_id``: an address reserved in that NetBox prefix, idempotent per device."""
    import ipaddress
    import random

    nb = nb_lab.nb
    dev = nb_lab._new(
        nb.dcim.devices,
        {
            "name": f"kc-alloc-{nb_lab.suffix}",
            "device_type": nb_lab.dtype.id,
            "role": nb_lab.role.id,
            "site": nb_lab.site.id,
        },
    )
    net = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/29"
    prefix = nb_lab._new(nb.ipam.prefixes, {"prefix": net, "status": "active"})
    try:
        first = await store.allocate_ip(dev.name, prefix_id=prefix.id)
        assert first is not None and first.created is True
        assert ipaddress.ip_interface(first.address).ip in ipaddress.ip_network(net)
        again = await store.allocate_ip(dev.name, prefix_id=prefix.id)
        assert again is not None and again.address == first.address and again.created is False
        with pytest.raises(NotFound) as missing:
            await store.allocate_ip(dev.name, prefix_id=999_999_999)
        assert missing.value.field == "prefix_id"
    finally:
        for ip in nb.ipam.ip_addresses.filter(parent=net):
            ip.delete()
