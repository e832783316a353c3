"""OpenTelemetry tracing for every service: a tracer provider, OTLP/HTTP export, job spans.

Export is off unless configured with the standard settings (read by the SDK and the exporter):

- ``OTEL_TRACES_EXPORTER=otlp`` or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` turns it on (``none`` turns it off);
- ``OTEL_EXPORTER_OTLP_PROTOCOL`` must be ``http/protobuf`` (the one transport installed);
- ``OTEL_SERVICE_NAME`` (else ``karios-<service>``), ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` (batching), ``OTEL_SDK_DISABLED`` as the spec says.

Long jobs never hold a span open: a job's work is a short span per run (child of the request's
trace, or of the job's stored ``traceparent`` when another replica resumes it), and a later
report about the job (an installer callback) is a span of its own request's trace *linked* to
the job's trace (:func:`job_span`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

_tracer_provider: TracerProvider | None = None


def otlp_wanted(env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether spans are exported over OTLP/HTTP, and why not (pure: reads ``env`` only)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False, "OTEL_SDK_DISABLED=true"
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters and "otlp" not in exporters:
        return False, f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']}"
    if not exporters and not (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False, "no OTEL_EXPORTER_OTLP_ENDPOINT"
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol != "http/protobuf":
        return False, f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} (only http/protobuf is installed)"
    return True, ""


def setup_tracing(service: str) -> trace.Tracer:
    """Install the process's tracer provider once (with the OTLP exporter when configured)."""
    global _tracer_provider
    if _tracer_provider is None:
        name = os.environ.get("OTEL_SERVICE_NAME") or f"karios-{service}"
        resource = Resource.create({"service.name": name, "service.namespace": "karios"})
        _tracer_provider = TracerProvider(resource=resource)  # registers its shutdown (flush) at exit
        wanted, why_not = otlp_wanted(os.environ)
        if wanted:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            _tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            log.info("traces exported over OTLP/HTTP", extra={"service_name": name})
        else:
            log.debug("traces not exported: %s", why_not)
        trace.set_tracer_provider(_tracer_provider)
    return trace.get_tracer(f"karios.{service}")


def flush_traces(timeout_ms: int = 5000) -> None:
    """Export what is buffered now (tests, a clean stop)."""
    if _tracer_provider is not None:
        _tracer_provider.force_flush(timeout_ms)


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def context_from_headers(headers: Mapping[str, str] | None) -> Any:
    return propagate.extract(dict(headers or {}))


def span_context_of(traceparent: str | None) -> trace.SpanContext | None:
    """The span a stored W3C ``traceparent`` names (None when absent or malformed)."""
    if not traceparent:
        return None
    ctx = trace.get_current_span(propagate.extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None


@contextmanager
def job_span(
    tracer_name: str,
    name: str,
    job_traceparent: str | None,
    *,
    link: bool = False,
    bind: Mapping[str, Any] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[trace.Span]:
    """A short span about one job, tied to the job's trace (its stored ``traceparent``).

    - inside a span of the same trace (the start command's handler): a child of it;
    - with no active span (a replica resuming the job): a child of the job's stored span;
    - ``link=True`` or inside another trace (an installer callback's request): a child of the
      current span with a *link* to the job's span.

    ``bind`` is bound in structlog's contextvars for the block (``job_id``, ``bmc_ip``…): every
    log line written meanwhile carries it, together with this span's ``trace_id``.
    """
    job_ctx = span_context_of(job_traceparent)
    current = trace.get_current_span().get_span_context()
    parent: Any = None
    links: list[trace.Link] = []
    if job_ctx is not None:
        if not current.is_valid and not link:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(job_ctx))
        elif not current.is_valid or current.trace_id != job_ctx.trace_id or link:
            links.append(trace.Link(job_ctx, {"karios.link": "job"}))
    tracer = trace.get_tracer(tracer_name)
    attrs = {f"karios.{k}": v for k, v in (bind or {}).items() if v not in (None, "")}
    attrs.update(attributes or {})
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with (
            tracer.start_as_current_span(name, links=links, attributes=attrs) as span,
            structlog.contextvars.bound_contextvars(**dict(bind or {})),
        ):
            yield span
    finally:
        if token is not None:
            otel_context.detach(token)


def job_binding(job_id: str, job: Any = None) -> dict[str, str]:
    """What a job's logs and spans carry: ``job_id`` and, when the row is known, ``bmc_ip``."""
    bound = {"job_id": job_id}
    bmc_ip = getattr(job, "bmc_ip", "") if job is not None else ""
    if bmc_ip:
        bound["bmc_ip"] = bmc_ip
    return bound


def bmc_span_attributes(vendor: str | None, bmc_ip: str) -> dict[str, str]:
    """Attributes of every Redfish call's span (see :mod:`karios.common.telemetry_http`)."""
    return {"karios.bmc.vendor": vendor or "generic", "karios.bmc.ip": bmc_ip}


@contextmanager
def step_span(tracer_name: str, name: str, **attributes: Any) -> Iterator[trace.Span]:
    """One step of a longer piece of work (a child of the current span; errors recorded)."""
    with trace.get_tracer(tracer_name).start_as_current_span(name, attributes=attributes) as span:
        yield span
