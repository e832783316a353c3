"""Event relay: one ordered JetStream consumer per gateway process, fanned out to SSE clients.

Each SSE ``id`` is the event's stream sequence, so a client reconnecting with
``Last-Event-ID: N`` is replayed N+1.. from the stream (a short-lived ordered consumer),
then continues live with duplicates dropped by sequence — no gap, no duplicate.
A client whose bounded queue fills is sent a ``reconnect`` event and closed instead of
growing the server's memory; it resumes with ``Last-Event-ID``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from karios.common.bus.consumers import OrderedSubscription, StreamEvent
from karios.common.bus.runtime import Bus
from karios.common.channels import channel_matches, route_event
from karios.common.telemetry import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class RelayedEvent:
    seq: int
    name: str
    channels: frozenset[str]
    payload: bytes  # the envelope JSON as published
    subject: str
    wire: bytes = b""  # the SSE frame, encoded once for every client

    def sse(self) -> bytes:
        return self.wire or b"id: %d\nevent: %s\ndata: %s\n\n" % (self.seq, self.name.encode(), self.payload)


@dataclass(eq=False)
class SSEClient:
    wanted: set[str] | None
    queue: asyncio.Queue[RelayedEvent]
    overflowed: bool = False

    def offer(self, ev: RelayedEvent) -> None:
        if self.overflowed or (self.wanted and self.wanted.isdisjoint(ev.channels)):
            return
        try:
            self.queue.put_nowait(ev)
        except asyncio.QueueFull:
            # The queue is full, so the writer's next get() returns at once and sees the flag.
            self.overflowed = True


EventListener = Callable[[RelayedEvent, dict[str, Any]], Awaitable[None]]


@dataclass
class EventRelay:
    bus: Bus
    registry: CollectorRegistry
    queue_size: int = 1000
    keepalive: float = 15.0
    clients: set[SSEClient] = field(default_factory=set)
    last_seq: int = 0
    _sub: OrderedSubscription | None = None

    def __post_init__(self) -> None:
        self.m_clients = Gauge("karios_sse_clients", "Connected SSE clients", registry=self.registry)
        self.m_events = Counter(
            "karios_sse_events_relayed_total", "Events received by the relay", registry=self.registry
        )
        self.m_overflow = Counter(
            "karios_sse_client_overflows_total",
            "Clients told to reconnect because they fell behind",
            registry=self.registry,
        )

    def decode(self, msg: StreamEvent) -> RelayedEvent:
        try:
            domain, fact, _entity = self.bus.subjects.parse_event(msg.subject)
            data = json.loads(msg.data).get("data") or {}
        except (ValueError, AttributeError):
            domain, fact, data = "unknown", "unknown", {}
        name, channels = route_event(domain, fact, data if isinstance(data, dict) else {})
        wire = b"id: %d\nevent: %s\ndata: %s\n\n" % (msg.seq, name.encode(), msg.data)
        return RelayedEvent(msg.seq, name, frozenset(channels), msg.data, msg.subject, wire)

    async def start(self) -> None:
        async def on_event(msg: StreamEvent) -> None:
            ev = self.decode(msg)
            self.last_seq = ev.seq
            self.m_events.inc()
            for client in list(self.clients):
                was = client.overflowed
                client.offer(ev)
                if client.overflowed and not was:
                    self.m_overflow.inc()

        self._sub = await self.bus.subscribe_events(on_event)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.stop()

    async def stream_last_seq(self) -> int:
        return await self.bus.last_event_seq()

    async def replay(self, after: int, until: int) -> AsyncIterator[RelayedEvent]:
        """Events with after < seq <= until, from the stream."""
        async for msg in self.bus.read_events(after, until):
            yield self.decode(msg)

    async def stream(self, wanted: set[str] | None, last_event_id: int | None) -> AsyncIterator[bytes]:
        client = SSEClient(wanted, asyncio.Queue(maxsize=self.queue_size))
        self.clients.add(client)
        self.m_clients.inc()
        try:
            yield b"retry: 2000\n: connected\n\n"
            sent = 0
            if last_event_id is not None:
                until = await self.stream_last_seq()
                async for ev in self.replay(last_event_id, until):
                    sent = ev.seq
                    if channel_matches(wanted, set(ev.channels)):
                        yield ev.sse()
                sent = max(sent, last_event_id)
            while True:
                try:
                    ev = await asyncio.wait_for(client.queue.get(), timeout=self.keepalive)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if client.overflowed:
                    body = json.dumps({"reason": "slow consumer", "last_event_id": sent}).encode()
                    yield b"event: reconnect\ndata: %s\n\n" % body
                    return
                # Send everything already queued in one write: under load, one ASGI send per
                # event per client is what costs the CPU.
                chunk: list[bytes] = []
                while True:
                    if ev.seq > sent:  # else already replayed
                        sent = ev.seq
                        chunk.append(ev.sse())
                    if len(chunk) >= 256 or client.queue.empty() or client.overflowed:
                        break
                    ev = client.queue.get_nowait()
                if chunk:
                    yield b"".join(chunk)
        finally:
            self.clients.discard(client)
            self.m_clients.dec()
