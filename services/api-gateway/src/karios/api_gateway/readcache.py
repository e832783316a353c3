"""Shared reads: one bus round trip serves every reader of the same answer for a moment.

Under load, what costs on ``GET /controlnode/provision/queue`` and ``GET /controlnode/nodes`` is
every reader asking (NATS requests, the provisioner's or the inventory's work, the SQL behind
it, and the JSON both ways). :class:`ReadCache` keeps an answer for :data:`READ_TTL_S` and lets
concurrent misses share one load (single-flight); authentication still runs per request.

Staleness bound: an answer is at most ``READ_TTL_S`` (250 ms) older than the state it was read
from — below the pace of what it shows (a provision's stages take seconds; nodes join by
registration or first boot) and below a poller's interval. Any write through this replica
(every method but GET/HEAD/OPTIONS, :class:`InvalidateOnWrite`) drops every answer before and
after it runs, so a caller reads its own writes at once; writes elsewhere (another replica, a
worker) show within the bound. Errors are never kept: the next read asks again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Response
from pydantic import BaseModel
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from karios.common.cache import SingleFlightCache

#: How long one answer serves every reader (seconds; 0 keeps nothing: only concurrent reads share).
READ_TTL_S = 0.25
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

T = TypeVar("T")


class ReadCache:
    def __init__(self, ttl: float = READ_TTL_S) -> None:
        self.loads = 0  # answers actually fetched (tests read it)
        self._cache: SingleFlightCache[Any] = SingleFlightCache(ttl=ttl, negative_ttl=0, max_size=1000)

    async def get(self, key: str, loader: Callable[[], Awaitable[T]]) -> T:
        async def load() -> T:
            self.loads += 1
            return await loader()

        return (await self._cache.get_or_load(key, load)).value  # type: ignore[no-any-return]

    async def response(self, key: str, loader: Callable[[], Awaitable[Any]]) -> Response:
        """A JSON answer of ``loader``'s value, encoded once per load: a kept answer costs a
        reader no validation and no encoding (the route's ``response_model`` documents it)."""

        async def encoded() -> bytes:
            value = await loader()
            return value.model_dump_json().encode() if isinstance(value, BaseModel) else to_json(value)

        return Response(await self.get(key, encoded), media_type="application/json")

    def invalidate(self) -> None:
        """Drop every answer; a load in flight is still answered to its waiters, not kept."""
        self._cache.clear()


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
