"""The inventory's bus handlers on FastStream's in-memory broker (no NATS, no database): the
demo file inventory answers typed queries, a bad query is a 422 naming the field, and a
``DeviceChanged`` broadcast drops the cached host."""

from __future__ import annotations

import json

from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Contract, Reply
from karios.common.contracts.inventory import DeviceChanged, HostQuery
from karios.common.settings import KariosSettings
from karios.inventory.app import create_app
from karios.inventory.lookups import Inventory

SETTINGS = KariosSettings(
    _env_file=None,  # type: ignore[call-arg]
    dev_mode=True,
    nats_url="nats://127.0.0.1:1",
    bus_prefix="unit",
    log_json=False,
)


def _app() -> tuple[Bus, Inventory]:
    """The inventory app on the demo file inventory (its lifespan, NATS and the database unused)."""
    app = create_app(SETTINGS.model_copy(update={"inventory_file": None}))
    return app.state.runtime.bus, app.state.inventory


def _wire(payload: Contract) -> str:
    return wrap(payload, source="test").model_dump_json()


async def test_host_query_by_any_mac_notation_is_answered_from_the_file_inventory():
    bus, _inventory = _app()
    subject = bus.subjects.query("inventory", "host")
    async with TestNatsBroker(bus.broker) as br:
        msg = await br.request(_wire(HostQuery(mac="D0-8E-79-00-01-01")), subject)
        bad = await br.request(json.dumps({"data": {"mac": 12}}), subject)
    reply = Reply.model_validate_json(msg.body)
    assert reply.ok and reply.result["name"] == "node-01"
    err = Reply.model_validate_json(bad.body).error
    assert err is not None and err.code == "VALIDATION_FAILED" and err.field == "mac"


async def test_device_changed_broadcast_drops_the_cached_host():
    bus, inventory = _app()
    subject = bus.subjects.query("inventory", "host")
    async with TestNatsBroker(bus.broker) as br:
        await br.request(_wire(HostQuery(name="node-02")), subject)
        assert inventory.cache.peek("name:node-02") is not None
        change = DeviceChanged(device_id=2, name="node-02")
        await br.publish(
            _wire(change),
            bus.subjects.evt("inventory", "device.changed", "node-02"),
        )
    assert inventory.cache.peek("name:node-02") is None
