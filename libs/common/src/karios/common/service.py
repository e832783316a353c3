"""What every Karios service process has: settings, logs, tracing, metrics, bus, database.

``ServiceRuntime`` is wired once by each service's ``create_app`` (the cosmicpython
``bootstrap``): tests pass their own settings instead of patching.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.common.bus.envelope import correlation_scope, new_id
from karios.common.bus.runtime import Bus
from karios.common.db import Database
from karios.common.db.migrate import ensure_database, upgrade
from karios.common.http import add_ops_routes, install_error_handlers
from karios.common.settings import KariosSettings
from karios.common.storage import BUS_HOLD_S, StorageAlarm, StorageCollector
from karios.common.telemetry import (
    context_from_headers,
    get_logger,
    new_registry,
    server_attributes,
    setup_logging,
    setup_tracing,
)

Hook = Callable[["ServiceRuntime"], Awaitable[None]]


@dataclass
class ServiceRuntime:
    name: str
    settings: KariosSettings
    schema: str | None = None
    migrations: Path | None = None
    use_bus: bool = True
    registry: CollectorRegistry = field(default_factory=new_registry)
    bus: Bus = field(init=False)
    db: Database | None = field(init=False, default=None)
    state: dict[str, Any] = field(default_factory=dict)
    extra_checks: dict[str, Callable[[], Awaitable[bool]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        setup_logging(self.name, self.settings.log_level, self.settings.log_json)
        self.tracer = setup_tracing(self.name)
        self.bus = Bus.from_settings(self.settings, self.name)
        if self.schema:
            self.db = Database(
                self.settings.database_url,
                connect_timeout=self.settings.db_connect_timeout,
                command_timeout=self.settings.db_command_timeout,
            )
        if self._storage_alarms():
            self.registry.register(StorageCollector(self._storage_alarms()))

    def _storage_alarms(self) -> list[StorageAlarm]:
        alarms = [self.bus.storage] if self.use_bus else []
        return alarms + ([self.db.storage] if self.db is not None else [])

    async def start(self) -> None:
        if self.db is not None and self.migrations is not None and self.schema:
            await ensure_database(self.settings.database_url)
            await asyncio.to_thread(upgrade, self.migrations, self.settings.database_url, self.schema)
        if self.use_bus:
            await self.bus.start()

    async def stop(self) -> None:
        if self.use_bus:
            await self.bus.stop()
        if self.db is not None:
            await self.db.close()

    async def ready(self) -> dict[str, bool]:
        """Every check at once, each bounded: readiness answers within ~``READY_CHECK_TIMEOUT_S``
        and tells the truth (a check that does not answer in time is ``False``), never hangs."""
        checks: dict[str, Callable[[], Awaitable[bool]]] = {}
        if self.use_bus:
            checks["bus"] = self.bus.healthy
        if self.db is not None:
            checks["database"] = self.db.healthy
        if self._storage_alarms():
            checks["storage"] = self.storage_ok
        checks.update(self.extra_checks)
        results = await asyncio.gather(*(_bounded(check) for check in checks.values()))
        return dict(zip(checks, results, strict=True))

    async def storage_ok(self) -> bool:
        """No store of this process is full. While the database's alarm is on, each call tries a
        probe write (success clears it: recovery without a restart); the bus's ends with the
        next stored publish or :data:`~karios.common.storage.BUS_HOLD_S` after the last refusal."""
        if self.db is not None and self.db.storage.active:
            await self.db.probe_write()
        if self.use_bus:
            self.bus.storage.expire(BUS_HOLD_S)
        return not any(alarm.active for alarm in self._storage_alarms())

    def not_ready_reasons(self) -> dict[str, str]:
        """Why a check fails, where the process knows more than ``False`` (``/readyz``'s ``reasons``)."""
        storage = [r for r in (alarm.reason() for alarm in self._storage_alarms()) if r]
        return {"storage": "; ".join(storage)} if storage else {}


READY_CHECK_TIMEOUT_S = 1.5


async def _bounded(check: Callable[[], Awaitable[bool]]) -> bool:
    try:
        async with asyncio.timeout(READY_CHECK_TIMEOUT_S):
            return bool(await check())
    except Exception:
        return False


def build_app(
    runtime: ServiceRuntime,
    *,
    title: str,
    description: str = "",
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
    version: str = "0.1.0",
) -> FastAPI:
    log = get_logger(runtime.name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        if on_start:
            await on_start(runtime)
        log.info("service started", service=runtime.name)
        try:
            yield
        finally:
            if on_stop:
                await on_stop(runtime)
            await runtime.stop()
            log.info("service stopped", service=runtime.name)

    # The request span is _instrument_http's (one per request, with the RED metrics); FastAPI's
    # native one would be a second, unparented server span of the same request.
    app = FastAPI(
        title=title, description=description, version=version, lifespan=lifespan, telemetry={"tracing": False}
    )
    app.state.runtime = runtime
    _instrument_http(app, runtime)
    install_error_handlers(app)
    add_ops_routes(app, runtime.ready, runtime.registry, reasons=runtime.not_ready_reasons)
    return app


def _instrument_http(app: FastAPI, runtime: ServiceRuntime) -> None:
    """One span per request (continuing an incoming ``traceparent``) and RED metrics by route."""
    requests = Counter(
        "karios_http_requests_total",
        "HTTP requests",
        ["route", "method", "status"],
        registry=runtime.registry,
    )
    duration = Histogram(
        "karios_http_request_duration_seconds",
        "HTTP request duration",
        ["route", "method"],
        registry=runtime.registry,
    )
    tracer = trace.get_tracer(f"karios.{runtime.name}")
    app.add_middleware(_Observe, tracer=tracer, requests=requests, duration=duration)
    app.state.http_metrics = HttpMetrics(requests, duration)


@dataclass(frozen=True)
class HttpMetrics:
    """The RED metrics ``_Observe`` keeps; a layer that answers before it (the gateway's fast
    reads) counts its answers here, so that every request is in them."""

    requests: Counter
    duration: Histogram


CORRELATION_HEADER = "x-correlation-id"
_CORRELATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def correlation_of(header: str | None) -> str:
    """The user action a request belongs to: the caller's ``X-Correlation-Id`` when it is a
    plain token (a console or script grouping its calls), else a new one. Every bus message the
    request causes carries it (``correlationid``), and the response names it."""
    if header and _CORRELATION_RE.fullmatch(header):
        return header
    return new_id()


class _Observe:
    """Pure ASGI (not ``@app.middleware("http")``): a ``BaseHTTPMiddleware`` layer costs every
    request a task group, a memory stream and task switches (a third of the gateway's CPU on
    an authenticated read, profiled under wrk)."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer, requests: Counter, duration: Histogram) -> None:
        self.app, self.tracer, self.requests, self.duration = app, tracer, requests, duration

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request = Request(scope)
        method = request.method
        status = 500  # an exception no handler took

        correlation = correlation_of(request.headers.get(CORRELATION_HEADER))

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-correlation-id", correlation.encode()))
                message = {**message, "headers": headers}
            await send(message)

        with (
            correlation_scope(correlation),
            self.tracer.start_as_current_span(
                method,
                context=context_from_headers(request.headers),
                kind=trace.SpanKind.SERVER,
                attributes=server_attributes(request),
            ) as span,
        ):
            try:
                await self.app(scope, receive, observed_send)
            finally:
                path = getattr(scope.get("route"), "path", "unmatched")
                span.update_name(f"{method} {path}")
                span.set_attributes({"http.route": path, "http.response.status_code": status})
                self.requests.labels(path, method, str(status)).inc()
                self.duration.labels(path, method).observe(time.perf_counter() - start)
