"""The bus as a service sees it: one FastStream broker, publishing, requests and handlers.

- Commands: durable **pull** consumers shared by all replicas, explicit manual acks. The
  outcome of a handler is turned into ack / nak-with-delay / terminate by
  :func:`karios.common.errors.bus_disposition` (the one place). Terminated commands are
  copied to the DLQ with their reason (work-queue retention deletes them on ``term``) and
  a ``command_failed`` event is emitted.
- Queries: core NATS request/reply with a queue group; replies are :class:`Reply` JSON.
- Events: published to JetStream with ``Nats-Msg-Id`` = envelope id.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.js.api import AckPolicy as ServerAckPolicy
from nats.js.api import ConsumerConfig, PubAck
from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from karios.common.bus.envelope import Envelope, RawEnvelope, wrap
from karios.common.bus.streams import ensure_streams, reconcile_consumer
from karios.common.bus.subjects import Subjects
from karios.common.contracts.base import Command, Contract, ErrorBody, Event, Reply
from karios.common.errors import (
    Disposition,
    KariosError,
    PermanentFailure,
    ServiceUnavailable,
    ValidationFailed,
    bus_disposition,
    error_from_dict,
)
from karios.common.telemetry import context_from_headers, get_logger

log = get_logger(__name__)

HEADER_DLQ_REASON = "Karios-Dlq-Reason"
HEADER_DLQ_CODE = "Karios-Dlq-Code"
HEADER_DLQ_DELIVERIES = "Karios-Dlq-Deliveries"
HEADER_DLQ_SUBJECT = "Karios-Dlq-Original-Subject"


class CommandFailed(Event):
    """A command was given up on (permanent error or retries exhausted) and dead-lettered."""

    TYPE = "karios.bus.command_failed.v1"

    command_type: str
    command_id: str
    code: str
    message: str
    deliveries: int


@dataclass
class HandlerContext:
    """What a command handler gets beside its payload."""

    bus: Bus
    envelope: Envelope[Any]
    message: NatsMessage
    deliveries: int

    async def in_progress(self) -> None:
        """Tell the server we are still working (resets the ack timer)."""
        await self.message.in_progress()

    async def emit(self, event: Event, subject: str, entity: str = "") -> PubAck:
        return await self.bus.publish_event(event, subject, cause=self.envelope, entity=entity)


CommandHandler = Callable[[Any, HandlerContext], Awaitable[None]]
QueryHandler = Callable[[Any], Awaitable[BaseModel | dict[str, Any] | list[Any] | None]]


@dataclass
class Bus:
    service: str
    servers: list[str]
    subjects: Subjects
    max_deliver: int = 5
    retry_delay: float = 2.0
    ack_wait: float = 60.0
    request_timeout: float = 5.0
    broker: NatsBroker = field(init=False)
    _consumers: list[tuple[str, ConsumerConfig]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.broker = NatsBroker(
            self.servers,
            connect_timeout=2,
            max_reconnect_attempts=5,
            reconnect_time_wait=1,
            middlewares=[NatsTelemetryMiddleware()],
        )

    @classmethod
    def from_settings(cls, settings: Any, service: str) -> Bus:
        return cls(
            service=service,
            servers=[s.strip() for s in settings.nats_url.split(",") if s.strip()],
            subjects=Subjects(settings.bus_prefix),
            max_deliver=settings.max_deliver,
            retry_delay=settings.retry_delay,
            request_timeout=settings.request_timeout,
        )

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        await self.broker.connect()
        js = self.js
        await ensure_streams(js, self.subjects)
        for stream, cfg in self._consumers:
            await reconcile_consumer(js, stream, cfg)
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()

    @property
    def nc(self) -> Any:
        return self.broker.connection

    @property
    def js(self) -> Any:
        return self.broker.config.connection_state.stream

    async def healthy(self) -> bool:
        """Connected and every durable consumer still exists (a deleted one spins silently)."""
        try:
            if not self.nc.is_connected:
                return False
            for stream, cfg in self._consumers:
                await self.js.consumer_info(stream, cfg.durable_name)
        except Exception:
            return False
        return True

    # -- publishing ----------------------------------------------------------------
    async def _publish(self, env: Envelope[Any], subject: str) -> PubAck:
        try:
            return await self.js.publish(
                subject, env.model_dump_json().encode(), headers=env.headers(), timeout=5.0
            )
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionClosedError,
        ) as exc:
            raise ServiceUnavailable(f"bus publish to {subject} failed: {type(exc).__name__}") from exc

    async def publish_event(
        self,
        event: Event,
        subject: str,
        *,
        cause: Envelope[Any] | None = None,
        entity: str = "",
        msg_id: str | None = None,
    ) -> PubAck:
        env = wrap(event, source=self.service, subject=entity, cause=cause, msg_id=msg_id)
        return await self._publish(env, subject)

    async def send_command(
        self,
        command: Command,
        subject: str,
        *,
        entity: str = "",
        msg_id: str | None = None,
        correlationid: str | None = None,
    ) -> Envelope[Any]:
        env = wrap(command, source=self.service, subject=entity, msg_id=msg_id, correlationid=correlationid)
        await self._publish(env, subject)
        return env

    async def request(
        self,
        subject: str,
        query: Contract,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a bus timeout, not a cancel scope)
        reply: type[BaseModel] | None = None,
    ) -> Any:
        """Request/reply; raises the remote :class:`KariosError`, or 503 when nobody answers.

        With ``reply``, the answer is validated into that model (else the plain JSON value).
        """
        env = wrap(query, source=self.service)
        try:
            msg = await self.nc.request(
                subject,
                env.model_dump_json().encode(),
                timeout=timeout or self.request_timeout,
                headers=env.headers(),
            )
        except nats.errors.NoRespondersError:
            raise ServiceUnavailable(f"no service answers {subject}") from None
        except nats.errors.TimeoutError:
            raise ServiceUnavailable(
                f"no answer on {subject} within {timeout or self.request_timeout}s"
            ) from None
        answer = Reply.model_validate_json(msg.data)
        if not answer.ok:
            assert answer.error is not None
            raise error_from_dict(answer.error.model_dump())
        return reply.model_validate(answer.result) if reply is not None else answer.result

    # -- handlers ------------------------------------------------------------------
    def command_handler(
        self,
        domain: str,
        model: type[Command],
        handler: CommandHandler,
        *,
        durable: str | None = None,
        verb: str | None = None,
        concurrency: int = 4,
    ) -> None:
        """Consume commands of ``domain`` (optionally one verb) with a shared durable pull consumer."""
        subject = self.subjects.cmd(domain, verb) if verb else self.subjects.commands_of(domain)
        durable = durable or f"{self.service}-{domain}{'-' + verb if verb else ''}".replace(".", "-")
        cfg = ConsumerConfig(
            durable_name=durable,
            filter_subject=subject,
            ack_policy=ServerAckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            # The server-side limit is a backstop for crashes; retries are counted by us.
            max_deliver=self.max_deliver + 2,
            max_ack_pending=1000,
        )
        self._consumers.append((self.subjects.cmd_stream, cfg))

        async def consume(body: Any, msg: NatsMessage) -> None:
            await self._consume_command(body, msg, model, handler)

        self.broker.subscriber(
            subject,
            stream=JStream(self.subjects.cmd_stream, declare=False),
            durable=durable,
            config=cfg,
            pull_sub=PullSub(batch_size=concurrency, timeout=1.0),
            ack_policy=AckPolicy.MANUAL,
            no_reply=True,
        )(consume)

    async def _consume_command(
        self, body: Any, msg: NatsMessage, model: type[Command], handler: CommandHandler
    ) -> None:
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
            tracer = trace.get_tracer(f"karios.{self.service}")
            with tracer.start_as_current_span(
                f"handle {env.type}", context=context_from_headers(raw.headers)
            ):
                try:
                    await handler(payload, HandlerContext(self, env, msg, deliveries))
                except Exception as exc:
                    err = exc
        disposition = bus_disposition(err, delivered=deliveries, max_deliver=self.max_deliver)
        if disposition is Disposition.ACK:
            await raw.ack_sync()
        elif disposition is Disposition.NAK:
            log.warning("command retry", subject=raw.subject, deliveries=deliveries, error=str(err))
            await raw.nak(delay=self.retry_delay)
        else:
            await self._dead_letter(raw, env, err, deliveries)
            await raw.term()

    async def _dead_letter(
        self, raw: Any, env: Envelope[Any] | None, err: BaseException | None, deliveries: int
    ) -> None:
        code = err.code if isinstance(err, KariosError) else type(err).__name__
        reason = err.message if isinstance(err, KariosError) else str(err)
        headers = dict(raw.headers or {})
        headers.pop("Nats-Msg-Id", None)
        headers.update(
            {
                HEADER_DLQ_REASON: reason[:1000],
                HEADER_DLQ_CODE: code,
                HEADER_DLQ_DELIVERIES: str(deliveries),
                HEADER_DLQ_SUBJECT: raw.subject,
            }
        )
        await self.js.publish(self.subjects.dlq(raw.subject), raw.data, headers=headers, timeout=5.0)
        log.error(
            "command dead-lettered", subject=raw.subject, code=code, reason=reason, deliveries=deliveries
        )
        if env is not None:
            domain = raw.subject.split(".")[2]
            failed = CommandFailed(
                command_type=env.type, command_id=env.id, code=code, message=reason, deliveries=deliveries
            )
            await self.publish_event(
                failed,
                self.subjects.evt(domain, "command_failed", env.subject or env.id),
                cause=env,
                entity=env.subject,
            )

    def query_responder(self, subject: str, model: type[Contract], handler: QueryHandler) -> None:
        """Answer request/reply queries; every replica joins one queue group."""

        async def respond(body: Any, msg: NatsMessage) -> None:
            raw = msg.raw_message
            try:
                data = json.loads(raw.data or b"{}")
                payload = model.model_validate(data.get("data", data))
                result = await handler(payload)
                if isinstance(result, BaseModel):
                    result = result.model_dump(mode="json")
                elif isinstance(result, list):
                    result = [r.model_dump(mode="json") if isinstance(r, BaseModel) else r for r in result]
                reply = Reply(ok=True, result=result)
            except ValidationError as exc:
                first = exc.errors()[0]
                field_name = ".".join(str(p) for p in first.get("loc", ()))
                reply = Reply(
                    ok=False,
                    error=ErrorBody(
                        **ValidationFailed(f"{field_name}: {first.get('msg')}", field=field_name).to_dict()
                    ),
                )
            except KariosError as exc:
                reply = Reply(ok=False, error=ErrorBody(**exc.to_dict()))
            except Exception as exc:
                log.exception("query handler failed", subject=raw.subject)
                reply = Reply(ok=False, error=ErrorBody(code="INTERNAL", message=f"{type(exc).__name__}"))
            if raw.reply:
                await self.nc.publish(raw.reply, reply.model_dump_json().encode())

        self.broker.subscriber(subject, queue=f"{self.service}", no_reply=True)(respond)
