"""The pieces of the gateway's fast reads (``karios.api_gateway.fastpath``) that need no server:

- the read cache answers a fast reader with the kept bytes, or the bytes of the load in flight,
  or None (then the route asks and answers, errors included);
- a read after an invalidation (a write) never joins a load that began before it;
- the Bearer header is read as the route reads it, anything else is left to the route (which
  request targets the fast path answers is learnt from the routes themselves: the integration
  test ``tests/integration/test_gateway_fastpath.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from karios.api_gateway.fastpath import bearer_token
from karios.api_gateway.readcache import ReadCache
from tests.unit.gateway.test_read_cache import Source


def SnapshotSource() -> Source:
    """A read that takes the state when it starts and answers it when the gate opens."""
    return Source(snapshot=True)


async def test_a_fast_reader_gets_the_kept_bytes_or_joins_the_load_in_flight():
    src, cache = SnapshotSource(), ReadCache(ttl=60)
    assert cache.kept("k") is None and await cache.joined("k") is None  # nothing: the route asks
    src.gate.clear()
    route = asyncio.create_task(cache.response("k", src.read))
    await asyncio.sleep(0.01)
    assert cache.kept("k") is None
    joiner = asyncio.create_task(cache.joined("k"))
    await asyncio.sleep(0.01)
    assert not joiner.done()
    src.gate.set()
    assert await joiner == (await route).body == b'{"value":0}'
    assert cache.kept("k") == b'{"value":0}' and src.reads == 1


async def test_a_failed_load_gives_a_joiner_none_and_is_not_kept():
    src, cache = SnapshotSource(), ReadCache(ttl=60)
    src.gate.clear()
    src.fail = True
    route = asyncio.create_task(cache.response("k", src.read))
    await asyncio.sleep(0.01)
    joiner = asyncio.create_task(cache.joined("k"))
    src.gate.set()
    with pytest.raises(RuntimeError):
        await route
    assert await joiner is None
    assert cache.kept("k") is None


async def test_a_read_after_an_invalidation_does_not_join_an_older_load():
    src, cache = SnapshotSource(), ReadCache(ttl=60)
    src.gate.clear()
    before = asyncio.create_task(cache.get("k", src.read))  # began before the write
    await asyncio.sleep(0.01)
    cache.invalidate()  # the write (InvalidateOnWrite), then its change:
    src.value = 5
    assert await cache.joined("k") is None
    after = asyncio.create_task(cache.get("k", src.read))
    await asyncio.sleep(0.01)
    src.gate.set()
    assert await before == {"value": 0}
    assert await after == {"value": 5}  # its own load: the write is visible
    assert src.reads == 2
    assert await cache.get("k", src.read) == {"value": 5} and src.reads == 2  # and it is kept


def scope(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "headers": list(headers)}


def test_the_bearer_token_is_read_as_fastapis_httpbearer_reads_it():
    assert bearer_token(scope((b"authorization", b"Bearer kt_a"))) == "kt_a"
    assert bearer_token(scope((b"authorization", b"bearer   kt_a  "))) == "kt_a"
    assert (
        bearer_token(scope((b"authorization", b"Bearer kt_a"), (b"authorization", b"Bearer kt_b"))) == "kt_a"
    )
    assert bearer_token(scope((b"authorization", b"Basic kt_a"))) is None
    assert bearer_token(scope((b"authorization", b"Bearer"))) is None
    assert bearer_token(scope((b"cookie", b"karios_console=kt_a"))) is None
    # a request body goes through the route (its body limit answers an oversized one)
    assert bearer_token(scope((b"authorization", b"Bearer kt_a"), (b"content-length", b"5"))) is None
    assert bearer_token(scope((b"authorization", b"Bearer kt_a"), (b"transfer-encoding", b"chunked"))) is None
    assert bearer_token(scope((b"authorization", b"Bearer kt_a"), (b"content-length", b"0"))) == "kt_a"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_read_past_half_the_ttl_renews_the_answer_in_the_background():
    src, clock = SnapshotSource(), Clock()
    cache = ReadCache(ttl=1.0, refresh_after=0.5, clock=clock)
    assert await cache.get("k", src.read) == {"value": 0}
    src.value = 1
    clock.now += 0.4
    assert cache.kept("k") == {"value": 0} and src.reads == 1  # young: no reload
    src.gate.clear()
    clock.now += 0.2
    assert cache.kept("k") == {"value": 0}  # old: answered at once, and reloaded
    assert cache.kept("k") == {"value": 0}  # one reload, not one per reader
    await asyncio.sleep(0.01)
    assert src.reads == 2
    clock.now += 0.3  # the reload is slow: the kept answer still serves within its TTL
    assert await cache.get("k", src.read) == {"value": 0}
    src.gate.set()
    await asyncio.sleep(0.01)
    assert cache.kept("k") == {"value": 1} and src.reads == 2  # renewed before it expired
    clock.now += 0.9  # the renewed answer's own TTL counts from its load
    assert cache.kept("k") == {"value": 1}


async def test_a_failed_renewal_keeps_the_answer_only_until_its_ttl():
    src, clock = SnapshotSource(), Clock()
    cache = ReadCache(ttl=1.0, refresh_after=0.5, clock=clock)
    await cache.get("k", src.read)
    src.fail = True
    clock.now += 0.6
    assert cache.kept("k") == {"value": 0}
    await asyncio.sleep(0.01)
    assert src.reads == 2
    clock.now += 0.5
    assert cache.kept("k") is None  # expired: the route asks and answers the error
    with pytest.raises(RuntimeError):
        await cache.get("k", src.read)


async def test_a_renewal_that_a_write_overtook_is_not_kept():
    src, clock = SnapshotSource(), Clock()
    cache = ReadCache(ttl=1.0, refresh_after=0.5, clock=clock)
    await cache.get("k", src.read)
    src.gate.clear()
    clock.now += 0.6
    cache.kept("k")  # renewal starts, reading the state before the write
    await asyncio.sleep(0.01)
    cache.invalidate()
    src.value = 5
    src.gate.set()
    await asyncio.sleep(0.01)
    assert cache.kept("k") is None
    assert await cache.get("k", src.read) == {"value": 5}
