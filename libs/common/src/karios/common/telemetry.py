"""Tracing, metrics registry and structured logs for every service.

Logs: one pipeline for every line a service writes. structlog's own loggers and every standard
``logging`` logger (alembic, FastStream, asyncssh, uvicorn, httpx, ``warnings``) end in the same
root handler, whose :class:`structlog.stdlib.ProcessorFormatter` renders one JSON object per line
with ``timestamp``, ``level``, ``event``, ``service``, ``logger``, the ``trace_id``/``span_id`` of
the active span and whatever is bound in structlog's contextvars (``job_id``, ``node``, ``bmc_ip``).

Secrets never reach logs: :func:`redact` masks any key that looks like a secret and the password
of any URL (``nats://user:password@host``) in a string, and it is a processor of both chains
(structlog's and the standard library's); a rendered exception's URLs are masked too.

Tracing is in :mod:`karios.common.telemetry_tracing` (OTLP/HTTP export from the ``OTEL_*``
settings); the names services use are re-exported here.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import trace
from prometheus_client import CollectorRegistry, ProcessCollector

from karios.common.telemetry_http import server_attributes
from karios.common.telemetry_tracing import (
    context_from_headers,
    current_traceparent,
    setup_tracing,
)

__all__ = [
    "REDACTED",
    "context_from_headers",
    "current_traceparent",
    "get_logger",
    "new_registry",
    "redact",
    "server_attributes",
    "setup_logging",
    "setup_tracing",
]

_SECRET_KEY = re.compile(r"(pass(word)?|secret|token|(^|_)key$|auth_key|authorization|credential)", re.I)
REDACTED = "***"
#: The password of a URL with credentials (``scheme://user:password@``; the user is kept).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@/\s]+@")

#: Loggers that are chatty at INFO (asyncssh logs every channel and command over several lines,
#: httpx every request: the spans carry both): WARNING unless the service logs at DEBUG.
QUIET_LOGGERS = ("asyncssh", "httpx", "httpcore")
#: Loggers that install their own stream handlers; they are emptied and propagate to the root.
OWN_HANDLER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "faststream", "alembic")


def redact_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it masked (``nats://karios:***@127.0.0.1:4222``)."""
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text) if "://" in text else text


def redact(value: Any) -> Any:
    """Return ``value`` with secret-looking mapping keys and URL passwords masked, recursively."""
    if isinstance(value, str):
        return redact_url_passwords(value)
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


def _redact_exception(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # After format_exc_info: a traceback's text (an error naming a URL with its password).
    if isinstance(event_dict.get("exception"), str):
        event_dict["exception"] = redact_url_passwords(event_dict["exception"])
    return event_dict


def add_trace_ids(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """``trace_id`` / ``span_id`` (hex, as trace stores show them) of the span active now."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event_dict.setdefault("span_id", format(ctx.span_id, "016x"))
    return event_dict


class _Service:
    name = ""


def _add_service(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # contextvars carry it in tasks; threads started without a copied context get it here.
    if _Service.name:
        event_dict.setdefault("service", _Service.name)
    return event_dict


def _event_to_str(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event = event_dict.get("event")
    if not isinstance(event, str):
        event_dict["event"] = str(event)
    return event_dict


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_service,
        add_trace_ids,
        _redact_processor,
    ]


class _KariosHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler installed by :func:`setup_logging` (replaced, never stacked)."""


def setup_logging(service: str, level: str = "INFO", json: bool = True) -> None:
    """Route structlog and the standard library through one processor chain to stderr."""
    _Service.name = service
    shared = _shared_processors()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            _redact_exception,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, _event_to_str],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redact_exception,
            renderer,
        ],
    )
    handler = _KariosHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _KariosHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in OWN_HANDLER_LOGGERS:
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    logging.captureWarnings(True)
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)


def new_registry() -> CollectorRegistry:
    """A per-service Prometheus registry (tests can build many apps in one process)."""
    reg = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=reg)
    return reg
