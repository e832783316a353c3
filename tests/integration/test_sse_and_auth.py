"""SSE resume with Last-Event-ID, channel filtering, and operator authentication."""

from __future__ import annotations

import asyncio

import httpx
import sqlalchemy as sa

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token, revoke_token
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import NodeRegistered
from tests.fixtures.apps import ADMIN
from tests.fixtures.sse import open_sse, read_sse
from tests.fixtures.wait import wait_until


async def publish(bus: Bus, i: int, bmc: str = "10.0.0.1") -> None:
    await bus.publish_event(
        NodeRegistered(bmc_ip=bmc, created=True, hostname=f"n{i}"),
        bus.subjects.evt("inventory", "node.registered", bmc),
        entity=bmc,
    )


async def test_last_event_id_resumes_with_no_gap_and_no_duplicate(settings, serve):
    gw = await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            async with open_sse(c, "/controlnode/events") as stream:
                for i in range(5):
                    await publish(bus, i)
                got = await stream.collect(2)  # the client reads two then disconnects
            assert [e.json()["data"]["hostname"] for e in got] == ["n0", "n1"]
            last_id = got[-1].id
            assert last_id is not None
            for i in range(5, 8):
                await publish(bus, i)
            resumed = await read_sse(c, "/controlnode/events", 6, headers={"Last-Event-ID": last_id})
            names = [e.json()["data"]["hostname"] for e in resumed]
            assert names == ["n2", "n3", "n4", "n5", "n6", "n7"]
            ids = [int(e.id or 0) for e in resumed]
            assert ids == sorted(ids) and len(set(ids)) == 6 and ids[0] == int(last_id) + 1
    finally:
        await bus.stop()


async def test_channel_filter_only_delivers_matching_events(settings, serve):
    gw = await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            async with open_sse(c, "/controlnode/events?channel=node:10.0.0.2") as stream:
                await publish(bus, 1, bmc="10.0.0.1")
                await publish(bus, 2, bmc="10.0.0.2")
                [ev] = await stream.collect(1)
            assert ev.json()["data"]["bmc_ip"] == "10.0.0.2"
            r = await c.get("/controlnode/events?channel=bogus", headers=ADMIN)
            assert r.status_code == 422 and r.json()["field"] == "channel"
    finally:
        await bus.stop()


async def test_tokens_401_without_or_with_bad_token_403_with_too_low_role(settings, serve):
    app = gateway_app(settings)
    gw = await serve(app)
    viewer = await create_token(app.state.runtime.db, "ui-viewer", Role.viewer)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.post("/controlnode/register", json={"bmc_ip": "10.0.0.1"})
        assert r.status_code == 401
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": "10.0.0.1"},
            headers={"Authorization": "Bearer kt_not-a-real-token"},
        )
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": "10.0.0.1"},
            headers={"Authorization": f"Bearer {viewer}"},
        )
        assert r.status_code == 403 and "operator" in r.json()["message"]
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"] == {
            "bus": True,
            "database": True,
            "storage": True,
            "outbox": True,
        }
        assert (await c.get("/metrics")).status_code == 200


async def test_slow_client_is_told_to_reconnect(settings, serve):
    settings.sse_queue_size = 3
    app = gateway_app(settings)
    await serve(app)
    relay = app.state.relay
    gen = relay.stream(None, None)
    assert (await gen.__anext__()).startswith(b"retry:")  # the client is registered by now
    [client] = list(relay.clients)
    waiter = asyncio.create_task(gen.__anext__())  # waits for the first event
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        for i in range(10):
            await publish(bus, i)
        first = await asyncio.wait_for(waiter, 5)
        assert first.startswith(b"id: ")
        await wait_until(lambda: client.overflowed, what="the slow client's queue to overflow")
        assert len(client.pending) <= 3
        rest = [await asyncio.wait_for(gen.__anext__(), 5)]
        assert rest[0].startswith(b"event: reconnect")
    finally:
        await gen.aclose()
        await bus.stop()
    assert not relay.clients


async def test_access_token_in_the_query_string_only_opens_the_event_stream(settings, serve):
    gw = await serve(gateway_app(settings))
    token = ADMIN["Authorization"].removeprefix("Bearer ")
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.get(f"/controlnode/job/nope?access_token={token}")
        assert r.status_code == 401 and "only accepted by /controlnode/events" in r.json()["message"]
        r = await c.post(f"/controlnode/register?access_token={token}", json={"bmc_ip": "10.0.0.1"})
        assert r.status_code == 401
        assert (await c.get("/controlnode/job/nope", headers=ADMIN)).status_code == 404
        async with c.stream("GET", f"/controlnode/events?access_token={token}") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async with c.stream("GET", "/controlnode/events?access_token=kt_wrong") as r:
            assert r.status_code == 401


