"""The gateway's hot authenticated reads, answered before FastAPI's routing when nothing can differ.

``GET /controlnode/tokens/self``, ``/controlnode/provision/queue``, ``/controlnode/nodes`` and
``/controlnode/nodes/{node_ip}`` are what dashboards and ``karios`` poll. Their answers are
already shared (:mod:`karios.api_gateway.readcache`) and their tokens verified once
(:class:`~karios.api_gateway.auth.TokenCache`); what a request still cost was FastAPI itself
(middleware, routing, dependencies, validation, response objects: ~270 µs of CPU in-process
against ~12 µs here, so ~2,300 req/s and a p99 of 0.3–1.2 s at 100 connections under wrk;
benchmarks/hot_paths.py section 2 measures both).

:class:`FastReads` answers such a GET itself when, and only when, the route would give the
same bytes: an ``Authorization: Bearer`` token the cache already verified, whose role is at
least the one the route's ``require(...)`` names (read from the route itself), and an answer
the read cache holds (or is loading now). The status, body and headers are the route's
(``content-length``, ``content-type: application/json``). Anything else — no token, an
unknown or revoked one, a console cookie, a role too low, a query it does not parse, a request
body, an answer not kept, an error — goes to FastAPI unchanged, so every error a person reads
is the route's own. A fast answer runs no FastAPI layer: :class:`FastReads` is the outermost
middleware (only Starlette's ``ServerErrorMiddleware`` is outside it). It is counted in
``karios_http_requests_total`` and ``karios_http_request_duration_seconds`` under the route's
path like any other answer, and in ``karios_gateway_fast_reads_total``; it has no request
span, so the fast path is off when spans are exported (``OTEL_*``, as bootapi's ``/ipxe``), and
every request then keeps its span.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from karios.api_gateway.auth import Role, TokenCache, required_role
from karios.api_gateway.readcache import QUEUE_KEY, ReadCache, node_key_of, nodes_page_key
from karios.api_gateway.routes.tokens import WhoAmI
from karios.common.limits import IP_MAX
from karios.common.netaddr import normalize_ip
from karios.common.service import HttpMetrics, correlation_of
from karios.common.telemetry_tracing import otlp_wanted

NODES = "/controlnode/nodes"
NODE = "/controlnode/nodes/{node_ip}"
QUEUE = "/controlnode/provision/queue"
WHOAMI = "/controlnode/tokens/self"
#: The routes answered here, by path template.
FAST_ROUTES = (WHOAMI, QUEUE, NODES, NODE)
_NODE_PREFIX = NODES + "/"
#: ``/controlnode/nodes`` query bounds (routes/nodes.py ``list_nodes``).
_OFFSET_MAX, _LIMIT_MIN, _LIMIT_MAX, _LIMIT_DEFAULT = 2_147_483_647, 1, 1000, 100
_JSON = b"application/json"


def nodes_key(query: bytes) -> str | None:
    """The read-cache key of ``GET /controlnode/nodes?<query>`` (routes/nodes.py spells it
    ``nodes:{offset}:{limit}``), or None for anything but plain ``offset``/``limit`` decimals
    within their bounds, each at most once (the route answers those, 422 included)."""
    values = {"offset": 0, "limit": _LIMIT_DEFAULT}
    seen: set[str] = set()
    for pair in query.split(b"&") if query else ():
        name, eq, raw = pair.partition(b"=")
        key = name.decode("latin-1")
        if not eq or key not in values or key in seen or not raw.isdigit() or len(raw) > 10:
            return None
        if len(raw) > 1 and raw[:1] == b"0":
            return None
        seen.add(key)
        values[key] = int(raw)
    offset, limit = values["offset"], values["limit"]
    if offset > _OFFSET_MAX or not _LIMIT_MIN <= limit <= _LIMIT_MAX:
        return None
    return nodes_page_key(offset, limit)


def node_key(segment: str) -> str | None:
    """The read-cache key of ``GET /controlnode/nodes/{node_ip}`` (``node:{normalized ip}``)."""
    if not segment or "/" in segment or len(segment) > IP_MAX:
        return None
    try:
        return node_key_of(normalize_ip(segment))
    except ValueError:
        return None


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


def route_roles(routes: Iterable[BaseRoute]) -> dict[str, Role]:
    """The least role of each fast route's GET among ``routes`` (an ``APIRouter``'s, paths with
    its prefix), read from its ``require(...)`` dependency; a route without one (or without a
    GET) is left out, so it is never answered here."""
    roles: dict[str, Role] = {}
    for route in routes:
        if isinstance(route, APIRoute) and route.path in FAST_ROUTES and "GET" in route.methods:
            found = [r for d in route.dependant.dependencies if (r := required_role(d.call)) is not None]
            if found:
                roles[route.path] = max(found)
    return roles


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
class _Counted:
    """One route's pre-resolved metric children (``labels()`` costs a lock and a dict per call)."""

    ok: Callable[[], None]
    seconds: Callable[[float], None]
    fast: Callable[[], None]


class FastReads:
    """ASGI middleware, outermost: answers the hot reads it can (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: TokenCache,
        reads: ReadCache,
        metrics: HttpMetrics,
        roles: dict[str, Role],
        answered: Counter,
        enabled: bool = True,
    ) -> None:
        self.app, self.tokens, self.reads, self.roles, self.enabled = app, tokens, reads, roles, enabled
        self.counted = {
            path: _Counted(
                metrics.requests.labels(path, "GET", "200").inc,
                metrics.duration.labels(path, "GET").observe,
                answered.labels(path).inc,
            )
            for path in roles
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http" and scope["method"] == "GET":
            start = time.perf_counter()
            route = await self._answer(scope, send)
            if route is not None:
                counted = self.counted[route]
                counted.ok()
                counted.fast()
                counted.seconds(time.perf_counter() - start)
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, send: Send) -> str | None:
        """Send the answer and return its route, or send nothing and return None."""
        path: str = scope["path"]
        query: bytes = scope.get("query_string", b"")
        if path == WHOAMI and not query:
            route, key = WHOAMI, None
        elif path == QUEUE and not query:
            route, key = QUEUE, QUEUE_KEY
        elif path == NODES:
            route, key = NODES, nodes_key(query)
        elif path.startswith(_NODE_PREFIX) and not query:
            route, key = NODE, node_key(path[len(_NODE_PREFIX) :])
        else:
            return None
        role = self.roles.get(route)
        if role is None or (route != WHOAMI and key is None):
            return None
        token = bearer_token(scope)
        principal = self.tokens.cached(token) if token else None
        if principal is None or principal.role < role:
            return None
        if key is None:  # tokens/self: the route's own model, encoded as FastAPI encodes it
            body = WhoAmI(name=principal.name, role=principal.role.name).model_dump_json().encode()
        else:
            body = self.reads.kept(key)
            if body is None:
                body = await self.reads.joined(key)
            if not isinstance(body, bytes):
                return None
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
        return route
