"""HTTP edge shared by every service: error mapping (the one place), ops routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.common.db.session import unavailable_database_error
from karios.common.errors import (
    KariosError,
    ServiceUnavailable,
    StorageFull,
    describe_for_log,
    http_status_for,
)
from karios.common.instance import INSTANCE_HEADER, instance_id
from karios.common.telemetry import get_logger

log = get_logger(__name__)

#: How long an idle keep-alive connection stays open on every service's HTTP server. Longer than
#: any client's own idle limit (httpx: 5 s, nginx upstream keepalive: 60 s, cloud balancers: 60 s):
#: with equal limits, a client reusing a connection at the moment the server closes it gets no
#: answer at all (a ``ReadError`` on a POST it cannot safely retry; seen in a loaded CI run).
SERVER_KEEP_ALIVE_S = 75

ReadyCheck = Callable[[], Awaitable[dict[str, bool]]]


class FieldError(BaseModel):
    field: str = Field(description="Dotted path of the field ('' = the body as a whole)")
    message: str


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer (validation errors included)."""

    code: str = Field(
        description="Stable error code, e.g. VALIDATION_FAILED, NOT_FOUND, SERVICE_UNAVAILABLE (503: try "
        "again after Retry-After), STORAGE_FULL (503: a disk or the message store is full; writes fail "
        "until an operator frees space)"
    )
    message: str = Field(description="Human message naming the field or the cause")
    retryable: bool = False
    field: str | None = Field(None, description="The field at fault, when one is")
    errors: list[FieldError] | None = Field(None, description="Every invalid field (validation errors)")
    details: Any = None
    detail: Any = Field(None, description="FastAPI-compatible copy: the message, or the errors")


