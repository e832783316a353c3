"""Spans of the bus, by the OpenTelemetry messaging semantic conventions.

A publish to JetStream (command or event) is a ``PRODUCER`` span ``send <subject>`` whose context
travels in the envelope's ``traceparent`` (and header); a command delivery is a ``CONSUMER``
span ``process <subject>`` continuing it — one per delivery: under FastStream's own delivery span
(its telemetry middleware) that span is named and annotated instead of getting a child. Queries and
broadcasts go through FastStream, whose telemetry middleware makes the same pair; its span names
never carry a reply inbox (``_INBOX.<random>``: unbounded names) — see :func:`telemetry_middleware`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from faststream.nats.opentelemetry.provider import (
    NatsBatchTelemetrySettingsProvider,
    NatsTelemetrySettingsProvider,
)
from faststream.opentelemetry.middleware import TelemetryMiddleware
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from karios.common.bus.envelope import correlation_scope
from karios.common.telemetry import context_from_headers

TEMPORARY = "(temporary)"


def span_destination(subject: str) -> str:
    """A subject as a span name may carry it: a request's reply inbox is temporary (the
    OpenTelemetry messaging conventions' ``(temporary)``), never its random name."""
    return TEMPORARY if subject.startswith("_INBOX.") else subject


class _Provider(NatsTelemetrySettingsProvider):
    def get_publish_destination_name(self, cmd: Any) -> str:
        return span_destination(cmd.destination)

    def get_consume_destination_name(self, msg: Any) -> str:
        return span_destination(msg.raw_message.subject)


class _BatchProvider(NatsBatchTelemetrySettingsProvider):
    def get_publish_destination_name(self, cmd: Any) -> str:
        return span_destination(cmd.destination)

    def get_consume_destination_name(self, msg: Any) -> str:
        return span_destination(msg.raw_message[0].subject)


def _providers(msg: Any) -> Any:
    """FastStream's NATS provider factory, with our providers (KV/object watches: none)."""
    if isinstance(msg, Sequence):
        return _BatchProvider()
    return _Provider() if msg is None or isinstance(msg, Msg) else None


def telemetry_middleware() -> TelemetryMiddleware[Any]:
    """FastStream's NATS telemetry middleware with bounded span names."""
    return TelemetryMiddleware(settings_provider_factory=_providers, include_messages_counters=True)


def destination_template(subject: str, entity: str) -> str:
    """The subject with its entity (a job id, a node address) as ``{entity}``: span names stay
    few (the OpenTelemetry messaging conventions), the full subject is an attribute."""
    if entity and subject.endswith("." + entity):
        return subject[: -len(entity)] + "{entity}"
    return subject


def _attributes(env: Any, subject: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": "nats",
        "messaging.operation.type": operation,
        "messaging.operation.name": "publish" if operation == "send" else "process",
        "messaging.destination.name": subject,
        "messaging.destination.template": destination_template(subject, env.subject),
        "messaging.message.id": env.id,
        "messaging.message.conversation_id": env.correlationid,
        "cloudevents.event_type": env.type,
        "cloudevents.event_subject": env.subject,
    }


@contextmanager
def producer_span(service: str, env: Any, subject: str) -> Iterator[trace.Span]:
    tracer = trace.get_tracer(f"karios.{service}")
    with tracer.start_as_current_span(
        f"send {destination_template(subject, env.subject)}",
        kind=SpanKind.PRODUCER,
        attributes=_attributes(env, subject, "send"),
    ) as span:
        yield span


@contextmanager
def consumer_span(
    service: str, env: Any, subject: str, headers: Mapping[str, str] | None, deliveries: int = 1
) -> Iterator[trace.Span]:
    tracer = trace.get_tracer(f"karios.{service}")
    attrs = _attributes(env, subject, "process")
    attrs["messaging.nats.delivery_count"] = deliveries
    carrier = _carrier(env, headers)
    name = f"process {destination_template(subject, env.subject)}"
    with correlation_scope(env.correlationid):
        # Under FastStream's own delivery span (its telemetry middleware continued the same
        # header): that span is this delivery's one CONSUMER span — named and annotated here.
        current = trace.get_current_span()
        if current.is_recording() and getattr(current, "kind", None) == SpanKind.CONSUMER:
            current.update_name(name)
            current.set_attributes(attrs)
            yield current
            return
        # Otherwise continue the message's trace from its headers (or the enclosing span's).
        context = None if current.get_span_context().is_valid else context_from_headers(carrier)
        with tracer.start_as_current_span(
            name, context=context, kind=SpanKind.CONSUMER, attributes=attrs
        ) as span:
            yield span


def _carrier(env: Any, headers: Mapping[str, str] | None) -> dict[str, str]:
    """The message's trace context: its headers, else the envelope's ``traceparent``."""
    carrier = dict(headers or {})
    if "traceparent" not in carrier and getattr(env, "traceparent", None):
        carrier["traceparent"] = env.traceparent
    return carrier


@contextmanager
def consumer_spans(
    service: str, deliveries: Sequence[tuple[Any, str, Mapping[str, str] | None]]
) -> Iterator[list[trace.Span]]:
    """One ``CONSUMER`` span per delivery of a batch handled at once (a read model applying a
    fetch in one transaction): each ``(envelope, subject, headers)`` continues its own message's
    trace — none is made current, the batch's messages belong to different traces — and all end
    with the batch, an error recorded on each."""
    tracer = trace.get_tracer(f"karios.{service}")
    spans: list[trace.Span] = []
    for env, subject, headers in deliveries:
        attrs = _attributes(env, subject, "process")
        attrs["messaging.batch.message_count"] = len(deliveries)
        spans.append(
            tracer.start_span(
                f"process {destination_template(subject, env.subject)}",
                context=context_from_headers(_carrier(env, headers)),
                kind=SpanKind.CONSUMER,
                attributes=attrs,
            )
        )
    try:
        yield spans
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        for span in spans:
            span.end()


@contextmanager
def delivery_span(subject: str, headers: Mapping[str, str] | None) -> Iterator[trace.Span]:
    """A stored event delivered to an ordered subscriber (the SSE relay), from its headers only
    (named by the CloudEvents type: the subject names the entity)."""
    h = dict(headers or {})
    attrs = {
        "messaging.system": "nats",
        "messaging.operation.type": "receive",
        "messaging.destination.name": subject,
        "messaging.message.id": h.get("Nats-Msg-Id", ""),
        "cloudevents.event_type": h.get("ce-type", ""),
    }
    with trace.get_tracer("karios.bus").start_as_current_span(
        f"deliver {h.get('ce-type', 'event')}",
        context=context_from_headers(h),
        kind=SpanKind.CONSUMER,
        attributes=attrs,
    ) as span:
        yield span
