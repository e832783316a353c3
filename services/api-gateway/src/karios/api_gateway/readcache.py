"""Shared reads: one bus round trip serves every reader of the same answer for a moment.

Under load, what costs on ``GET /controlnode/provision/queue`` and ``GET /controlnode/nodes`` is
every reader asking (NATS requests, the provisioner's or the inventory's work, the SQL behind
it, and the JSON both ways). :class:`ReadCache` keeps an answer for :data:`READ_TTL_S` and lets
concurrent misses share one load (single-flight); authentication still runs per request.

Staleness bound: an answer is at most ``READ_TTL_S`` (250 ms) older than the state it was read
from — below the pace of what it shows (a provision's stages take seconds; nodes join by
registration or first boot) and below a poller's interval. Any write through this replica
(every method but GET/HEAD/OPTIONS, :class:`InvalidateOnWrite`) drops every answer before and
after it runs, and a read after it never joins a load that began before it, so a caller reads
its own writes at once; writes elsewhere (another replica, a worker) show within the bound.
Errors are never kept: the next read asks again.

Reads of what the workers change on their own (the fabric's configuration, its jobs, drift and
pool, the discovered servers: keys under a *namespace*, ``fabric:…``, ``discovered:…``) are
also dropped when the gateway relays an event of that kind (:data:`NAMESPACES_BY_CHANNEL`,
:meth:`ReadCache.on_event`): a client that saw a job end on its SSE stream reads the ended
job, never the answer kept a moment before.

Refresh ahead: a reader of an answer older than :data:`REFRESH_AFTER` of the TTL gets it at once
and starts one load in the background (with the loader that loaded it), which replaces it when it
ends. Under steady reads the answer is renewed before it expires, so no reader waits for the bus:
without it, every 250 ms all 100 connections of a poller waited for one load (the p99 of the
queue read was that load's latency under load, ~50 ms). The bound above is unchanged (an answer
is never served past its TTL); with no readers nothing is loaded.

:meth:`ReadCache.kept` and :meth:`ReadCache.joined` let the gateway's fast path
(``api_gateway.fastpath``) answer from the same bytes without running the route; a route passes
its ``request`` to :meth:`ReadCache.response` so that the fast path learns which key answers it.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from karios.common.cache import SingleFlightCache

#: How long one answer serves every reader (seconds; 0 keeps nothing: only concurrent reads share).
READ_TTL_S = 0.25
#: Share of the TTL after which a read of a kept answer also reloads it in the background.
REFRESH_AFTER = 0.5
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

#: The scope key a route's shared answer names its read-cache key under (api_gateway.fastpath).
ANSWERED_FROM = "karios.read_key"
#: The keys of the shared reads, spelled once (the routes keep under them, the fast path reads them).
QUEUE_KEY = "queue"
FABRIC_CONFIG_KEY, FABRIC_LATEST_KEY, FABRIC_DRIFT_KEY = "fabric:config", "fabric:latest", "fabric:drift"
#: The namespaces whose kept answers an event on a channel drops (events.EventRelay.on_event).
NAMESPACES_BY_CHANNEL = {"fabric": ("fabric",), "provision": ("discovered",)}


def discovered_key(status: str, offset: int, limit: int) -> str:
    return f"discovered:{status}:{offset}:{limit}"


def nodes_page_key(offset: int, limit: int) -> str:
    return f"nodes:{offset}:{limit}"


def node_key_of(ip: str) -> str:
    return f"node:{ip}"


T = TypeVar("T")


class ReadCache:
    def __init__(
        self,
        ttl: float = READ_TTL_S,
        *,
        refresh_after: float | None = REFRESH_AFTER,
        max_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresh_after``: share of ``ttl`` after which a read reloads in the background (None: never)."""
        self.loads = 0  # answers actually fetched (tests read it)
        self._cache: SingleFlightCache[Any] = SingleFlightCache(
            ttl=ttl, negative_ttl=0, max_size=max_size, clock=clock
        )
        self._refresh_age = None if refresh_after is None else ttl * refresh_after
        self._max_size, self._clock = max_size, clock
        # Keys carry the generation (and their namespace's): after an invalidation no reader
        # joins an older load.
        self._generation = 0
        self._namespaces: dict[str, int] = {}
        self._loading: dict[str, asyncio.Future[Any]] = {}  # by key: the value of the load in flight
        # by key: when its kept answer was loaded, and by what (a refresh reloads with it)
        self._sources: OrderedDict[str, tuple[float, Callable[[], Awaitable[Any]]]] = OrderedDict()
        self._refreshes: set[asyncio.Task[None]] = set()

    def _key(self, key: str) -> str:
        space = key.partition(":")[0]
        return f"{self._generation}.{self._namespaces.get(space, 0)}:{key}"

    def _current(self, full: str) -> bool:
        """Whether no invalidation came since ``full`` was made."""
        return full == self._key(full.partition(":")[2])

    async def get(self, key: str, loader: Callable[[], Awaitable[T]]) -> T:
        value = self.kept(key)
        if value is not None:
            return value  # type: ignore[no-any-return]
        full = self._key(key)

        async def load() -> T:
            return await self._load(full, loader, self._announce(full))  # type: ignore[no-any-return]

        return (await self._cache.get_or_load(full, load)).value  # type: ignore[no-any-return]

    def _announce(self, full: str) -> asyncio.Future[Any]:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[full] = done
        return done

    async def _load(self, full: str, loader: Callable[[], Awaitable[Any]], done: asyncio.Future[Any]) -> Any:
        self.loads += 1
        value: Any = None  # what joiners get on an error: None, "ask the route"
        try:
            value = await loader()
            if self._current(full) and value is not None:
                self._sources[full] = (self._clock(), loader)
                self._sources.move_to_end(full)
                while len(self._sources) > self._max_size:
                    self._sources.popitem(last=False)
            return value
        finally:
            if self._loading.get(full) is done:
                del self._loading[full]
            if not done.done():
                done.set_result(value)

    def kept(self, key: str) -> Any | None:
        """The answer kept for ``key`` now (``response`` keys: its JSON bytes), or None; an answer
        past ``refresh_after`` is also reloaded in the background (see the module docstring)."""
        full = self._key(key)
        value = self._cache.peek(full)
        if value is not None and self._refresh_age is not None and full not in self._loading:
            source = self._sources.get(full)
            if source is not None and self._clock() - source[0] >= self._refresh_age:
                self._refresh(full, source[1])
        return value

    def _refresh(self, full: str, loader: Callable[[], Awaitable[Any]]) -> None:
        done = self._announce(full)  # at once: the next reader does not start another

        async def reload() -> None:
            try:
                value = await self._load(full, loader, done)
            except Exception:  # the kept answer serves until its TTL; then a reader loads
                return  # through the route, which answers the error
            if self._current(full) and value is not None:
                self._cache.put(full, value)

        # A context of its own: the load belongs to no request (no span, no log fields of one).
        task = asyncio.get_running_loop().create_task(reload(), context=contextvars.Context())
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def joined(self, key: str) -> Any | None:
        """The answer of the load of ``key`` in flight now, once it ends; None when there is no
        such load or it failed (the route then asks, and answers the error)."""
        done = self._loading.get(self._key(key))
        return None if done is None else await asyncio.shield(done)

    async def response(
        self, key: str, loader: Callable[[], Awaitable[Any]], request: Request | None = None
    ) -> Response:
        """A JSON answer of ``loader``'s value, encoded once per load: a kept answer costs a
        reader no validation and no encoding (the route's ``response_model`` documents it).
        With ``request``, its scope says which key answered it (:data:`ANSWERED_FROM`: the
        gateway's fast path answers the same request target from that key next time)."""

        async def encoded() -> bytes:
            value = await loader()
            if isinstance(value, bytes):  # encoded by the route (e.g. with fields excluded)
                return value
            return value.model_dump_json().encode() if isinstance(value, BaseModel) else to_json(value)

        body = await self.get(key, encoded)
        if request is not None:
            request.scope[ANSWERED_FROM] = key
        return Response(body, media_type="application/json")

    def invalidate_namespace(self, space: str) -> None:
        """Drop the answers kept under ``space:…``; as :meth:`invalidate`, for those keys only."""
        self._namespaces[space] = self._namespaces.get(space, 0) + 1

    def on_event(self, channels: frozenset[str]) -> None:
        """An event on ``channels`` was relayed: drop the namespaces it may have changed."""
        for channel in channels:
            for space in NAMESPACES_BY_CHANNEL.get(channel, ()):
                self.invalidate_namespace(space)

    def invalidate(self) -> None:
        """Drop every answer; a load in flight is still answered to its waiters, not kept, and
        no later reader joins it."""
        self._generation += 1
        self._cache.clear()
        self._loading.clear()
        self._sources.clear()


def read_cache(app: FastAPI) -> ReadCache:
    """The app's cache (made on first use)."""
    cache: ReadCache | None = getattr(app.state, "read_cache", None)
    if cache is None:
        cache = app.state.read_cache = ReadCache()
    return cache


class InvalidateOnWrite:
    """ASGI middleware: any write request drops the app's cached reads before and after it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _READS:
            await self.app(scope, receive, send)
            return
        cache = read_cache(scope["app"])
        cache.invalidate()
        try:
            await self.app(scope, receive, send)
        finally:
            cache.invalidate()
