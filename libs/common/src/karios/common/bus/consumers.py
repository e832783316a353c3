"""Event-stream consumers the services need beside commands and queries.

- :class:`OrderedSubscription`: an ordered (flow-controlled, ephemeral) JetStream consumer,
  starting at a sequence or delivering only new events — the SSE relay and its
  ``Last-Event-ID`` replay.
- :class:`PullConsumer`: a durable pull consumer shared by every replica of a service, each
  event handled once with explicit ack (nak with a delay when the handler raises) — read models.

Both hand the caller a :class:`StreamEvent` (or a typed payload), never a nats-py message:
the NATS client stays inside ``karios.common.bus``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from karios.common.bus.envelope import Envelope, RawEnvelope
from karios.common.bus.tracing import consumer_span, consumer_spans, delivery_span
from karios.common.contracts.base import Event
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)

E = TypeVar("E", bound=Event)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event as stored in the event stream: its sequence, subject and envelope JSON."""

    seq: int
    subject: str
    data: bytes

    def envelope(self) -> RawEnvelope:
        """The envelope with ``data`` as a dict (raises ``ValidationError`` when malformed)."""
        return RawEnvelope.model_validate_json(self.data)

    @classmethod
    def from_msg(cls, msg: Any) -> StreamEvent:
        return cls(int(msg.metadata.sequence.stream), msg.subject, msg.data)


StreamCallback = Callable[[StreamEvent], Awaitable[None]]


class OrderedSubscription:
    """A live ordered consumer; :meth:`stop` ends it (idempotent, never raises)."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        if self._sub is None:
            return
        sub, self._sub = self._sub, None
        try:
            await sub.unsubscribe()
        except Exception:
            log.debug("ordered subscription unsubscribe failed", exc_info=True)


async def subscribe_ordered(
    js: Any, subject: str, callback: StreamCallback, *, start_seq: int | None = None
) -> OrderedSubscription:
    """Push ``subject``'s events to ``callback`` in stream order: from ``start_seq`` or only new ones."""

    async def on_msg(msg: Any) -> None:
        with delivery_span(msg.subject, msg.headers):  # e.g. the SSE relay's fan-out
            await callback(StreamEvent.from_msg(msg))

    if start_seq is None:
        sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW, cb=on_msg)
    else:
        cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
        sub = await js.subscribe(subject, ordered_consumer=True, config=cfg, cb=on_msg)
    return OrderedSubscription(sub)


async def read_range(
    js: Any, subject: str, after: int, until: int, *, idle_timeout: float = 5.0
) -> AsyncIterator[StreamEvent]:
    """Stored events with ``after < seq <= until``, in order; ends early when the stream stays idle."""
    if until <= after:
        return
    cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
    sub = await js.subscribe(subject, ordered_consumer=True, config=cfg)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_timeout)
            except nats.errors.TimeoutError:
                return
            ev = StreamEvent.from_msg(msg)
            if ev.seq > until:
                return
            yield ev
            if ev.seq >= until:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


EventHandler = Callable[[E, Envelope[Any]], Awaitable[None]]
# A fetch's events at once, in delivery order (``many=True``): e.g. one transaction per fetch.
ManyHandler = Callable[[list[Envelope[Any]]], Awaitable[None]]


@dataclass
class PullConsumer(Generic[E]):
    """A durable pull consumer of ``subject`` that applies events of type ``model`` with ``handler``.

    Events of other types on the subject are acked and skipped. A handler that raises gets the
    event again after ``retry_delay`` (read models must be idempotent: the projector claims the
    envelope id in the same transaction). Replicas pull batches side by side and an event held by
    a replica that died comes back after ``ack_wait``, so events arrive out of order: the
    envelope's ``stream_seq`` lets a read model keep an entity's newest state. A malformed event
    is acked and logged: redelivering it would never succeed.

    With ``many``, ``handler`` takes the envelopes of a whole fetch (up to ``batch``) at once and
    they are acked together when it returns, all redelivered when it raises.
    """

    js: Any
    stream: str
    durable: str
    subject: str
    model: type[E]
    handler: EventHandler[E] | ManyHandler
    batch: int = 50
    ack_wait: float = 30.0
    retry_delay: float = 1.0
    many: bool = False
    _sub: Any = None
    _task: asyncio.Task[None] | None = None

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait,
            max_ack_pending=1000,
        )

    async def start(self) -> None:
        self._sub = await self.js.pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=self.config()
        )
        self._task = asyncio.create_task(self._loop(), name=f"pull-{self.durable}")

    async def _loop(self) -> None:
        while True:
            try:
                msgs = await self._sub.fetch(self.batch, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pull consumer fetch failed", durable=self.durable, error=type(exc).__name__)
                await asyncio.sleep(self.retry_delay)  # back off while NATS is away
                continue
            if self.many:
                await self._handle_many(msgs)
            else:
                for msg in msgs:
                    await self._handle(msg)

    async def _decode(self, msg: Any) -> Envelope[Any] | None:
        """The message's envelope, or None when it is not for us (acked: skipped for good)."""
        try:
            raw = RawEnvelope.model_validate_json(msg.data)
            if raw.type != self.model.TYPE:
                await msg.ack()
                return None
            env = Envelope[self.model].model_validate(raw.model_dump())  # type: ignore[name-defined]
            env.stream_seq = int(msg.metadata.sequence.stream)
        except ValidationError as exc:
            log.warning("pull consumer dropped a malformed event", subject=msg.subject, error=str(exc)[:200])
            await msg.ack()
            return None
        return env

    async def _handle(self, msg: Any) -> None:
        env = await self._decode(msg)
        if env is None:
            return
        try:
            with consumer_span("bus", env, msg.subject, msg.headers):  # e.g. the read model's projection
                await self.handler(env.data, env)  # type: ignore[call-arg]
            await msg.ack()
        except Exception as exc:
            log.warning("pull consumer handler failed", subject=msg.subject, error=type(exc).__name__)
            await msg.nak(delay=self.retry_delay)

    async def _handle_many(self, msgs: list[Any]) -> None:
        taken = [(msg, env) for msg in msgs if (env := await self._decode(msg)) is not None]
        if not taken:
            return
        try:
            with consumer_spans("bus", [(env, msg.subject, msg.headers) for msg, env in taken]):
                await self.handler([env for _, env in taken])  # type: ignore[call-arg,arg-type]
        except Exception as exc:
            log.warning(
                "pull consumer handler failed",
                subject=self.subject,
                events=len(taken),
                error=type(exc).__name__,
            )
            for msg, _ in taken:
                await msg.nak(delay=self.retry_delay)
            return
        for msg, _ in taken:
            await msg.ack()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