def error_response(err: KariosError) -> JSONResponse:
    body = err.to_dict()
    # "detail" mirrors FastAPI's own shape so clients can read one key for every error.
    body["detail"] = err.message
    headers = {"Retry-After": str(err.retry_after)} if isinstance(err, ServiceUnavailable) else None
    return JSONResponse(status_code=http_status_for(err), content=body, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(KariosError)
    async def _karios(_req: Request, exc: KariosError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
            errors.append({"field": ".".join(loc), "message": e.get("msg", "invalid")})
        first = errors[0] if errors else {"field": "", "message": "invalid request"}
        return JSONResponse(
            status_code=422,
            content={
                "code": "VALIDATION_FAILED",
                "message": f"{first['field']}: {first['message']}" if first["field"] else first["message"],
                "field": first["field"],
                "retryable": False,
                "errors": errors,
                "detail": errors,
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return await framework_error_response(request, exc)

    app.add_middleware(SafeErrors)
    document_error_model(app)
    runtime = getattr(app.state, "runtime", None)
    settings = getattr(runtime, "settings", None)
    limit = getattr(settings, "max_request_body", None) or DEFAULT_MAX_BODY
    app.add_middleware(BodyLimit, max_bytes=limit)  # outermost: refuses before anything reads


#: The ``code`` of an error the framework raises (no route, wrong method, unreadable body, …).
HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    429: "TOO_MANY_REQUESTS",
}


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on the request's path (a path served by two
    routes, e.g. ``GET`` and ``POST /controlnode/tokens``, has both; Starlette names the first's).
    Each method is tried against the routes (``BaseRoute.matches``: included routers too)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]


async def framework_error_response(request: Request, exc: StarletteHTTPException) -> Response:
    """A 4xx/5xx the framework raises, in the :class:`ErrorResponse` shape: 404 for a path no route
    serves, 405 (``Allow``: every method of the path) for another method, including ``OPTIONS``,
    400 for a body that cannot be parsed (not UTF-8, say). Anything below 400 (the console's 303
    to its login page) is answered as FastAPI does."""
    status = exc.status_code
    if status < 400:
        return await http_exception_handler(request, exc)
    headers = dict(exc.headers or {})
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    path = request.url.path
    if status == 404 and message == "Not Found":
        message = f"no such path: {path}"
    elif status == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"{request.method} is not allowed on {path}; allowed: {', '.join(allowed)}"
    elif status == 400 and message == "There was an error parsing the body":
        message = "request body could not be parsed (it must be UTF-8 JSON)"
    code = HTTP_CODES.get(status, "INTERNAL" if status >= 500 else f"HTTP_{status}")
    body = {"code": code, "message": message, "retryable": status in (429, 503), "detail": message}
    return JSONResponse(status_code=status, content=body, headers=headers or None)


_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


def document_error_model(app: FastAPI) -> None:
    """The OpenAPI document names :class:`ErrorResponse` where FastAPI puts its own 422 shape
    (``HTTPValidationError``), which this edge never answers."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        if schemas.pop("HTTPValidationError", None) is not None:
            schemas.pop("ValidationError", None)
            error = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(error.pop("$defs", {}))
            schemas["ErrorResponse"] = error
            _replace_ref(doc["paths"], _FASTAPI_422, "#/components/schemas/ErrorResponse")
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _replace_ref(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and value == old:
                node[key] = new
            else:
                _replace_ref(value, old, new)
    elif isinstance(node, list):
        for item in node:
            _replace_ref(item, old, new)


def unexpected_error_response(path: str, exc: BaseException) -> JSONResponse:
    """503 when the database is stalled, gone or out of room (``STORAGE_FULL``), else an opaque
    500; the redacted cause is logged.

    The body never names the exception (nor SQL, parameters or a traceback).
    """
    unavailable = unavailable_database_error(exc)
    what = "unhandled error" if unavailable is None else "database unavailable"
    what = "storage full" if isinstance(unavailable, StorageFull) else what
    log.error(what, path=path, cause=describe_for_log(exc))
    if unavailable is not None:
        return error_response(unavailable)
    message = "internal error: the details are in the service log"
    return JSONResponse(
        status_code=500,
        content={"code": "INTERNAL", "message": message, "retryable": False, "detail": message},
    )


class SafeErrors:
    """ASGI middleware: an exception no handler took becomes :func:`unexpected_error_response`.

    Starlette's own last-resort handler answers too, but then re-raises so the server logs
    the full traceback and message (SQL with its parameters); this one stops it here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # too late for an error response (a stream broke): log and end it
                log.error("response failed mid-stream", path=scope.get("path"), cause=describe_for_log(exc))
                return
            await unexpected_error_response(str(scope.get("path")), exc)(scope, receive, send)


DEFAULT_MAX_BODY = 1024 * 1024


class BodyLimit:
    """ASGI middleware: a request body larger than ``max_bytes`` gets 413, whether announced by
    ``Content-Length`` (refused before it is read) or sent chunked (refused once the count passes).
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app, self.max_bytes = app, max_bytes

    def too_large(self) -> JSONResponse:
        message = f"request body too large: the limit is {self.max_bytes} bytes"
        return JSONResponse(
            status_code=413,
            content={"code": "PAYLOAD_TOO_LARGE", "message": message, "retryable": False, "detail": message},
            headers={"Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            if length.isdigit():
                await _drain(receive, 0)
                await self.too_large()(scope, receive, send)
            else:
                await _bad_length()(scope, receive, send)
            return
        seen = 0
        started = answered = False

        async def counting_receive() -> Message:
            # Past the limit: answer 413 here, then tell the app the client left (whatever it
            # makes of that is dropped by ``guarded_send``).
            nonlocal seen, answered
            message = await receive()
            if message["type"] == "http.request" and not answered:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    answered = True
                    if not started:
                        if message.get("more_body", False):
                            await _drain(receive, seen)
                        await self.too_large()(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, guarded_send)


#: Bytes of a refused body still read (and dropped) before answering 413: clients write the
#: whole body before they read, and a server that closes with unread data resets the
#: connection, so they would see a reset instead of the 413. Past this the connection is cut.
DRAIN_MAX = 32 * 1024 * 1024


async def _drain(receive: Receive, seen: int) -> None:
    while seen <= DRAIN_MAX:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _bad_length() -> JSONResponse:
    message = "Content-Length: not a number"
    return JSONResponse(
        status_code=400,
        content={"code": "BAD_REQUEST", "message": message, "field": "Content-Length", "detail": message},
    )


def add_ops_routes(
    app: FastAPI,
    ready: ReadyCheck,
    registry: CollectorRegistry,
    *,
    reasons: Callable[[], dict[str, str]] | None = None,
) -> None:
    """``/healthz``, ``/readyz`` (``{"ready", "checks"}``, plus ``reasons`` naming why a failing
    check fails when ``reasons`` knows, e.g. ``storage``: the disk is full) and ``/metrics``."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        checks = await ready()
        ok = all(checks.values())
        content: dict[str, Any] = {"ready": ok, "checks": checks}
        if not ok and reasons is not None:
            why = {name: text for name, text in reasons().items() if checks.get(name) is False}
            if why:
                content["reasons"] = why
        return JSONResponse(
            status_code=200 if ok else 503,
            content=content,
            headers={INSTANCE_HEADER: instance_id()},  # which process answered (karios up checks it)
        )

    ready_gauge = Gauge(
        "karios_service_ready",
        "Readiness checks at the last scrape (1 ok, 0 failing)",
        ["check"],
        registry=registry,
    )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        checks = await ready()  # bounded (ServiceRuntime.ready): a scrape sees what /readyz says
        for name, ok in {**checks, "all": all(checks.values())}.items():
            ready_gauge.labels(name).set(1 if ok else 0)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
