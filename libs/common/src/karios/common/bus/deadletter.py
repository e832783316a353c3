"""Dead letters: a command given up on is copied to the DLQ with its reason, and announced.

Work-queue retention deletes a message on ``term``, so the copy (headers ``Karios-Dlq-*``) is
the only trace of it; a ``command_failed`` event tells the UI and the read models.

Both carry only a stable code and a human message (:func:`karios.common.errors.public_error`):
any viewer reads ``command_failed`` on SSE, so an unexpected exception's text (SQL, parameters,
class names) goes to the log, redacted, never into the event or the DLQ headers.
"""

from __future__ import annotations

from typing import Any, Protocol

from nats.js.api import PubAck

from karios.common.bus.envelope import Envelope
from karios.common.bus.subjects import Subjects
from karios.common.contracts.base import Event
from karios.common.errors import describe_for_log, public_error
from karios.common.telemetry import get_logger

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


class DeadLetterBus(Protocol):
    """What a dead letter needs of the bus; :class:`karios.common.bus.runtime.Bus` is one (the
    runtime imports this module, never the other way round)."""

    @property
    def subjects(self) -> Subjects: ...

    @property
    def js(self) -> Any: ...

    async def publish_event(
        self, event: Event, subject: str, *, cause: Envelope[Any] | None = None, entity: str = ""
    ) -> PubAck: ...


async def dead_letter(
    bus: DeadLetterBus, raw: Any, env: Envelope[Any] | None, err: BaseException | None, deliveries: int
) -> None:
    """Copy ``raw`` to the DLQ subject with the reason, then emit :class:`CommandFailed`."""
    public = public_error(err if err is not None else RuntimeError("no outcome"))
    code, reason = public.code, public.message
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
    await bus.js.publish(bus.subjects.dlq(raw.subject), raw.data, headers=headers, timeout=5.0)
    log.error(
        "command dead-lettered",
        subject=raw.subject,
        code=code,
        reason=reason,
        deliveries=deliveries,
        command_id=env.id if env is not None else None,
        cause=describe_for_log(err) if err is not None else None,
    )
    if env is not None:
        domain = raw.subject.split(".")[2]
        failed = CommandFailed(
            command_type=env.type, command_id=env.id, code=code, message=reason, deliveries=deliveries
        )
        await bus.publish_event(
            failed,
            bus.subjects.evt(domain, "command_failed", env.subject or env.id),
            cause=env,
            entity=env.subject,
        )
