"""Event relay: one ordered JetStream consumer per gateway process, fanned out to SSE clients.

Each SSE ``id`` is the event's stream sequence, so a client reconnecting with
``Last-Event-ID: N`` is replayed N+1.. from the stream (a short-lived ordered consumer),
then continues live with duplicates dropped by sequence — no gap, no duplicate. The
sequence is the stream's, so the same id resumes on any gateway replica.

A new client's first frame (``: connected``, written once it is registered) carries
``id: N``, N being the last sequence the relay had relayed when it registered the client: the
client receives every matching event after N, and none before. An ``EventSource`` keeps that
id, so a client that loses its stream before its first event still resumes from where it
joined; without it, it would reconnect with no ``Last-Event-ID`` and silently miss what was
published while it was away.

The fan-out is built for 1,000+ clients per process (issue 14):

- each event is decoded, routed to channels and encoded as an SSE frame **once**;
- clients are grouped by their channel filter, and each group's filter is checked once per
  event (1,000 clients of ``channel=provision`` cost one set test, not 1,000);
- a delivery is a list append and, when the client's writer is idle, one future resolved:
  no queue, no timer and no task per event; the writer sends everything pending in one write;
- keep-alives come from one relay-wide ticker, not a timer per client;
- :class:`DirectSSE` writes the stream straight to the server's ``send``, past the send
  wrappers of every middleware layer.

The relay delivers every stored event exactly once and in order even when its consumer
misbehaves (nats-py's ordered consumer resets itself after a dropped message, and a consumer
deleted on the server is noticed only after two missed 5 s heartbeats): a sequence it has
already relayed is skipped, a jump in the sequence is filled from the stream first, and a
watchdog that finds the stream ahead of the relay on two checks in a row reads what is missing
and restarts the consumer from the last relayed sequence.

A client whose backlog reaches ``queue_size`` events (it reads slower than events arrive)
is cut: it is sent an ``event: reconnect`` with the last id it received and closed, so it
never slows the others nor grows the server's memory; it resumes with ``Last-Event-ID``.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.common.bus.consumers import OrderedSubscription, StreamEvent
from karios.common.bus.runtime import Bus
from karios.common.channels import channel_matches, route_event
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)

#: The path whose responses :class:`DirectSSE` writes itself.
EVENTS_PATH = "/controlnode/events"
_SCOPE_KEY = "karios.sse"
#: The first frame: the reconnect delay and the comment a client waits for; a new client's also
#: carries ``id:``, where it joined (a frame with no ``data`` sets the id and dispatches nothing).
_PREAMBLE = b"retry: 2000\n: connected\n"
_KEEPALIVE = b": keep-alive\n\n"
#: Frames joined into one write at most (a client catching up writes in bounded chunks).
_MAX_BATCH = 256


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


@dataclass(eq=False, slots=True)
class SSEClient:
    """One connected stream: its filter, its pending events and the writer's wake-up."""

    wanted: frozenset[str] | None
    limit: int
    #: The relay's :attr:`EventRelay.last_seq` when the client was registered: it receives every
    #: matching event after this sequence (the ``id`` of its first frame).
    joined: int = 0
    pending: list[RelayedEvent] = field(default_factory=list)
    waiter: asyncio.Future[None] | None = None
    overflowed: bool = False
    closed: bool = False
    beat: bool = False  # a keep-alive is due
    wrote: bool = False  # something was written since the last keep-alive tick
    ending: bool = False  # the server stops: tell the client to reconnect and end the stream

    def offer(self, ev: RelayedEvent) -> bool:
        """Queue ``ev`` (the caller checked the filter); True when this cut the client."""
        if self.overflowed:
            return False
        if len(self.pending) >= self.limit:
            self.overflowed = True
            self.wake()
            return True
        self.pending.append(ev)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def disconnect(self) -> None:
        self.closed = True
        self.wake()

    def end(self) -> None:
        self.ending = True
        self.wake()


EventListener = Callable[[RelayedEvent, dict[str, Any]], Awaitable[None]]


