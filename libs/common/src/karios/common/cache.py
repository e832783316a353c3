"""A TTL cache for boot storms: single-flight loads, short negative caching, a size bound, tags.

- Concurrent misses for one key share one load (one NetBox call for 100 PXE clients).
- ``None`` (unknown MAC/name) is cached for ``negative_ttl`` only, so a device added in NetBox
  shows up quickly even without a webhook.
- Errors are never cached: the waiters of that load all get the error, the next call retries.
- Entries carry tags (device id, name, MACs); :meth:`invalidate` drops every entry with a tag.
  A load that races an invalidation is returned but not stored (it may hold the old data).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    value: V | None
    expires: float
    tags: frozenset[str]


@dataclass
class CacheResult(Generic[V]):
    value: V | None
    hit: bool  # served from the cache (or joined an in-flight load) without calling the loader


@dataclass
class SingleFlightCache(Generic[V]):
    ttl: float = 60.0
    negative_ttl: float = 5.0
    max_size: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[str, _Entry[V]] = field(default_factory=OrderedDict, init=False)
    _inflight: dict[str, asyncio.Future[V | None]] = field(default_factory=dict, init=False)
    _epoch: int = field(default=0, init=False)

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: str) -> V | None:
        entry = self._fresh(key)
        return entry.value if entry else None

    def _fresh(self, key: str) -> _Entry[V] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    async def get_or_load(
        self,
        key: str,
        loader: Callable[[], Awaitable[V | None]],
        tags: Callable[[V], Iterable[str]] = lambda _v: (),
    ) -> CacheResult[V]:
        entry = self._fresh(key)
        if entry is not None:
            return CacheResult(entry.value, hit=True)
        pending = self._inflight.get(key)
        joined = pending is not None
        if pending is None:
            # The load is a task of its own: a caller that gives up (timeout, disconnect) does not
            # cancel it for the others waiting on it.
            pending = asyncio.ensure_future(self._load(key, loader, tags))
            pending.add_done_callback(_retrieve)
            self._inflight[key] = pending
        return CacheResult(await asyncio.shield(pending), hit=joined)

    async def _load(
        self, key: str, loader: Callable[[], Awaitable[V | None]], tags: Callable[[V], Iterable[str]]
    ) -> V | None:
        epoch = self._epoch
        try:
            value = await loader()
            if epoch == self._epoch:
                self.put(key, value, tags(value) if value is not None else ())
            return value
        finally:
            self._inflight.pop(key, None)

    def put(self, key: str, value: V | None, tags: Iterable[str] = ()) -> None:
        ttl = self.ttl if value is not None else self.negative_ttl
        if ttl <= 0:
            return
        self._entries[key] = _Entry(value, self.clock() + ttl, frozenset(tags) | {key})
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)

    def invalidate(self, tags: Iterable[str], *, negatives: bool = True) -> int:
        """Drop entries carrying any of ``tags`` (and all negative entries): returns how many."""
        wanted = set(tags)
        self._epoch += 1
        doomed = [k for k, e in self._entries.items() if (e.tags & wanted) or (negatives and e.value is None)]
        for k in doomed:
            del self._entries[k]
        return len(doomed)

    def clear(self) -> None:
        self._epoch += 1
        self._entries.clear()


def _retrieve(fut: asyncio.Future[object]) -> None:
    """Mark a failed load's exception as seen (its callers may all have gone away)."""
    if not fut.cancelled():
        fut.exception()
