"""The SSE relay relays every stored event once and in order when its live consumer misbehaves
(real NATS): a consumer deleted on the server, a consumer that skips events, one that redelivers."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from karios.api_gateway.events import EventRelay, SSEClient
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import NodeRegistered
from tests.fixtures.wait import wait_until


async def publish(bus: Bus, i: int) -> None:
    bmc = "10.0.0.1"
    await bus.publish_event(
        NodeRegistered(bmc_ip=bmc, created=True, hostname=f"n{i}"),
        bus.subjects.evt("inventory", "node.registered", bmc),
        entity=bmc,
    )


def seqs(client: SSEClient) -> list[int]:
    return [ev.seq for ev in client.pending]


async def started(settings, watchdog_every: float = 60.0) -> tuple[Bus, EventRelay]:  # type: ignore[no-untyped-def]
    bus = Bus.from_settings(settings, "test-relay")
    await bus.start()
    relay = EventRelay(bus, CollectorRegistry(), watchdog_every=watchdog_every)
    await relay.start()
    return bus, relay


async def test_a_consumer_deleted_on_the_server_is_replaced_with_no_gap(settings):
    bus, relay = await started(settings, watchdog_every=0.2)
    client = relay.open(None)
    try:
        for i in range(3):
            await publish(bus, i)
        await wait_until(lambda: len(client.pending) == 3, what="the first 3 events")
        stream = bus.subjects.evt_stream
        names = [c.name for c in await bus.js.consumers_info(stream)]
        assert names, "the relay's consumer"
        for name in names:
            await bus.js.delete_consumer(stream, name)
        for i in range(3, 8):
            await publish(bus, i)
        # nats-py alone notices a deleted ordered consumer after two missed 5 s heartbeats (>= 10 s).
        await wait_until(lambda: len(client.pending) >= 8, timeout=5, what="the 5 events after the deletion")
        first = client.pending[0].seq
        assert seqs(client) == list(range(first, first + 8))
        # The events are relayed before the new consumer is subscribed and the restart counted.
        restarts = "karios_sse_consumer_restarts_total"
        await wait_until(lambda: relay.registry.get_sample_value(restarts), timeout=5, what="the restart")
        assert relay.registry.get_sample_value(restarts) == 1
        await publish(bus, 8)  # the new consumer relays live events
        await wait_until(lambda: len(client.pending) == 9, what="a live event on the new consumer")
        assert seqs(client) == list(range(first, first + 9))
    finally:
        relay.close(client)
        await relay.stop()
        await bus.stop()


async def test_events_the_consumer_skipped_are_read_back_and_redeliveries_dropped(settings):
    bus, relay = await started(settings)
    client = relay.open(None)
    try:
        await publish(bus, 0)
        await wait_until(lambda: len(client.pending) == 1, what="the first event")
        first = client.pending[0].seq
        # A consumer that loses events 2-4 (as nats-py's does when it drops a message and
        # resets): the live consumer stops, and a new one hands the relay event 5 next.
        assert relay._sub is not None
        await relay._sub.stop()
        for i in range(1, 5):
            await publish(bus, i)
        skipping = await bus.subscribe_events(relay._on_live, start_seq=first + 4)
        # ...and one that redelivers everything from the start (a reset to an older sequence).
        replaying = await bus.subscribe_events(relay._on_live, start_seq=first)
        try:
            await wait_until(lambda: len(client.pending) >= 5, what="the skipped events")
            await publish(bus, 5)
            await wait_until(lambda: len(client.pending) >= 6, what="the next live event")
            await asyncio.sleep(0.3)  # the replaying consumer's copies: none may reach the client
            assert seqs(client) == list(range(first, first + 6))
            assert relay.registry.get_sample_value("karios_sse_events_recovered_total") == 3
        finally:
            await skipping.stop()
            await replaying.stop()
    finally:
        relay.close(client)
        await relay.stop()
        await bus.stop()
