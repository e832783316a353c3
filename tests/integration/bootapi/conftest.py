"""A tiny real inventory on the bus (fixed host table) and bootapi served by uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from karios.bootapi.app import create_app
from karios.bootapi.settings import BootapiSettings
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import DeviceChanged, Host, HostQuery, SetPxeEnabled
from karios.common.errors import NotFound, UpstreamError
from tests.unit.bootapi.fakes import FixedHosts

TOKEN = "it-provision-token-4f9a"


@dataclass
class FakeInventory:
    """Answers ``q.inventory.host`` and ``req.inventory.set_pxe_enabled`` from a fixed table."""

    bus: Bus
    table: FixedHosts
    broken: bool = False
    lookups: int = 0

    async def host(self, q: HostQuery) -> Host:
        self.lookups += 1
        if self.broken:
            raise UpstreamError("netbox: 503 Service Unavailable")
        host = await (self.table.by_mac(q.mac) if q.mac else self.table.by_name(q.name or ""))
        if host is None:
            raise NotFound(f"no device with {'MAC ' + q.mac if q.mac else 'name ' + str(q.name)}")
        return host

    async def set_pxe(self, cmd: SetPxeEnabled) -> dict:
        if self.broken:
            raise UpstreamError("netbox: token lacks write scope")
        await self.table.set_pxe_enabled(cmd.ident, cmd.enabled)
        return {"ident": cmd.ident, "pxe_enabled": cmd.enabled}

    async def changed(self, host: Host) -> None:
        macs = [m for i in host.interfaces for m in i.macs]
        await self.bus.publish_event(
            DeviceChanged(device_id=host.id, name=host.name, macs=macs),
            self.bus.subjects.evt("inventory", "device.changed", host.name),
            entity=host.name,
        )


@pytest.fixture
async def inventory(settings) -> AsyncIterator[FakeInventory]:
    bus = Bus.from_settings(settings, "inventory")
    inv = FakeInventory(bus, FixedHosts())
    bus.query_responder(bus.subjects.query("inventory", "host"), HostQuery, inv.host)
    bus.query_responder(bus.subjects.request("inventory", "set_pxe_enabled"), SetPxeEnabled, inv.set_pxe)
    await bus.start()
    yield inv
    await bus.stop()


def boot_settings(**kw) -> BootapiSettings:
    return BootapiSettings(_env_file=None, **{"provision_token": TOKEN, **kw})  # type: ignore[call-arg]


@pytest.fixture
async def bootapi(settings, inventory, serve):
    settings.request_timeout = 1.0
    return await serve(create_app(settings, boot_settings()))
