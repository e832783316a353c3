"""bootapi: iPXE scripts, kickstarts/preseeds and the provisioned callback for PXE-booting hosts.

The one wiring point (``create_app``). Routes are thin: :class:`BootServer` holds the rules.
Contract: ``../shared/seeds/003_030e9310165fcfbd.txt`` (summarised in ``docs/bootapi.md``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from karios.bootapi.core import DiscoveryBoot
from karios.bootapi.handlers import TEXT, router, wire
from karios.bootapi.hosts import BusHostSource, CachedHostSource, HostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.server import BootServer
from karios.bootapi.settings import BootapiSettings
from karios.bootapi.templatesync import GitTemplateSync, TemplateStore
from karios.common.discovery_token import DiscoveryTokens
from karios.common.http import install_error_handlers
from karios.common.oscatalog import TemplateSetError, default_set_dir, load_template_set
from karios.common.service import ServiceRuntime
from karios.common.settings import KariosSettings
from karios.common.telemetry import get_logger
from karios.common.telemetry_tracing import otlp_wanted

SERVICE = "bootapi"
log = get_logger(__name__)

DESCRIPTION = """\
Boot path for PXE-booting hosts, served over **plain HTTP** (installers have no CA trust).

* `/ipxe/{mac}` never answers 404: unknown MACs, inventory errors and hosts with
  `pxe_enabled=false` get HTTP 200 and the fallback script (`BOOTAPI_UNKNOWN_MAC_FALLBACK`).
  With `BOOTAPI_DISCOVERY_ENABLED` an unknown MAC gets the live environment in discovery mode
  instead (hardware report, then power off).
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


class BootapiApp(FastAPI):
    """The FastAPI app, answering ``GET /ipxe/{mac}`` (the boot storm's one hot route) before
    FastAPI's own ``__call__``: the same ``BootServer.ipxe_script`` bytes and headers as the route,
    counted in ``bootapi_http_requests_total`` like every other request, without FastAPI's
    per-request telemetry, middleware, routing, dependency and response layers
    (benchmarks/hot_paths.py section 1b). Anything else, and any exception, goes through the
    full app as before. ``ipxe_fast_path`` is off when spans are exported over OTLP, so that
    every request keeps its server span then (FastAPI's native tracing is bootapi's request span).
    """

    ipxe_fast_path: bool = True
    boot_server: BootServer | None = None

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[..., Awaitable[Any]],
        send: Callable[..., Awaitable[Any]],
    ) -> None:
        if (
            self.ipxe_fast_path
            and scope["type"] == "http"
            and scope["method"] == "GET"
            and scope["path"].startswith("/ipxe/")
            and self.boot_server is not None
        ):
            mac = scope["path"][6:]
            if mac and "/" not in mac and await self._answer_ipxe(self.boot_server, mac, send):
                return
        await super().__call__(scope, receive, send)  # type: ignore[arg-type]

    @staticmethod
    async def _answer_ipxe(server: BootServer, mac: str, send: Callable[..., Awaitable[Any]]) -> bool:
        try:
            body = (await server.ipxe_script(mac)).encode()
        except Exception:  # the route's own error handling answers it (status, log, metrics)
            return False
        await send({"type": "http.response.start", "status": 200, "headers": _ipxe_headers(body)})
        await send({"type": "http.response.body", "body": body})
        server.metrics.child(server.metrics.http_requests, "ipxe", "2xx").inc()
        return True


def _ipxe_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(len(body)).encode()), (b"content-type", _TEXT)]


_TEXT = TEXT.encode()


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


def discovery_options(settings: KariosSettings, boot: BootapiSettings) -> dict[str, Any]:
    """BootServer's discovery fields: off unless ``BOOTAPI_DISCOVERY_ENABLED`` (issue 27 item 3)."""
    if not boot.discovery_enabled:
        return {}
    return {
        "discovery": DiscoveryBoot(
            images_url=boot.resolved_discovery_images_url(
                settings.host, settings.provisioner_port, settings.provisioner_scheme
            ),
            suite=boot.discovery_suite,
            kernel_args=tuple(boot.discovery_kernel_args.split()),
        ),
        "discovery_tokens": DiscoveryTokens.from_settings(settings),
        "discovery_ttl": boot.discovery_token_ttl,
    }


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
        **discovery_options(settings, boot),
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
    app = BootapiApp(title="Karios bootapi", description=DESCRIPTION, version="0.1.0", lifespan=lifespan)
    app.boot_server = server
    app.ipxe_fast_path = not otlp_wanted(os.environ)[0]
    app.state.runtime, app.state.server, app.state.store, app.state.hosts = rt, server, store, hosts
    app.state.sync = sync
    install_error_handlers(app)
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
            discovery=server.discovery is not None,
        )
        try:
            yield
        finally:
            if sync is not None:
                await sync.stop()
            await rt.stop()
            log.info("service stopped", service=SERVICE)

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
