"""Handling one command delivery: validate, run the handler, then ack / nak / dead-letter.

The outcome → disposition mapping is :func:`karios.common.errors.bus_disposition` (the one
place); a retry or a dead letter logs the redacted cause, never the exception's raw text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from faststream.nats import NatsMessage
from nats.js.api import PubAck
from opentelemetry import trace
from pydantic import ValidationError

from karios.common.bus.deadletter import DeadLetterBus, dead_letter
from karios.common.bus.envelope import Envelope, RawEnvelope
from karios.common.bus.tracing import consumer_span
from karios.common.contracts.base import Command, Event
from karios.common.errors import Disposition, PermanentFailure, bus_disposition, describe_for_log
from karios.common.telemetry import get_logger

log = get_logger(__name__)


class CommandBus(DeadLetterBus, Protocol):
    """The bus a command arrives on, as handling needs it: a dead letter's needs plus the retry
    limits. Typed here so :mod:`karios.common.bus.runtime` (whose ``Bus`` is one) sits above."""

    @property
    def service(self) -> str: ...

    @property
    def max_deliver(self) -> int: ...

    @property
    def retry_delay(self) -> float: ...


@dataclass
class HandlerContext:
    """What a command handler gets beside its payload."""

    bus: CommandBus  # the Bus that delivered the command
    envelope: Envelope[Any]
    message: NatsMessage
    deliveries: int

    async def in_progress(self) -> None:
        """Tell the server we are still working (resets the ack timer)."""
        await self.message.in_progress()

    async def emit(self, event: Event, subject: str, entity: str = "") -> PubAck:
        return await self.bus.publish_event(event, subject, cause=self.envelope, entity=entity)


CommandHandler = Callable[[Any, HandlerContext], Awaitable[None]]


async def consume_command(
    bus: CommandBus, msg: NatsMessage, model: type[Command], handler: CommandHandler
) -> None:
    """One delivery of a command: the handler's outcome decides ack, retry later, or dead letter."""
    raw = msg.raw_message
    deliveries = int(getattr(raw.metadata, "num_delivered", 1) or 1)
    err: BaseException | None = None
    env: Envelope[Any] | None = None
    try:
        raw_env = RawEnvelope.model_validate_json(raw.data)
        payload = model.model_validate(raw_env.data)
        env = Envelope[model].model_validate(raw_env.model_dump())  # type: ignore[valid-type]
    except ValidationError as exc:
        err = PermanentFailure(f"malformed command: {exc.errors()[0].get('msg', 'invalid')}")
    if err is None:
        assert env is not None
        with consumer_span(bus.service, env, raw.subject, raw.headers, deliveries) as span:
            try:
                await handler(payload, HandlerContext(bus, env, msg, deliveries))
            except Exception as exc:
                err = exc
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(trace.StatusCode.ERROR, describe_for_log(exc))
    disposition = bus_disposition(err, delivered=deliveries, max_deliver=bus.max_deliver)
    if disposition is Disposition.ACK:
        await raw.ack_sync()
    elif disposition is Disposition.NAK:
        log.warning("command retry", subject=raw.subject, deliveries=deliveries, cause=describe_for_log(err))
        await raw.nak(delay=bus.retry_delay)
    else:
        await dead_letter(bus, raw, env, err, deliveries)
        await raw.term()
