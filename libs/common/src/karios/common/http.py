"""HTTP edge shared by every service: error mapping (the one place), ops routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from karios.common.errors import KariosError, http_status_for
from karios.common.telemetry import get_logger

log = get_logger(__name__)

ReadyCheck = Callable[[], Awaitable[dict[str, bool]]]


def error_response(err: KariosError) -> JSONResponse:
    body = err.to_dict()
    # "detail" mirrors FastAPI's own shape so clients can read one key for every error.
    body["detail"] = err.message
    return JSONResponse(status_code=http_status_for(err), content=body)


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

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", error_type=type(exc).__name__)
        return JSONResponse(
            status_code=500,
            content={
                "code": "INTERNAL",
                "message": "internal error",
                "retryable": False,
                "detail": "internal error",
            },
        )


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
