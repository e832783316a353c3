"""HTTP edge shared by every service: error mapping (the one place), ops routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.common.db.session import unavailable_database_error
from karios.common.errors import KariosError, ServiceUnavailable, describe_for_log, http_status_for
from karios.common.telemetry import get_logger

log = get_logger(__name__)

ReadyCheck = Callable[[], Awaitable[dict[str, bool]]]


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

    app.add_middleware(SafeErrors)


def unexpected_error_response(path: str, exc: BaseException) -> JSONResponse:
    """503 when the database is stalled or gone, else an opaque 500; the redacted cause is logged.

    The body never names the exception (nor SQL, parameters or a traceback).
    """
    unavailable = unavailable_database_error(exc)
    log.error(
        "database unavailable" if unavailable else "unhandled error", path=path, cause=describe_for_log(exc)
    )
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


def add_ops_routes(app: FastAPI, ready: ReadyCheck, registry: CollectorRegistry) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        checks = await ready()
        ok = all(checks.values())
        return JSONResponse(status_code=200 if ok else 503, content={"ready": ok, "checks": checks})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
