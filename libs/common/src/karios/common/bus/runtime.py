"""The bus as a service sees it: one FastStream broker, publishing, requests and handlers.

- Commands: durable **pull** consumers shared by all replicas, explicit manual acks. The
  outcome of a handler is turned into ack / nak-with-delay / terminate by
  :func:`karios.common.errors.bus_disposition` (the one place). Terminated commands are
  copied to the DLQ with their reason (work-queue retention deletes them on ``term``) and
  a ``command_failed`` event is emitted.
- Queries: core NATS request/reply with a queue group; replies are :class:`Reply` JSON.
- Events: published to JetStream with ``Nats-Msg-Id`` = envelope id; read back in order
  (:meth:`Bus.subscribe_events`, :meth:`Bus.read_events`: SSE) or by a durable pull consumer
  shared by the replicas (:meth:`Bus.pull_events`: read models).
- Broadcasts: core NATS fan-out heard by every replica (no queue group, no stream), typed
  on both ends (:meth:`Bus.broadcast`, :meth:`Bus.broadcast_handler`).

Nothing outside this package touches the NATS client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from faststream.nats.security import NatsUserPassword
from nats.js.api import AckPolicy as ServerAckPolicy
from nats.js.api import ConsumerConfig, PubAck
from pydantic import BaseModel, SecretStr, ValidationError

from karios.common.bus.broadcasts import ApiTokenChanged
from karios.common.bus.commands import CommandHandler, HandlerContext, consume_command
from karios.common.bus.connection import UNAVAILABLE as _UNAVAILABLE
from karios.common.bus.connection import reconnect_backoff
from karios.common.bus.consumers import (
    EventHandler,
    ManyHandler,
    OrderedSubscription,
    PullConsumer,
    StreamCallback,
    StreamEvent,
    read_range,
    subscribe_ordered,
)
from karios.common.bus.deadletter import (
    HEADER_DLQ_CODE,
    HEADER_DLQ_DELIVERIES,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SUBJECT,
    CommandFailed,
)
from karios.common.bus.envelope import Envelope, RawEnvelope, wrap
from karios.common.bus.replies import QueryHandler, answer_query
from karios.common.bus.streams import EVT_MAX_BYTES, ensure_streams, reconcile_consumer
from karios.common.bus.subjects import Subjects
from karios.common.bus.tracing import producer_span, telemetry_middleware
from karios.common.contracts.base import Command, Contract, Event, Reply
from karios.common.errors import (
    ServiceUnavailable,
    StorageFull,
    error_from_dict,
    resource_error,
)
from karios.common.storage import StorageAlarm
from karios.common.telemetry import current_traceparent, get_logger

log = get_logger(__name__)

# Dead-letter names stay importable from here (the DLQ belongs to command handling); the
# broadcast contracts are imported so the AsyncAPI document (built from this module) lists them.
__all__ = [
    "HEADER_DLQ_CODE",
    "HEADER_DLQ_DELIVERIES",
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_SUBJECT",
    "ApiTokenChanged",
    "Bus",
    "CommandFailed",
    "HandlerContext",
]


M = TypeVar("M", bound=Contract)
E = TypeVar("E", bound=Event)
BroadcastHandler = Callable[[M], Awaitable[None]]


async def whole_message(msg: NatsMessage, _original: Any = None) -> NatsMessage:
    """FastStream decoder: a handler's one parameter is the message itself (its raw NATS
    message, headers, ack methods). Not ``msg: NatsMessage`` beside the body: FastStream
    resolves that parameter from its Context, and fast_depends runs that synchronous resolver
    in a worker thread under a task group — a thread hop per message, ~260 µs of CPU of the
    ~400 a request/reply cost in all (measured: 2.5k → 6.8k answers/s, one process both ends;
    ``tests/integration/test_bus_patterns.py`` counts the worker-thread hops of a burst)."""
    return msg


@dataclass
class Bus:
    service: str
    servers: list[str]
    subjects: Subjects
    max_deliver: int = 5
    retry_delay: float = 2.0
    ack_wait: float = 60.0
    request_timeout: float = 5.0
    replicas: int = 1
    events_max_bytes: int = EVT_MAX_BYTES
    #: NATS user and password (KARIOS_NATS_USER / KARIOS_NATS_PASSWORD); unset: none, or the URL's.
    user: str = ""
    password: SecretStr | None = field(default=None, repr=False)
    broker: NatsBroker = field(init=False)
    _consumers: list[tuple[str, ConsumerConfig]] = field(default_factory=list, init=False)
    _pulls: list[PullConsumer[Any]] = field(default_factory=list, init=False)
    _stopping: bool = field(default=False, init=False)
    #: On while JetStream refuses publishes for want of space (``/readyz`` check ``storage``).
    storage: StorageAlarm = field(default_factory=lambda: StorageAlarm("bus"), init=False)

    def __post_init__(self) -> None:
        security = None
        if self.user and self.password is not None:
            security = NatsUserPassword(self.user, self.password.get_secret_value())
        self.broker = NatsBroker(
            self.servers,
            security=security,
            connect_timeout=2,
            # Never give up: a NATS outage of any length ends by itself when the server returns.
            max_reconnect_attempts=-1,
            reconnect_to_server_handler=reconnect_backoff,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            middlewares=[telemetry_middleware()],
            # An explicit logger: FastStream's default one prints plain text past the JSON pipeline;
            # its per-message "Received"/"Processed" lines are DEBUG (the spans record deliveries).
            logger=_faststream_logger(),
            log_level=logging.DEBUG,
        )

    async def _on_disconnected(self) -> None:
        if not self._stopping:
            log.warning("bus disconnected; reconnecting with backoff", service=self.service)

    async def _on_reconnected(self) -> None:
        log.info("bus reconnected", service=self.service)

    @property
    def connected(self) -> bool:
        """Connected to NATS right now (False while reconnecting, before start and after stop)."""
        try:
            return bool(self.nc is not None and self.nc.is_connected)
        except Exception:  # no connection object yet
            return False

    def _require_connection(self, what: str) -> None:
        # Fail fast while reconnecting: the caller answers 503 + Retry-After instead of waiting.
        if not self.connected:
            raise ServiceUnavailable(f"the message bus is unavailable ({what}); try again shortly")

    @classmethod
    def from_settings(cls, settings: Any, service: str) -> Bus:
        return cls(
            service=service,
            servers=[s.strip() for s in settings.nats_url.split(",") if s.strip()],
            subjects=Subjects(settings.bus_prefix),
            max_deliver=settings.max_deliver,
            retry_delay=settings.retry_delay,
            request_timeout=settings.request_timeout,
            replicas=getattr(settings, "bus_replicas", 1),
            events_max_bytes=int(getattr(settings, "bus_events_max_bytes", EVT_MAX_BYTES)),
            user=getattr(settings, "nats_user", ""),
            password=getattr(settings, "nats_password", None),
        )

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        await self.broker.connect()
        js = self.js
        await ensure_streams(js, self.subjects, self.replicas, self.events_max_bytes)
        for stream, cfg in self._consumers:
            await reconcile_consumer(js, stream, cfg)
        await self.broker.start()
        # A PING/PONG round trip: the server has processed every SUB sent so far, so a broadcast
        # published (by any replica) after start() returns reaches this replica's handlers.
        await self.nc.flush(timeout=5)

    async def stop(self) -> None:
        self._stopping = True
        for consumer in self._pulls:
            await consumer.stop()  # idempotent: its owner may have stopped it already
        await self.broker.stop()

    @property
    def nc(self) -> Any:
        return self.broker.connection

    @property
    def js(self) -> Any:
        return self.broker.config.connection_state.stream

    async def healthy(self, timeout: float = 1.0) -> bool:  # noqa: ASYNC109 (a readiness bound)
        """Connected and every durable consumer still exists (a deleted one spins silently);
        answers within ``timeout`` (False when the server does not)."""
        if not self.connected:
            return False
        try:
            async with asyncio.timeout(timeout):
                for stream, cfg in self._consumers:
                    await self.js.consumer_info(stream, cfg.durable_name)
                for consumer in self._pulls:
                    await self.js.consumer_info(consumer.stream, consumer.durable)
        except Exception:
            return False
        return True

    # -- publishing ----------------------------------------------------------------
    async def _publish(self, env: Envelope[Any], subject: str) -> PubAck:
        self._require_connection("publish")
        with producer_span(self.service, env, subject):
            env.traceparent = current_traceparent()  # the consumer's parent is this send span
            try:
                ack = await self.js.publish(
                    subject, env.model_dump_json().encode(), headers=env.headers(), timeout=5.0
                )
            except nats.js.errors.APIError as exc:
                # The stream's store refused it: full (503 STORAGE_FULL, the alarm on) or a
                # stream with no leader for a moment (503); never a 500.
                short = resource_error(exc)
                if isinstance(short, StorageFull):
                    self.storage.record_full()
                    log.error("message store full: publish refused", subject=subject, error=str(exc)[:300])
                    raise short from exc
                if isinstance(exc, _UNAVAILABLE):
                    raise ServiceUnavailable(
                        "the message bus did not confirm the publish; try again shortly"
                    ) from exc
                raise
            except _UNAVAILABLE as exc:
                raise ServiceUnavailable(
                    "the message bus did not confirm the publish; try again shortly"
                ) from exc
            self.storage.record_ok()
            return ack

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
        self._require_connection("request")
        try:
            # Through the broker (not the raw client): traced, and in-memory under TestNatsBroker.
            msg = await self.broker.request(
                env.model_dump_json().encode(),
                subject,
                timeout=timeout or self.request_timeout,
                headers=env.headers(),
            )
        except nats.errors.NoRespondersError:
            raise ServiceUnavailable(f"no service answers {subject}") from None
        except (nats.errors.TimeoutError, TimeoutError):
            # Sent but unanswered: the responder may have acted (details.outcome says so).
            raise ServiceUnavailable(
                f"no answer on {subject} within {timeout or self.request_timeout}s",
                details={"outcome": "unknown"},
            ) from None
        except _UNAVAILABLE:
            raise ServiceUnavailable("the message bus is unavailable; try again shortly") from None
        except nats.errors.Error as exc:
            # Any other client-side failure of the bus (a connection closing or draining under
            # the request, its reply subscription torn down): still "the bus is away", never a 500.
            raise ServiceUnavailable(
                f"the message bus is unavailable ({type(exc).__name__}); try again shortly"
            ) from None
        try:
            answer = Reply.model_validate_json(msg.body)
        except ValidationError:
            # Something answered that is not a Karios responder (or one torn down mid-reply).
            raise ServiceUnavailable(
                f"an unreadable answer on {subject}", details={"outcome": "unknown"}
            ) from None
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

        async def consume(msg: Any) -> None:
            await consume_command(self, msg, model, handler)

        self.broker.subscriber(
            subject,
            stream=JStream(self.subjects.cmd_stream, declare=False),
            durable=durable,
            config=cfg,
            pull_sub=PullSub(batch_size=concurrency, timeout=1.0),
            ack_policy=AckPolicy.MANUAL,
            no_reply=True,
            decoder=whole_message,
        )(consume)

    def query_responder(
        self, subject: str, model: type[Contract], handler: QueryHandler, *, max_workers: int = 1
    ) -> None:
        """Answer request/reply queries; every replica joins one queue group. ``max_workers``: how
        many this replica answers at once (1: in order; a handler that waits on a BMC for seconds
        wants more, or one slow answer holds every later one)."""

        async def respond(msg: Any) -> bytes:
            reply = await answer_query(msg.raw_message.data, model, handler)
            # FastStream sends the returned bytes to the requester's reply subject.
            return reply.model_dump_json().encode()

        self.broker.subscriber(
            subject, queue=f"{self.service}", max_workers=max_workers, decoder=whole_message
        )(respond)

    # -- broadcast (every replica) ---------------------------------------------------
    async def broadcast(self, message: Contract, subject: str) -> None:
        """Core NATS fan-out to every replica listening on ``subject`` (no stream: nobody listening,
        nobody gets it — keep a durable backstop when the message matters)."""
        env = wrap(message, source=self.service)
        self._require_connection("broadcast")
        try:
            await self.broker.publish(env.model_dump_json().encode(), subject, headers=env.headers())
        except _UNAVAILABLE as exc:
            raise ServiceUnavailable("the message bus is unavailable; try again shortly") from exc

    def broadcast_handler(self, subject: str, model: type[M], handler: BroadcastHandler[M]) -> None:
        """Every replica (no queue group) gets each message on ``subject`` (wildcards allowed) as a
        ``model``; malformed messages and messages of another contract type are logged and dropped.

        Also hears events published to JetStream on ``subject`` (a stream publish is a core
        publish too): a cache every replica must invalidate subscribes here.
        """

        async def receive(msg: Any) -> None:
            raw = msg.raw_message
            try:
                env = RawEnvelope.model_validate_json(raw.data)
                if model.TYPE and env.type != model.TYPE:
                    return
                payload = model.model_validate(env.data)
            except ValidationError as exc:
                log.warning("ignoring a malformed broadcast", subject=raw.subject, error=str(exc)[:200])
                return
            await handler(payload)

        self.broker.subscriber(subject, no_reply=True, decoder=whole_message)(receive)

    # -- the event stream ------------------------------------------------------------
    async def last_event_seq(self) -> int:
        """Sequence of the newest stored event (0 for an empty stream)."""
        info = await self.js.stream_info(self.subjects.evt_stream)
        return int(info.state.last_seq)

    async def subscribe_events(
        self, callback: StreamCallback, *, subject: str | None = None, start_seq: int | None = None
    ) -> OrderedSubscription:
        """Ordered delivery of events (default: every event) from ``start_seq``, or new ones only."""
        return await subscribe_ordered(
            self.js, subject or self.subjects.all_events, callback, start_seq=start_seq
        )

    def read_events(
        self, after: int, until: int, *, subject: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Stored events with ``after < seq <= until`` in order (a short-lived ordered consumer)."""
        return read_range(self.js, subject or self.subjects.all_events, after, until)

    async def pull_events(
        self,
        durable: str,
        subject: str,
        model: type[E],
        handler: EventHandler[E] | ManyHandler,
        **options: Any,
    ) -> PullConsumer[E]:
        """Start a durable pull consumer shared by every replica: each ``model`` event on ``subject``
        is handled once (``handler(payload, envelope)``; with ``many=True`` a fetch's envelopes at
        once, ``handler(envelopes)``), acked on success, redelivered on error."""
        consumer = PullConsumer(
            self.js, self.subjects.evt_stream, durable, subject, model, handler, **options
        )
        await consumer.start()
        self._pulls.append(consumer)
        return consumer


class _EmptyFetchRetry(logging.Filter):
    """FastStream's task supervisor logs at ERROR, with a traceback, "Task-N raised an exception,
    retrying..." when a pull consumer's fetch ends in the plain ``TimeoutError`` nats-py raises for
    an empty fetch (FastStream suppresses only ``nats.errors.TimeoutError``). The task is restarted
    at once and nothing is lost, so a healthy idle consumer would page someone: that record is
    DEBUG. Any other exception of a task stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if (
            record.levelno >= logging.ERROR
            and isinstance(exc, TimeoutError)
            and "raised an exception, retrying" in str(record.msg)
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _faststream_logger() -> logging.Logger:
    logger = logging.getLogger("karios.bus.faststream")
    if not any(isinstance(f, _EmptyFetchRetry) for f in logger.filters):
        logger.addFilter(_EmptyFetchRetry())
    return logger
