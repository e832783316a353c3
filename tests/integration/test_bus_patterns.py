"""The bus's messaging patterns on the real JetStream server: broadcast to every replica,
ordered event subscription (from a sequence / new only), and a durable pull consumer shared
by replicas."""

from __future__ import annotations

import asyncio
import json

from karios.common.bus.consumers import StreamEvent
from karios.common.bus.envelope import Envelope
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Event, Query
from tests.fixtures.wait import wait_until


class Ping(Query):
    TYPE = "karios.test.ping.v1"
    n: int


class Tick(Event):
    TYPE = "karios.test.tick.v1"
    n: int


class Tock(Event):
    TYPE = "karios.test.tock.v1"
    n: int


async def test_broadcast_reaches_every_replica_typed_and_drops_malformed(settings):
    replicas = [Bus.from_settings(settings, "bus-test") for _ in range(2)]
    got: list[list[int]] = [[], []]
    subject = replicas[0].subjects.broadcast("test", "ping")
    for bus, seen in zip(replicas, got, strict=True):

        async def on_ping(msg: Ping, seen: list[int] = seen) -> None:
            assert isinstance(msg, Ping)
            seen.append(msg.n)

        bus.broadcast_handler(subject, Ping, on_ping)
        await bus.start()
    try:
        await replicas[0].nc.publish(subject, b"not json")  # dropped, the handler never sees it
        await replicas[0].nc.publish(subject, json.dumps({"type": Ping.TYPE, "data": {"n": "x"}}).encode())
        await replicas[0].broadcast(Ping(n=1), subject)
        await replicas[1].broadcast(Ping(n=2), subject)
        await wait_until(lambda: all(len(s) == 2 for s in got), what="both replicas to hear both pings")
        assert [sorted(s) for s in got] == [[1, 2], [1, 2]]
    finally:
        for bus in replicas:
            await bus.stop()


async def test_ordered_subscription_from_a_sequence_and_new_only(settings):
    bus = Bus.from_settings(settings, "bus-test")
    await bus.start()
    subs = []
    try:
        for n in (1, 2, 3):
            await bus.publish_event(Tick(n=n), bus.subjects.evt("test", "tick", str(n)))
        assert await bus.last_event_seq() == 3
        replayed = [ev async for ev in bus.read_events(1, 3)]
        assert [ev.seq for ev in replayed] == [2, 3]
        assert [ev.envelope().data["n"] for ev in replayed] == [2, 3]

        from_two: list[StreamEvent] = []
        new_only: list[StreamEvent] = []

        async def keep_from_two(ev: StreamEvent) -> None:
            from_two.append(ev)

        async def keep_new(ev: StreamEvent) -> None:
            new_only.append(ev)

        subs.append(await bus.subscribe_events(keep_from_two, start_seq=2))
        subs.append(await bus.subscribe_events(keep_new))
        await wait_until(lambda: len(from_two) == 2, what="the replay from sequence 2")
        await bus.publish_event(Tick(n=4), bus.subjects.evt("test", "tick", "4"))
        await wait_until(lambda: len(from_two) == 3 and len(new_only) == 1, what="the live event")
        assert [ev.seq for ev in from_two] == [2, 3, 4]
        assert [ev.seq for ev in new_only] == [4], "deliver-new must not replay stored events"
        assert new_only[0].subject == bus.subjects.evt("test", "tick", "4")
    finally:
        for sub in subs:
            await sub.stop()
        await bus.stop()


async def test_pull_consumer_is_shared_by_replicas_skips_other_types_and_retries(settings):
    replicas = [Bus.from_settings(settings, "bus-test") for _ in range(2)]
    handled: dict[int, list[str]] = {}
    failed_once: set[int] = set()
    consumers = []

    async def apply(tick: Tick, env: Envelope) -> None:
        assert isinstance(tick, Tick)
        if tick.n == 3 and tick.n not in failed_once:
            failed_once.add(tick.n)
            raise RuntimeError("database away")  # redelivered after the retry delay
        handled.setdefault(tick.n, []).append(env.id)

    try:
        for bus in replicas:
            await bus.start()
            consumers.append(
                await bus.pull_events(
                    "bus-test-ticks", bus.subjects.events_of("test"), Tick, apply, retry_delay=0.1
                )
            )
        for n in range(10):
            await replicas[0].publish_event(Tick(n=n), replicas[0].subjects.evt("test", "tick", str(n)))
            await replicas[0].publish_event(Tock(n=n), replicas[0].subjects.evt("test", "tock", str(n)))

        async def drained() -> bool:
            info = await replicas[0].js.consumer_info(replicas[0].subjects.evt_stream, "bus-test-ticks")
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_until(drained, timeout=15, what="every event acked")
        assert sorted(handled) == list(range(10)), "every Tick handled, no Tock"
        assert all(len(ids) == 1 for ids in handled.values()), "each event handled by one replica, once"
        assert failed_once == {3}
        assert await replicas[0].healthy()
        await replicas[0].js.delete_consumer(replicas[0].subjects.evt_stream, "bus-test-ticks")
        assert not await replicas[0].healthy(), "a deleted durable must show as unhealthy"
    finally:
        for c in consumers:
            await c.stop()
        for bus in replicas:
            await bus.stop()


