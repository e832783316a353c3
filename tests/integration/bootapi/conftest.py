"""A tiny real inventory on the bus (fixed host table) and bootapi served by uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from karios.bootapi.app import create_app
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import HostQuery, SetPxeEnabled
from tests.fixtures.bootapi import FakeInventory, boot_settings
from tests.fixtures.bootapi_hosts import FixedHosts


@pytest.fixture
async def inventory(settings) -> AsyncIterator[FakeInventory]:
    bus = Bus.from_settings(settings, "inventory")
    inv = FakeInventory(bus, FixedHosts())
    bus.query_responder(bus.subjects.query("inventory", "host"), HostQuery, inv.host)
    bus.query_responder(bus.subjects.request("inventory", "set_pxe_enabled"), SetPxeEnabled, inv.set_pxe)
    await bus.start()
    yield inv
    await bus.stop()


@pytest.fixture
async def bootapi(settings, inventory, serve):
    settings.request_timeout = 1.0
    return await serve(create_app(settings, boot_settings()))
