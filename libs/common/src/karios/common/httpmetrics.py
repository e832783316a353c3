"""Outgoing HTTP metrics: an httpx transport wrapper timing every request of one client.

``meter_client(client, observe)`` wraps the client's transport, so a request that fails without
a response (timeout, refused connection) is measured too — event hooks never see those. The
caller gives the labels (e.g. the BMC vendor) and ``observe(request, status, seconds)``, where
``status`` is the HTTP status or the exception's class name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

Observe = Callable[[httpx.Request, str, float], None]


class MeteredTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, observe: Observe) -> None:
        self.inner = inner
        self.observe = observe

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.perf_counter()
        try:
            response = await self.inner.handle_async_request(request)
        except Exception as exc:
            self.observe(request, type(exc).__name__, time.perf_counter() - t0)
            raise
        self.observe(request, str(response.status_code), time.perf_counter() - t0)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def meter_client(client: httpx.AsyncClient, observe: Observe) -> httpx.AsyncClient:
    """Measure every request ``client`` sends from now on (idempotent)."""
    inner = client._transport  # httpx has no public setter for it
    if not isinstance(inner, MeteredTransport):
        client._transport = MeteredTransport(inner, observe)
    return client
