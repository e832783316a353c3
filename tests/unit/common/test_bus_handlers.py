"""Bus handler wiring on FastStream's in-memory ``TestNatsBroker`` (no NATS server): the typed
payload reaches the handler, a malformed message or another contract type does not."""

from __future__ import annotations

import json

from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.bus.runtime import Bus
from karios.common.bus.subjects import Subjects
from karios.common.contracts.base import Event, Query
from karios.common.contracts.inventory import DeviceChanged


class Ping(Query):
    TYPE = "karios.test.unit_ping.v1"
    n: int


class Other(Event):
    TYPE = "karios.test.unit_other.v1"
    n: int


def _bus() -> Bus:
    return Bus(service="unit", servers=["nats://127.0.0.1:1"], subjects=Subjects("unit"))


def _wire(model: Query | Event) -> bytes:
    return wrap(model, source="test").model_dump_json().encode()


async def test_broadcast_handler_gets_the_typed_model_and_drops_the_rest():
    bus = _bus()
    got: list[Ping] = []

    async def on_ping(ping: Ping) -> None:
        got.append(ping)

    subject = bus.subjects.broadcast("test", "ping")
    bus.broadcast_handler(subject, Ping, on_ping)
    async with TestNatsBroker(bus.broker) as br:
        await bus.broadcast(Ping(n=7), subject)
        await br.publish(b"{not json", subject)
        await br.publish(json.dumps({"type": Ping.TYPE, "source": "x", "data": {"n": "seven"}}), subject)
        await br.publish(_wire(Other(n=1)), subject)
    assert got == [Ping(n=7)]


async def test_device_changed_handler_hears_every_entity_of_the_fact_only():
    bus = _bus()
    got: list[DeviceChanged] = []

    async def on_change(evt: DeviceChanged) -> None:
        got.append(evt)

    subject = bus.subjects.events_of_fact("inventory", "device.changed")
    bus.broadcast_handler(subject, DeviceChanged, on_change)
    change = DeviceChanged(device_id=4, name="srv-4", macs=["aa:bb:cc:00:11:22"])
    async with TestNatsBroker(bus.broker) as br:
        await br.publish(_wire(change), bus.subjects.evt("inventory", "device.changed", "srv-4"))
        await br.publish(_wire(change), bus.subjects.evt("inventory", "device.added", "srv-4"))
    assert got == [change]


async def test_query_responder_replies_with_the_result_or_a_named_field_error():
    bus = _bus()

    async def double(q: Ping) -> dict[str, int]:
        return {"n": q.n * 2}

    subject = bus.subjects.query("test", "double")
    bus.query_responder(subject, Ping, double)
    async with TestNatsBroker(bus.broker) as br:
        ok = await br.request(_wire(Ping(n=21)), subject)
        bad = await br.request(json.dumps({"type": Ping.TYPE, "data": {"n": "x"}}), subject)
    assert json.loads(ok.body) == {"ok": True, "result": {"n": 42}, "error": None}
    err = json.loads(bad.body)["error"]
    assert err["code"] == "VALIDATION_FAILED" and err["field"] == "n"