async def test_token_changes_reach_every_gateway_replica_at_once(settings, serve):
    """Tokens are cached (30 s TTL) per replica; a revocation is broadcast to all of them."""
    first, second = gateway_app(settings), gateway_app(settings)
    replicas = [await serve(first), await serve(second)]
    db = first.state.runtime.db
    viewer = {"Authorization": f"Bearer {await create_token(db, 'ui-cached', Role.viewer)}"}
    other = {"Authorization": f"Bearer {await create_token(db, 'ui-revoked', Role.viewer)}"}
    async with httpx.AsyncClient(timeout=10) as c:

        async def statuses(headers: dict[str, str]) -> list[int]:
            return [
                (await c.get(f"{g.url}/controlnode/job/nope", headers=headers)).status_code for g in replicas
            ]

        assert await statuses(viewer) == [404, 404] and await statuses(other) == [404, 404]
        # Revoked behind the gateways' back (no broadcast): the cache still answers.
        async with db.session() as s, s.begin():
            await s.execute(sa.text("UPDATE gateway.api_tokens SET revoked = true WHERE name = 'ui-cached'"))
        assert await statuses(viewer) == [404, 404]
        # Revoked the supported way: every replica refuses it at once, long before the TTL.
        await revoke_token(db, "ui-revoked", bus=first.state.runtime.bus)
        await wait_until(
            lambda: _all_401(statuses(other)), timeout=3, what="both replicas to drop the revoked token"
        )
        assert await statuses(viewer) == [404, 404]  # only the revoked name was dropped


async def _all_401(pending) -> bool:  # type: ignore[no-untyped-def]
    return await pending == [401, 401]


async def test_clients_sharing_a_filter_share_one_group_and_see_only_their_channel(settings, serve):
    """The relay tests each distinct channel filter once per event, not once per client."""
    app = gateway_app(settings)
    gw = await serve(app)
    relay = app.state.relay
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=10) as c,
            open_sse(c, "/controlnode/events?channel=node:10.0.0.1") as one_a,
            open_sse(c, "/controlnode/events?channel=node:10.0.0.1") as one_b,
            open_sse(c, "/controlnode/events?channel=node:10.0.0.2") as two,
            open_sse(c, "/controlnode/events") as every,
        ):
            assert len(relay.clients) == 4
            assert sorted(len(g) for g in relay.groups.values()) == [1, 1, 2]
            await publish(bus, 1, bmc="10.0.0.1")
            await publish(bus, 2, bmc="10.0.0.2")
            await publish(bus, 3, bmc="10.0.0.1")
            everything = await every.collect(3)
            assert [e.json()["data"]["bmc_ip"] for e in everything] == ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
            for stream in (one_a, one_b):
                got = await stream.collect(2)
                assert [e.json()["data"]["hostname"] for e in got] == ["n1", "n3"]
            [only] = await two.collect(1)
            assert only.json()["data"]["hostname"] == "n2"
            await asyncio.sleep(0.2)  # nothing else arrives for the filtered clients
            assert len(one_a.events) == 2 and len(two.events) == 1
        await wait_until(lambda: not relay.clients, what="the relay to drop the closed streams")
        assert relay.groups == {}
    finally:
        await bus.stop()


async def test_idle_stream_gets_keepalives_and_a_client_that_leaves_is_dropped(settings, serve):
    settings.sse_keepalive = 0.2
    app = gateway_app(settings)
    gw = await serve(app)
    relay = app.state.relay
    async with (
        httpx.AsyncClient(base_url=gw.url, timeout=10) as c,
        c.stream("GET", "/controlnode/events", headers=ADMIN) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        lines: list[str] = []

        async def until_keepalives(n: int) -> None:
            async for line in r.aiter_lines():
                lines.append(line)
                if lines.count(": keep-alive") >= n:
                    return

        await asyncio.wait_for(until_keepalives(2), 5)
        assert lines[:2] == ["retry: 2000", ": connected"]
        assert len(relay.clients) == 1
    # The client closed its connection: the gateway notices and forgets it.
    await wait_until(lambda: not relay.clients, what="the relay to drop the client that left")


async def test_last_event_id_resumes_on_another_gateway_replica(settings, serve):
    """The id is the stream's sequence, not a replica's counter: any replica resumes it."""
    first, second = await serve(gateway_app(settings)), await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            async with open_sse(c, f"{first.url}/controlnode/events") as stream:
                for i in range(4):
                    await publish(bus, i)
                got = await stream.collect(2)
            last_id = got[-1].id
            assert last_id is not None
            await publish(bus, 4)
            resumed = await read_sse(
                c, f"{second.url}/controlnode/events", 3, headers={"Last-Event-ID": last_id}
            )
            assert [e.json()["data"]["hostname"] for e in resumed] == ["n2", "n3", "n4"]
            assert [int(e.id or 0) for e in resumed] == [int(last_id) + k for k in (1, 2, 3)]
    finally:
        await bus.stop()
