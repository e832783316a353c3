"""Shared reads answered before FastAPI's layers, for every route that keeps its answer.

Every read route whose answer is shared (:mod:`karios.api_gateway.readcache`: the provision
queue, the node list and a node, the fabric's configuration, its latest job and drift, the
discovered servers) marks the request with the key it answered from. :class:`FastReads`, the
outermost middleware, remembers for that exact request target (path and query string, byte for
byte) which key answered it, the route's path template and the least role the route's
``require(...)`` names — learnt from the route FastAPI chose, never written by hand. The next GET
of the same target is answered here when, and only when, FastAPI would give the same bytes: an
``Authorization: Bearer`` token the token cache already verified
(:class:`~karios.api_gateway.auth.TokenCache`), a role at least the route's, no request body, and
an answer the read cache still holds (or is loading now). The status, body and headers are the
route's (``content-length``, ``content-type: application/json``, ``x-correlation-id``).
Anything else — no token, an unknown or revoked one, a console cookie, a role too low, a target
not answered from a shared read before, an answer no longer kept, an error — goes to FastAPI
unchanged, so every error a person reads is the route's own, and a route that stops sharing its
answer is never answered here again.

What it saves: FastAPI's middleware, dependencies, validation and response objects (~250 µs of
CPU per request against ~15 µs here; benchmarks/hot_paths.py section 2 measures both). A fast
answer is counted in ``karios_http_requests_total`` and ``karios_http_request_duration_seconds``
under the route's template like any other answer, and in ``karios_gateway_fast_reads_total``; it
has no request span, so the fast path is off when spans are exported (``OTEL_*``, as bootapi's
``/ipxe``), and every request then keeps its span.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from karios.api_gateway.auth import Role, TokenCache, required_role
from karios.api_gateway.readcache import ANSWERED_FROM, ReadCache
from karios.common.service import HttpMetrics, correlation_of
from karios.common.telemetry_tracing import otlp_wanted

_JSON = b"application/json"
#: Request targets remembered (the oldest dropped first).
TARGETS_MAX = 10_000


def _correlation(scope: Scope) -> str:
    given = next((v for k, v in scope["headers"] if k == b"x-correlation-id"), None)
    return correlation_of(given.decode("latin-1") if given is not None else None)


def bearer_token(scope: Scope) -> str | None:
    """The ``Authorization: Bearer`` token as FastAPI's ``HTTPBearer`` reads it (first header),
    or None if the request has none or carries a body (the route's body limit answers that)."""
    token = None
    found = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            if not found:
                found = True
                scheme, _, param = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    token = param.strip() or None
        elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return None
    return token


def route_role(route: object) -> Role | None:
    """The least role of an ``APIRoute``'s ``require(...)`` dependencies (None: it has none, and
    is never answered here)."""
    if not isinstance(route, APIRoute):
        return None
    found = [r for d in route.dependant.dependencies if (r := required_role(d.call)) is not None]
    return max(found) if found else None


def fast_path_wanted() -> bool:
    """Off when spans are exported: a fast answer has no request span."""
    return not otlp_wanted(os.environ)[0]


def fast_reads_counter(registry: CollectorRegistry) -> Counter:
    """``karios_gateway_fast_reads_total{route}``: the reads answered here (the rest of
    ``karios_http_requests_total`` went through FastAPI)."""
    return Counter(
        "karios_gateway_fast_reads_total",
        "Authenticated reads answered before FastAPI's routing (api_gateway.fastpath)",
        ["route"],
        registry=registry,
    )


@dataclass(frozen=True)
class Target:
    """What answered one request target through FastAPI: the shared read's key, the route's
    template and least role, and the route's pre-resolved metric children."""

    key: str
    role: Role
    ok: Callable[[], None]
    seconds: Callable[[float], None]
    fast: Callable[[], None]


class FastReads:
    """ASGI middleware, outermost: answers the shared reads it can (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: TokenCache,
        reads: ReadCache,
        metrics: HttpMetrics,
        answered: Counter,
        enabled: bool = True,
    ) -> None:
        self.app, self.tokens, self.reads, self.enabled = app, tokens, reads, enabled
        self.metrics, self.answered = metrics, answered
        self.targets: OrderedDict[tuple[str, bytes], Target] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (self.enabled and scope["type"] == "http" and scope["method"] == "GET"):
            await self.app(scope, receive, send)
            return
        where = (scope["path"], scope.get("query_string", b""))
        target = self.targets.get(where)
        if target is not None:
            start = time.perf_counter()
            if await self._answer(target, scope, send):
                target.ok()
                target.fast()
                target.seconds(time.perf_counter() - start)
                return
        await self.app(scope, receive, send)
        key = scope.get(ANSWERED_FROM)
        if key is not None and target is None:
            self._learn(where, key, scope.get("route"))

    def _learn(self, where: tuple[str, bytes], key: str, route: object) -> None:
        """Remember that FastAPI answered ``where`` from the shared read ``key`` via ``route``."""
        role = route_role(route)  # once per target: a few attribute reads
        template = getattr(route, "path_format", None)
        if role is None or not isinstance(template, str):
            return
        self.targets[where] = Target(
            key,
            role,
            self.metrics.requests.labels(template, "GET", "200").inc,
            self.metrics.duration.labels(template, "GET").observe,
            self.answered.labels(template).inc,
        )
        while len(self.targets) > TARGETS_MAX:
            self.targets.popitem(last=False)

    async def _answer(self, target: Target, scope: Scope, send: Send) -> bool:
        """Send the answer and return True, or send nothing and return False."""
        token = bearer_token(scope)
        principal = self.tokens.cached(token) if token else None
        if principal is None or principal.role < target.role:
            return False
        body = self.reads.kept(target.key)
        if body is None:
            body = await self.reads.joined(target.key)
        if not isinstance(body, bytes):
            return False
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", _JSON),
                    (b"x-correlation-id", _correlation(scope).encode()),  # as _Observe answers
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return True
