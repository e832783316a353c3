"""bootapi: iPXE scripts, kickstarts/preseeds and the provisioned callback for PXE-booting hosts.

The one wiring point (``create_app``). Routes are thin: :class:`BootServer` holds the rules.
Contract: ``../shared/seeds/003_030e9310165fcfbd.txt`` (summarised in ``docs/bootapi.md``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from karios.bootapi.handlers import TEXT, router, wire
from karios.bootapi.hosts import BusHostSource, CachedHostSource, HostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.server import BootServer
from karios.bootapi.settings import BootapiSettings
from karios.bootapi.templatesync import GitTemplateSync, TemplateStore
from karios.common.http import install_error_handlers
from karios.common.oscatalog import TemplateSetError, default_set_dir, load_template_set
from karios.common.service import ServiceRuntime
from karios.common.settings import KariosSettings
from karios.common.telemetry import get_logger

SERVICE = "bootapi"
log = get_logger(__name__)

DESCRIPTION = """\
Boot path for PXE-booting hosts, served over **plain HTTP** (installers have no CA trust).

* `/ipxe/{mac}` never answers 404: unknown MACs, inventory errors and hosts with
  `pxe_enabled=false` get HTTP 200 and the fallback script (`BOOTAPI_UNKNOWN_MAC_FALLBACK`).
* `/ks/{ident}` answers 404 for an unknown host and 502 when the inventory fails.
* `POST /provisioned/{ident}` clears `pxe_enabled` (token-guarded).
"""

_ENDPOINTS = (
    ("/ipxe/", "ipxe"),
    ("/boot/ipxe", "ipxe"),
    ("/ks/", "ks"),
    ("/healthz", "healthz"),
    ("/readyz", "readyz"),
)


class RequestCounter:
    """Pure-ASGI middleware counting ``bootapi_http_requests_total{endpoint,status}`` (cheap under storms)."""

    def __init__(self, app: Any, metrics: BootapiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[..., Awaitable[Any]],
        send: Callable[..., Awaitable[Any]],
    ) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope.get("path", "")
        endpoint = next((name for prefix, name in _ENDPOINTS if path.startswith(prefix)), None)
        if endpoint is None:
            return await self.app(scope, receive, send)
        status = [500]

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.http_requests.labels(endpoint, f"{status[0] // 100}xx").inc()


class IpxeFastPath:
    """Pure-ASGI answer of ``GET /ipxe/{mac}`` (the boot storm's one hot route): the same
    ``BootServer.ipxe_script`` bytes and headers as the route, without FastAPI's routing,
    dependency and response layers (4x the requests/s, benchmarks/hot_paths.py). Anything else,
    and any exception, goes through the full app as before."""

    def __init__(self, app: Any, server: BootServer) -> None:
        self.app, self.server = app, server

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[..., Awaitable[Any]],
        send: Callable[..., Awaitable[Any]],
    ) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        mac = path[6:] if path.startswith("/ipxe/") and scope.get("method") == "GET" else ""
        if not mac or "/" in mac:
            return await self.app(scope, receive, send)
        try:
            body = (await self.server.ipxe_script(mac)).encode()
        except Exception:
            return await self.app(scope, receive, send)  # the route's own error handling
        headers = [(b"content-length", str(len(body)).encode()), (b"content-type", TEXT.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def initial_templates(boot: BootapiSettings, store: TemplateStore) -> None:
    """Embedded defaults first; a configured local directory replaces them if it parses."""
    store.publish(load_template_set(default_set_dir(), origin="embedded"))
    if boot.template_dir is not None:
        try:
            store.publish(load_template_set(boot.template_dir))
        except TemplateSetError as exc:
            store.metrics.template_sync_failures.inc()
            store.last_error = str(exc)
            log.error("template directory refused; serving the embedded set", error=str(exc))


def create_app(
    settings: KariosSettings | None = None,
    boot_settings: BootapiSettings | None = None,
    *,
    host_source: HostSource | None = None,
) -> FastAPI:
    settings = settings or KariosSettings()
    boot = boot_settings or BootapiSettings()
    metrics = BootapiMetrics()
    rt = ServiceRuntime(SERVICE, settings, registry=metrics.registry, use_bus=host_source is None)
    store = TemplateStore(metrics)
    initial_templates(boot, store)
    hosts = CachedHostSource(
        host_source or BusHostSource(rt.bus),
        metrics,
        ttl=boot.cache_ttl,
        negative_ttl=boot.cache_negative_ttl,
        max_entries=boot.cache_size,
    )
    server = BootServer(
        hosts=hosts,
        templates=store,
        metrics=metrics,
        base_url=boot.resolved_base_url(settings.host, settings.bootapi_port),
        fallback=boot.unknown_mac_fallback,
        provision_token=boot.provision_token.get_secret_value() if boot.provision_token else None,
    )
    sync = (
        GitTemplateSync(
            boot.template_git_url, store, interval=boot.template_git_interval, ref=boot.template_git_ref
        )
        if boot.template_git_url
        else None
    )
    if host_source is None:
        wire(rt.bus, hosts)
    lifespan = _lifespan(rt, server, sync)
    app = FastAPI(title="Karios bootapi", description=DESCRIPTION, version="0.1.0", lifespan=lifespan)
    app.state.runtime, app.state.server, app.state.store, app.state.hosts = rt, server, store, hosts
    app.state.sync = sync
    install_error_handlers(app)
    app.add_middleware(IpxeFastPath, server=server)  # inside RequestCounter: still counted
    app.add_middleware(RequestCounter, metrics=metrics)
    app.include_router(router)
    return app


def _lifespan(
    rt: ServiceRuntime, server: BootServer, sync: GitTemplateSync | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await rt.start()
        if sync is not None:
            sync.start()
        log.info(
            "service started",
            service=SERVICE,
            templates=server.templates.get().origin,
            fallback=server.fallback,
        )
        try:
            yield
        finally:
            if sync is not None:
                await sync.stop()
            await rt.stop()

    return lifespan


def openapi_document() -> dict[str, Any]:
    """The published contract (``docs/openapi/bootapi.json``), built without any I/O."""
    app = create_app(
        KariosSettings(dev_mode=True, log_json=True),
        BootapiSettings(_env_file=None),  # type: ignore[call-arg]
        host_source=_NoHosts(),
    )
    return app.openapi()


class _NoHosts:
    async def by_mac(self, mac: str) -> None:
        return None

    async def by_name(self, name: str) -> None:
        return None

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        return None