@dataclass
class EventRelay:
    bus: Bus
    registry: CollectorRegistry
    queue_size: int = 1000
    keepalive: float = 15.0
    #: Seconds between the watchdog's looks at the stream's last sequence.
    watchdog_every: float = 2.0
    #: Connected clients by channel filter (``None``: every channel).
    groups: dict[frozenset[str] | None, set[SSEClient]] = field(default_factory=dict)
    #: The stream sequence of the last event relayed (every event up to it was relayed).
    last_seq: int = 0
    _sub: OrderedSubscription | None = None
    _ticker: asyncio.Task[None] | None = None
    _watchdog: asyncio.Task[None] | None = None
    _order: asyncio.Lock = field(default_factory=asyncio.Lock)
    _behind_at: int | None = None  # the stream's last sequence when the relay was last seen behind
    #: The server is stopping: every stream, open or new, ends with ``event: reconnect``.
    ending: bool = False
    #: Called with each relayed event's channels before any client is offered it (the read
    #: cache drops what the event may have changed: a client never reads older than its stream).
    on_event: list[Callable[[frozenset[str]], None]] = field(default_factory=list)

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
        self.m_recovered = Counter(
            "karios_sse_events_recovered_total",
            "Events the live consumer skipped, read back from the stream by the relay",
            registry=self.registry,
        )
        self.m_restarts = Counter(
            "karios_sse_consumer_restarts_total",
            "Live consumers restarted by the relay's watchdog (the stream was ahead of it)",
            registry=self.registry,
        )

    @property
    def clients(self) -> set[SSEClient]:
        return set().union(*self.groups.values())

    def decode(self, msg: StreamEvent) -> RelayedEvent:
        try:
            domain, fact, _entity = self.bus.subjects.parse_event(msg.subject)
            data = json.loads(msg.data).get("data") or {}
        except (ValueError, AttributeError):
            domain, fact, data = "unknown", "unknown", {}
        name, channels = route_event(domain, fact, data if isinstance(data, dict) else {})
        wire = b"id: %d\nevent: %s\ndata: %s\n\n" % (msg.seq, name.encode(), msg.data)
        return RelayedEvent(msg.seq, name, frozenset(channels), msg.data, msg.subject, wire)

    def fan_out(self, ev: RelayedEvent) -> None:
        """Hand ``ev`` to every client whose filter matches it (each filter tested once)."""
        self.last_seq = ev.seq
        self.m_events.inc()
        for hook in self.on_event:
            hook(ev.channels)
        cut = 0
        for wanted, group in self.groups.items():
            if wanted is not None and wanted.isdisjoint(ev.channels):
                continue
            for client in group:
                if client.offer(ev):
                    cut += 1
        if cut:
            self.m_overflow.inc(cut)

    async def start(self) -> None:
        """Relay every event stored from now on (the consumer starts after the stream's last one)."""
        self.last_seq = await self.stream_last_seq()
        self._sub = await self._subscribe()
        self._ticker = asyncio.create_task(self._keepalives(), name="sse-keepalive")
        self._watchdog = asyncio.create_task(self._watch(), name="sse-watchdog")

    async def stop(self) -> None:
        await cancel_and_wait(self._ticker, self._watchdog)
        if self._sub is not None:
            await self._sub.stop()

    async def _subscribe(self) -> OrderedSubscription:
        return await self.bus.subscribe_events(self._on_live, start_seq=self.last_seq + 1)

    async def _on_live(self, msg: StreamEvent) -> None:
        if msg.seq == self.last_seq + 1 and not self._order.locked():
            self.fan_out(self.decode(msg))  # the common case: next in line, nothing being recovered
            return
        async with self._order:
            await self._relay_in_order(msg)

    async def _relay_in_order(self, msg: StreamEvent) -> None:
        """Relay ``msg`` after whatever the consumer skipped before it; drop what was relayed."""
        if msg.seq <= self.last_seq:
            return  # redelivered after a consumer reset, or already read back from the stream
        if msg.seq > self.last_seq + 1:
            await self._recover(msg.seq - 1)
        if msg.seq > self.last_seq:
            self.fan_out(self.decode(msg))

    async def _recover(self, until: int) -> None:
        """Relay the stored events after :attr:`last_seq` up to ``until`` (the caller holds ``_order``)."""
        first = self.last_seq
        async for ev in self.replay(self.last_seq, until):
            if ev.seq > self.last_seq:
                self.fan_out(ev)
                self.m_recovered.inc()
        log.warning(
            "event relay read skipped events back from the stream",
            after=first,
            until=until,
            relayed=self.last_seq - first,
        )

    async def _watch(self) -> None:
        """Every ``watchdog_every`` s: when the stream was ahead of the relay at the previous look and
        the relay has still not reached that sequence, its consumer is stuck (deleted on the server,
        or a reset that failed): read the missing events and start a new consumer after them."""
        while True:
            await asyncio.sleep(self.watchdog_every)
            try:
                await self.check_consumer()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: the next look tries again
                log.debug("event relay watchdog check failed", error=type(exc).__name__)

    async def check_consumer(self) -> bool:
        """One watchdog look; True when it restarted the consumer."""
        if not self.bus.connected:
            self._behind_at = None
            return False
        stream_last = await self.stream_last_seq()
        stuck = self._behind_at is not None and self.last_seq < self._behind_at
        self._behind_at = stream_last if stream_last > self.last_seq else None
        if not stuck:
            return False
        async with self._order:
            if self._sub is not None:
                await self._sub.stop()
            await self._recover(stream_last)
            self._sub = await self._subscribe()
        self.m_restarts.inc()
        log.warning("event relay restarted its consumer", resume_after=self.last_seq)
        self._behind_at = None
        return True

    async def _keepalives(self) -> None:
        """One ticker for every client: a client with nothing written for a tick gets a keep-alive."""
        tick = max(0.05, self.keepalive / 2)
        while True:
            await asyncio.sleep(tick)
            for group in list(self.groups.values()):
                for client in group:
                    if client.wrote:
                        client.wrote = False
                    else:
                        client.beat = True
                        client.wake()

    async def stream_last_seq(self) -> int:
        return await self.bus.last_event_seq()

    async def replay(self, after: int, until: int) -> AsyncIterator[RelayedEvent]:
        """Events with after < seq <= until, from the stream."""
        async for msg in self.bus.read_events(after, until):
            yield self.decode(msg)

    def end_streams(self) -> None:
        """The server is about to stop: end every stream (each writes ``event: reconnect`` with the
        id it reached and completes its response), so that the server, which waits for open
        responses before it runs the lifespan's shutdown, stops at once. SSE streams never end on
        their own; granian has no grace timeout of its own (uvicorn: 5 s, then it cuts them)."""
        self.ending = True
        for group in self.groups.values():
            for client in group:
                client.end()

    def open(self, wanted: set[str] | frozenset[str] | None) -> SSEClient:
        """Register a client: from now on it receives live events matching ``wanted``."""
        client = SSEClient(frozenset(wanted) if wanted else None, self.queue_size, joined=self.last_seq)
        client.ending = self.ending
        self.groups.setdefault(client.wanted, set()).add(client)
        self.m_clients.inc()
        return client

    def close(self, client: SSEClient) -> None:
        group = self.groups.get(client.wanted)
        if group is not None and client in group:
            group.discard(client)
            if not group:
                del self.groups[client.wanted]
            self.m_clients.dec()
        client.disconnect()

    async def frames(self, client: SSEClient, last_event_id: int | None) -> AsyncIterator[bytes]:
        """What to write to ``client``: the preamble (with the id it joined at, for a new client),
        the replay after ``last_event_id``, then live events (every write carries all that is
        pending), until it is cut or leaves."""
        if last_event_id is None:
            yield _PREAMBLE + b"id: %d\n\n" % client.joined
            sent = client.joined
        else:
            yield _PREAMBLE + b"\n"
            sent = last_event_id
            until = await self.stream_last_seq()
            wanted = set(client.wanted) if client.wanted else None
            async for ev in self.replay(last_event_id, until):
                sent = max(sent, ev.seq)
                if channel_matches(wanted, set(ev.channels)):
                    yield ev.sse()
        loop = asyncio.get_running_loop()
        while not client.closed:
            if client.ending:  # the events pending are left for the next replica's replay
                body = json.dumps({"reason": "server stopping", "last_event_id": sent}).encode()
                yield b"event: reconnect\ndata: %s\n\n" % body
                return
            if not client.pending and not client.overflowed and not client.beat:
                client.waiter = waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    client.waiter = None
                continue
            if client.overflowed:
                body = json.dumps({"reason": "slow consumer", "last_event_id": sent}).encode()
                yield b"event: reconnect\ndata: %s\n\n" % body
                return
            batch = client.pending
            if len(batch) > _MAX_BATCH:
                client.pending = batch[_MAX_BATCH:]
                batch = batch[:_MAX_BATCH]
            else:
                client.pending = []
            chunk = [ev.sse() for ev in batch if ev.seq > sent]  # else already replayed
            if chunk:
                sent = batch[-1].seq
            elif client.beat:
                chunk = [_KEEPALIVE]
            client.beat = False
            if chunk:
                client.wrote = True
                yield chunk[0] if len(chunk) == 1 else b"".join(chunk)

    async def stream(
        self, wanted: set[str] | frozenset[str] | None, last_event_id: int | None
    ) -> AsyncIterator[bytes]:
        """:meth:`frames` of a new client, which is registered until the iterator is closed."""
        client = self.open(wanted)
        try:
            async for chunk in self.frames(client, last_event_id):
                yield chunk
        finally:
            self.close(client)


