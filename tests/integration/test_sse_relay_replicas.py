"""Every SSE client gets every event after the point it joined, once and in order, on every gateway
replica (real NATS): two relays on one stream while their consumers are reset, deleted and their
connections dropped, and a client that loses its gateway before its first event resumes on the
other replica from the id of its first frame."""

from __future__ import annotations

import contextlib

import httpx
import pytest
from prometheus_client import CollectorRegistry

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.events import EventRelay, SSEClient
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import NodeRegistered
from tests.fixtures.sse import open_sse
from tests.fixtures.wait import wait_until


async def publish(bus: Bus, i: int, bmc: str = "10.0.0.1") -> None:
    await bus.publish_event(
        NodeRegistered(bmc_ip=bmc, created=True, hostname=f"n{i}"),
        bus.subjects.evt("inventory", "node.registered", bmc),
        entity=bmc,
    )


async def test_a_client_that_drops_before_its_first_event_resumes_on_another_replica(settings, serve):
    """A UI connected to one replica, nothing matched its filter yet, and the replica went away: it
    reconnects (as EventSource does, with the last id it was given) to the other replica and gets
    exactly what was published meanwhile. With no id in the first frame it would reconnect with no
    ``Last-Event-ID`` and never learn of those events."""
    first_app = gateway_app(settings)
    first, second = await serve(first_app), await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    url = "/controlnode/events?channel=node:10.0.0.9"
    try:
        for i in range(3):  # another node's events: not for this client
            await publish(bus, i)
        last = await bus.last_event_seq()
        await wait_until(lambda: first_app.state.relay.last_seq == last, what="the relay at the stream's end")
        async with httpx.AsyncClient(timeout=10) as c:
            async with open_sse(c, f"{first.url}{url}") as stream:
                joined = stream.joined
            assert joined == str(last), f"the first frame's id: {joined!r}, the stream's last: {last}"
            for i in (10, 11):  # while the client is away
                await publish(bus, i, bmc="10.0.0.9")
            await publish(bus, 12)
            async with open_sse(c, f"{second.url}{url}", headers={"Last-Event-ID": joined}) as resumed:
                await publish(bus, 13, bmc="10.0.0.9")  # live, after the replay
                events = await resumed.collect(3)
            assert [e.json()["data"]["hostname"] for e in events] == ["n10", "n11", "n13"]
            assert [int(e.id or 0) for e in events] == [last + 1, last + 2, last + 4]
    finally:
        await bus.stop()


# -- two relays on one stream, their consumers misbehaving -------------------------------------


async def reset_consumer(relay: EventRelay) -> None:
    """What nats-py's ordered consumer does by itself after a gap or two missed heartbeats: a new
    consumer on a new inbox, from the last sequence it received (nats-py internals)."""
    assert relay._sub is not None
    jsi = relay._sub._sub._sub._jsi
    await jsi.reset_ordered_consumer(jsi._sseq + 1)


async def delete_consumer(relay: EventRelay) -> None:
    """The consumer deleted on the server (a NATS restart without its state, an operator)."""
    assert relay._sub is not None
    with contextlib.suppress(Exception):  # already replaced by a reset
        await relay.bus.js.delete_consumer(relay.bus.subjects.evt_stream, relay._sub._sub._consumer)


async def drop_connection(relay: EventRelay) -> None:
    """The gateway's TCP connection to NATS cut: nats-py reconnects (nats-py internals)."""
    relay.bus.nc._transport._io_writer.transport.abort()


FAULTS = (reset_consumer, delete_consumer, drop_connection)


@pytest.mark.slow
async def test_two_relays_give_every_client_every_event_once_in_order_through_faults(settings):
    publisher = Bus.from_settings(settings, "test-publisher")
    await publisher.start()
    buses = [Bus.from_settings(settings, f"test-gateway-{k}") for k in range(2)]
    relays = [EventRelay(bus, CollectorRegistry(), watchdog_every=0.3) for bus in buses]
    clients: list[tuple[int, EventRelay, SSEClient]] = []  # (joined, relay, client)

    def join(relay: EventRelay) -> None:
        joined = relay.last_seq  # the client receives every event after this one
        clients.append((joined, relay, relay.open(None)))

    try:
        for bus, relay in zip(buses, relays, strict=True):
            await bus.start()
            await relay.start()
            join(relay)
        n = 0
        for round_ in range(9):  # each fault three times, on alternating replicas
            for _ in range(10):
                await publish(publisher, n)
                n += 1
            fault, relay = FAULTS[round_ % 3], relays[round_ % 2]
            await fault(relay)
            for _ in range(10):  # events keep coming while the replica recovers
                await publish(publisher, n)
                n += 1
            for r in relays:  # clients joining mid-stream, on both replicas
                join(r)
            stored = await publisher.last_event_seq()
            await wait_until(
                lambda r=relay, s=stored: r.last_seq >= s, timeout=20, what=f"recovery from {fault.__name__}"
            )
        last = await publisher.last_event_seq()

        def behind() -> list[tuple[int, int]]:
            return [
                (joined, c.pending[-1].seq if c.pending else joined)
                for joined, _r, c in clients
                if (c.pending[-1].seq if c.pending else joined) < last
            ]

        await wait_until(lambda: not behind(), timeout=30, what="every client at the stream's end")
        for joined, relay, client in clients:
            got = [ev.seq for ev in client.pending]
            replica = relays.index(relay)
            assert got == list(range(joined + 1, last + 1)), (
                f"replica {replica}, client joined after {joined}: missing "
                f"{sorted(set(range(joined + 1, last + 1)) - set(got))[:10]}, "
                f"duplicated {len(got) - len(set(got))}, in order {got == sorted(got)}"
            )
        assert len(clients) == 2 + 9 * 2
    finally:
        for relay in relays:
            await relay.stop()
        for bus in buses:
            await bus.stop()
        await publisher.stop()
