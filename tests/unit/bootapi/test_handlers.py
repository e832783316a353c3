"""bootapi's bus wiring on FastStream's in-memory broker (no NATS): an iPXE request looks the host
up over the bus once (then from the cache), and a ``DeviceChanged`` broadcast drops it so the next
request sees the re-imaged host."""

from __future__ import annotations

from faststream.nats import TestNatsBroker

from karios.bootapi.app import create_app
from karios.common.bus.envelope import wrap
from karios.common.contracts.inventory import DeviceChanged, HostQuery
from karios.common.settings import KariosSettings
from tests.fixtures.bootapi import FakeInventory, boot_settings
from tests.fixtures.bootapi_hosts import FixedHosts

SETTINGS = KariosSettings(
    _env_file=None,  # type: ignore[call-arg]
    dev_mode=True,
    nats_url="nats://127.0.0.1:1",
    bus_prefix="unit",
    log_json=False,
)
MAC = "52:54:00:aa:00:11"


async def test_ipxe_lookup_is_one_bus_query_and_device_changed_drops_the_cached_host():
    app = create_app(SETTINGS, boot_settings())
    bus, server = app.state.runtime.bus, app.state.server
    inventory = FakeInventory(bus, FixedHosts())
    bus.query_responder(bus.subjects.query("inventory", "host"), HostQuery, inventory.host)
    async with TestNatsBroker(bus.broker) as br:
        assert "installs almalinux-9" in await server.ipxe_script(MAC)
        assert "installs almalinux-9" in await server.ipxe_script("52-54-00-AA-00-11")
        assert inventory.lookups == 1, "the second request is served from the cache"

        host = inventory.table.hosts["node-a1.lab.example"]
        host.platform = "debian-12"  # re-imaged as Debian in the inventory
        change = DeviceChanged(device_id=host.id, name=host.name)
        subject = bus.subjects.evt("inventory", "device.changed", host.name)
        await br.publish(wrap(change, source="inventory").model_dump_json(), subject)
        assert "installs debian-12" in await server.ipxe_script(MAC)
        assert inventory.lookups == 2


async def test_an_unknown_mac_is_one_bus_query_and_gets_the_fallback_script():
    app = create_app(SETTINGS, boot_settings())
    bus, server = app.state.runtime.bus, app.state.server
    inventory = FakeInventory(bus, FixedHosts())
    bus.query_responder(bus.subjects.query("inventory", "host"), HostQuery, inventory.host)
    async with TestNatsBroker(bus.broker):
        script = await server.ipxe_script("52:54:00:00:00:99")
        again = await server.ipxe_script("52:54:00:00:00:99")
    assert script.startswith("#!ipxe") and "installs" not in script
    assert again == script and inventory.lookups == 1, "the miss is cached (negative TTL)"