_heap_frozen = False
#: Allocations between young collections in the gateway (CPython's default: 700).
YOUNG_GC_THRESHOLD = 10_000


def freeze_startup_heap() -> None:
    """Move what start-up allocated out of the collector's reach, once per process.

    A full collection walks every tracked object — the app, its routes and models — and took
    100–200 ms with 1,000 SSE clients connected: every delivery waited for it. After a freeze
    a full collection walks only what was allocated since (``gc.freeze``; garbage is collected
    first so that nothing collectable is kept).

    The youngest generation's threshold is raised as well (700 -> ``YOUNG_GC_THRESHOLD``
    allocations): a young collection in the middle of a fan-out promotes that event's
    in-flight objects (one wake-up per client), and enough promotions trigger a full
    collection of every connected stream's objects — ~35 ms with 1,000 clients on a loaded
    machine, all of it added to that event's deliveries. Fewer young collections promote less.
    """
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
        _young, middle, old = gc.get_threshold()
        gc.set_threshold(YOUNG_GC_THRESHOLD, middle, old)


class SSEResponse(Response):
    """The ``text/event-stream`` response of ``GET /controlnode/events``.

    Under :class:`DirectSSE` it only answers the headers through the middleware stack and
    leaves the body to be written by :class:`DirectSSE` on the server's own ``send``;
    without it, it streams through ``send`` itself.
    """

    media_type = "text/event-stream"

    def __init__(self, relay: EventRelay, wanted: set[str] | None, last_event_id: int | None) -> None:
        self.relay, self.wanted, self.last_event_id = relay, wanted, last_event_id
        self.status_code = 200
        self.background: BackgroundTask | None = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        slot = scope.get(_SCOPE_KEY)
        if isinstance(slot, dict):
            slot["stream"] = self
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await self.write(send, receive)
        if self.background is not None:
            await self.background()

    async def write(self, send: Send, receive: Receive) -> None:
        """Write the stream with ``send`` until the client leaves (read from ``receive``) or is cut."""
        client = self.relay.open(self.wanted)

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            client.disconnect()

        watcher = asyncio.create_task(watch())
        try:
            async for chunk in self.relay.frames(client, self.last_event_id):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not client.closed:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # an ASGI 2.4 server reports the client gone this way
            pass
        finally:
            watcher.cancel()
            self.relay.close(client)


class DirectSSE:
    """ASGI middleware outside the others: ``GET /controlnode/events`` runs through the stack
    (authentication, validation, errors, the request span) for its answer, but its body is
    written here, straight to the server's ``send``.

    Every middleware layer wraps ``send`` (errors, body limit, metrics, …): for 1,000 clients
    at 10 events/s those wrappers would run 10,000 times a second for bytes they never look at.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != EVENTS_PATH:
            await self.app(scope, receive, send)
            return
        slot: dict[str, SSEResponse] = {}
        scope[_SCOPE_KEY] = slot

        async def inner_send(message: Message) -> None:
            if "stream" in slot and message["type"] == "http.response.body":
                return  # the stream's (empty) body through the stack: written below instead
            await send(message)

        await self.app(scope, receive, inner_send)
        stream = slot.get("stream")
        if stream is not None:
            await stream.write(send, receive)
