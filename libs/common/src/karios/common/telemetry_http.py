"""Client spans for outbound HTTP (Redfish) calls: an httpx transport wrapper.

:func:`trace_http_client` wraps an ``httpx.AsyncClient``'s transports so every request is a
``CLIENT`` span named ``{method} {url.template}`` (the caller's path template: ids are
``{id}``, so span names stay few) or by its method alone when there is no template, with the
OpenTelemetry HTTP semantic conventions
(``http.request.method``, ``url.full``, ``server.address``, ``server.port``,
``http.response.status_code``, ``error.type``, ``http.request.resend_count`` for a retry of
the same request after a failure) and the caller's attributes (``karios.bmc.vendor``…).
Headers and bodies are never recorded (they hold credentials and session tokens).
A status the caller expects (:func:`expected_statuses`: a BMC without sessions answering the
session login 401 before basic auth) is recorded but is not an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

TRACER = "karios.http"

_EXPECTED: ContextVar[frozenset[int]] = ContextVar("karios_http_expected", default=frozenset())


@contextmanager
def expected_statuses(*codes: int) -> Iterator[None]:
    """Responses with these codes inside the block are outcomes the caller handles (a fallback),
    not errors: their spans keep the status code and no error status."""
    token = _EXPECTED.set(frozenset(codes))
    try:
        yield
    finally:
        _EXPECTED.reset(token)


class TracedTransport(httpx.AsyncBaseTransport):
    """Delegates to ``inner``; one span per request attempt."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        attributes: Mapping[str, Any],
        template: Callable[[str], str] | None = None,
    ) -> None:
        self.inner = inner
        self.attributes = dict(attributes)
        self.template = template
        self._last: tuple[str, str] | None = None  # the last request that failed
        self._resends = 0

    def _resend_count(self, key: tuple[str, str]) -> int:
        if self._last == key:
            self._resends += 1
        else:
            self._resends = 0
        return self._resends

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (request.method, url.path)
        attrs: dict[str, Any] = {
            "http.request.method": request.method,
            "url.full": str(url.copy_with(query=None)),
            "url.path": url.path,
            "server.address": url.host,
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            **self.attributes,
        }
        name = request.method
        if self.template is not None:
            attrs["url.template"] = self.template(url.path)
            name = f"{request.method} {attrs['url.template']}"
        resend = self._resend_count(key)
        if resend:
            attrs["http.request.resend_count"] = resend
        tracer = trace.get_tracer(TRACER)
        with tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attrs, record_exception=False
        ) as span:
            try:
                response = await self.inner.handle_async_request(request)
            except Exception as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                self._last = key
                raise
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 400 and response.status_code not in _EXPECTED.get():
                span.set_attribute("error.type", str(response.status_code))
                span.set_status(Status(StatusCode.ERROR))
            self._last = key if response.status_code >= 500 or response.status_code in (409, 429) else None
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def trace_http_client(
    client: object, *, template: Callable[[str], str] | None = None, **attributes: Any
) -> object:
    """Wrap every transport of ``client`` (idempotent; anything but an httpx client is left
    alone: a test double without HTTP); returns the client. ``template`` maps a URL path to its
    route template (the span name and ``url.template``)."""
    if not isinstance(client, httpx.AsyncClient):
        return client
    transport = client._transport  # httpx has no public hook for the transport
    if not isinstance(transport, TracedTransport):
        client._transport = TracedTransport(transport, attributes, template)
    client._mounts = {  # proxies from the environment are mounts
        pattern: (
            TracedTransport(t, attributes, template)
            if t is not None and not isinstance(t, TracedTransport)
            else t
        )
        for pattern, t in client._mounts.items()
    }
    return client


def server_attributes(request: Any) -> dict[str, Any]:
    """HTTP server span attributes of a Starlette request (no headers, no query string)."""
    client = getattr(request, "client", None)
    attrs: dict[str, Any] = {
        "http.request.method": request.method,
        "url.path": request.url.path,
        "url.scheme": request.url.scheme,
        "server.address": request.url.hostname or "",
        "network.protocol.version": request.scope.get("http_version", "1.1"),
    }
    if request.url.port:
        attrs["server.port"] = request.url.port
    if client is not None:
        attrs["client.address"] = client.host
    return attrs
