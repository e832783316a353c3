"""Tracing, metrics registry and structured logs for every service.

Secrets never reach logs: :func:`redact` masks any key that looks like a secret, and it
is installed as a structlog processor.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, ProcessCollector

_SECRET_KEY = re.compile(r"(pass(word)?|secret|token|(^|_)key$|auth_key|authorization|credential)", re.I)
REDACTED = "***"


def redact(value: Any) -> Any:
    """Return ``value`` with secret-looking mapping keys masked, recursively."""
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _SECRET_KEY.search(k) and v not in (None, "", False)
                else redact(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    return value


def _redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return redact(event_dict)  # type: ignore[no-any-return]


def setup_logging(service: str, level: str = "INFO", json: bool = True) -> None:
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        _redact_processor,
    ]
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s {service} %(name)s %(levelname)s %(message)s",
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)


_tracer_provider: TracerProvider | None = None


def setup_tracing(service: str) -> trace.Tracer:
    """Install a tracer provider (exporters are configured by standard OTEL_* env vars)."""
    global _tracer_provider
    if _tracer_provider is None:
        _tracer_provider = TracerProvider(resource=Resource.create({"service.name": f"karios-{service}"}))
        trace.set_tracer_provider(_tracer_provider)
    return trace.get_tracer(f"karios.{service}")


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def context_from_headers(headers: Mapping[str, str] | None) -> Any:
    return propagate.extract(dict(headers or {}))


def new_registry() -> CollectorRegistry:
    """A per-service Prometheus registry (tests can build many apps in one process)."""
    reg = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=reg)
    return reg