async def test_pull_consumer_many_hands_over_a_fetch_at_once_and_redelivers_it_whole(settings):
    """``many=True`` (the gateway's read model: one transaction per fetch): the handler gets a
    fetch's events of its type in stream order, they are acked when it returns; when it raises,
    every event of that fetch comes back (none half-applied, none lost)."""
    bus = Bus.from_settings(settings, "bus-test-many")
    batches: list[list[int]] = []
    failed: list[list[int]] = []

    async def apply(envs: list[Envelope]) -> None:
        ticks = [e.data.n for e in envs]
        assert all(isinstance(e.data, Tick) for e in envs)
        assert [e.stream_seq for e in envs] == sorted(e.stream_seq for e in envs)
        if 3 in ticks and not failed:
            failed.append(ticks)
            raise RuntimeError("database away")
        batches.append(ticks)

    consumer = None
    try:
        await bus.start()
        for n in range(20):  # stored before the consumer starts: its first fetches are full
            await bus.publish_event(Tick(n=n), bus.subjects.evt("test", "tick", str(n)))
            await bus.publish_event(Tock(n=n), bus.subjects.evt("test", "tock", str(n)))
        consumer = await bus.pull_events(
            "bus-test-many", bus.subjects.events_of("test"), Tick, apply, many=True, batch=8, retry_delay=0.1
        )

        async def drained() -> bool:
            info = await bus.js.consumer_info(bus.subjects.evt_stream, "bus-test-many")
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_until(drained, timeout=15, what="every event acked")
        handled = sorted(n for b in batches for n in b)
        assert handled == list(range(20)), "every Tick applied once, no Tock"
        assert max(len(b) for b in batches) > 1, batches  # a fetch at once, not one by one
        assert len(failed) == 1 and set(failed[0]) <= set(handled)  # the failed fetch came back whole
    finally:
        if consumer is not None:
            await consumer.stop()
        await bus.stop()


async def test_handlers_take_no_thread_hop_per_message(settings, monkeypatch):
    """Every handler kind — query responder, broadcast, command — gets its message without
    FastStream resolving a Context parameter: fast_depends runs that synchronous resolver in a
    worker thread (``anyio.to_thread.run_sync``) for every message, which cost ~260 µs of CPU per
    request/reply. The burst below must start no worker thread at all, and every message is
    still handled, answered and acked."""
    import anyio.to_thread

    from karios.common.contracts.base import Command

    class Bump(Command):
        TYPE = "karios.test.bump-nothread.v1"
        n: int

    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def counting(func, *args, **kwargs):  # type: ignore[no-untyped-def]
        inner = getattr(func, "func", func)  # a functools.partial: what it calls
        hops.append(getattr(inner, "__qualname__", type(inner).__name__))
        return await real(func, *args, **kwargs)

    bus = Bus.from_settings(settings, "bus-test")
    subject = bus.subjects.query("test", "ping")
    heard: list[int] = []
    bumped: list[int] = []

    async def answer(q: Ping) -> dict:
        return {"n": q.n + 1}

    async def on_ping(msg: Ping) -> None:
        heard.append(msg.n)

    async def on_bump(cmd: Bump, ctx) -> None:  # type: ignore[no-untyped-def]
        bumped.append(cmd.n)

    bus.query_responder(subject, Ping, answer, max_workers=4)
    bus.broadcast_handler(bus.subjects.broadcast("test", "ping"), Ping, on_ping)
    bus.command_handler("test", Bump, on_bump, durable="bus-test-nothread")
    await bus.start()
    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    try:
        answers = await asyncio.gather(*(bus.request(subject, Ping(n=n)) for n in range(50)))
        assert [a["n"] for a in answers] == [n + 1 for n in range(50)]
        for n in range(5):
            await bus.broadcast(Ping(n=n), bus.subjects.broadcast("test", "ping"))
            await bus.send_command(Bump(n=n), bus.subjects.cmd("test", "bump"))
        await wait_until(lambda: len(heard) == 5 and len(bumped) == 5, what="the broadcasts and commands")
        assert sorted(heard) == sorted(bumped) == list(range(5))
        info = await bus.js.consumer_info(bus.subjects.cmd_stream, "bus-test-nothread")
        assert info.num_ack_pending == 0 and info.num_pending == 0, info  # every command acked
        assert hops == [], f"{len(hops)} worker-thread hops: {sorted(set(hops))}"
    finally:
        await bus.stop()
