"""Plain HTTP on BOOTAPI_LISTEN_ADDR, plus an optional parallel HTTPS listener on the same app.

Both listeners run in this one process and event loop (one host cache, one set of metrics, one
bus connection), served by ``BOOTAPI_SERVER``: ``granian`` (default; its Rust HTTP layer, embedded
in this loop) or ``uvicorn``. benchmarks/hot_paths.py section 1b compares the two.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from karios.bootapi.app import create_app
from karios.bootapi.settings import BootapiSettings, split_addr
from karios.common.http import SERVER_KEEP_ALIVE_S
from karios.common.settings import KariosSettings

# granian's own lines go through the root logger, i.e. the service's JSON pipeline (telemetry.py).
_GRANIAN_LOGGING: dict[str, Any] = {
    "loggers": {
        "_granian": {"handlers": [], "level": "WARNING", "propagate": True},
        "granian.access": {"handlers": [], "level": "WARNING", "propagate": True},
    }
}


class _NotExperimental(logging.Filter):
    """Drop the embedded server's start-up banner ('Embedded server is experimental!')."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "experimental" not in record.getMessage()


class Listener(Protocol):
    started: bool
    should_exit: bool

    async def serve(self) -> None: ...


class GranianListener:
    """One granian server embedded in the running event loop; the same surface as
    ``uvicorn.Server`` (``started``, ``should_exit``, ``serve()``). ``lifespan`` runs the app's
    lifespan (the plain listener); ``started`` turns true once it completed (or, without a
    lifespan, once the socket is bound)."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        lifespan: bool,
        threads: int,
        ssl_cert: Path | None = None,
        ssl_key: Path | None = None,
    ) -> None:
        self.app, self.host, self.port, self.lifespan, self.threads = app, host, port, lifespan, threads
        self.ssl_cert, self.ssl_key = ssl_cert, ssl_key
        self.started = False
        self._exit = False
        self._server: Any = None

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value and not self._exit:
            # The app's own "about to stop" hooks (the gateway ends its SSE streams): granian
            # waits for every open response before the lifespan's shutdown, with no timeout.
            for hook in getattr(getattr(self.app, "state", None), "before_server_stop", ()):
                hook()
        self._exit = value
        if value and self._server is not None:
            self._server.stop()

    def _target(self) -> Callable[..., Awaitable[None]]:
        app, listener = self.app, self

        async def target(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "lifespan":
                return await app(scope, receive, send)

            async def mark(message: dict[str, Any]) -> None:
                if message["type"] == "lifespan.startup.complete":
                    listener.started = True
                await send(message)

            return await app(scope, receive, mark)

        return target

    async def serve(self) -> None:
        from granian.constants import HTTPModes, Interfaces, SSLProtocols
        from granian.server.embed import Server

        refuse_a_taken_port(self.host, self.port)
        if not any(isinstance(f, _NotExperimental) for f in logging.getLogger("_granian").filters):
            logging.getLogger("_granian").addFilter(_NotExperimental())
        self._server = server = Server(
            self._target() if self.lifespan else self.app,
            address=self.host,
            port=self.port,
            interface=Interfaces.ASGI if self.lifespan else Interfaces.ASGINL,
            runtime_threads=self.threads,
            http=HTTPModes.http1 if self.ssl_cert is None else HTTPModes.auto,
            websockets=False,
            backlog=2048,
            log_level="warning",  # type: ignore[arg-type]
            log_dictconfig=_GRANIAN_LOGGING,
            ssl_cert=self.ssl_cert,
            ssl_key=self.ssl_key,
            ssl_protocol_min=SSLProtocols.tls12,  # as uvicorn: iPXE's HTTPS speaks TLS 1.2
        )
        if not self.lifespan:
            server.on_startup(lambda: setattr(self, "started", True))
        if self._exit:
            return
        await server.serve()


def refuse_a_taken_port(host: str, port: int) -> None:
    """Exit (as uvicorn does on a bind error) when another process holds ``host:port``. granian
    binds with SO_REUSEPORT, so on its own a second, unrelated bootapi on the same port would
    start and silently split the iPXE/kickstart traffic with the first (issue 24, S4). A plain
    bind (no SO_REUSEPORT) fails while any socket is bound there; it is closed again at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT port is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(
                f"bootapi cannot listen on {host}:{port}: {exc.strerror} (another process holds "
                "the port; bootapi never shares one)"
            ) from None


def build_servers(settings: KariosSettings, boot: BootapiSettings) -> list[Listener]:
    """One server per listener; only the plain one runs the app's lifespan."""
    app = create_app(settings, boot)
    host, port = boot.resolved_listen_addr(settings.host, settings.bootapi_port)
    tls: tuple[str, int, Path, Path] | None = None
    if boot.tls_listen_addr:
        if not (boot.tls_cert_file and boot.tls_key_file):
            raise SystemExit("BOOTAPI_TLS_LISTEN_ADDR needs BOOTAPI_TLS_CERT_FILE and BOOTAPI_TLS_KEY_FILE")
        tls = (*split_addr(boot.tls_listen_addr), boot.tls_cert_file, boot.tls_key_file)
    if boot.server == "granian":
        servers: list[Listener] = [
            GranianListener(app, host, port, lifespan=True, threads=boot.server_threads)
        ]
        if tls:
            servers.append(
                GranianListener(
                    app, tls[0], tls[1], lifespan=False, threads=1, ssl_cert=tls[2], ssl_key=tls[3]
                )
            )
        return servers
    import uvicorn

    common: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "log_config": None,
        "timeout_keep_alive": SERVER_KEEP_ALIVE_S,
    }
    servers = [uvicorn.Server(uvicorn.Config(app, host=host, port=port, lifespan="on", **common))]
    if tls:
        servers.append(
            uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=tls[0],
                    port=tls[1],
                    lifespan="off",
                    ssl_certfile=str(tls[2]),
                    ssl_keyfile=str(tls[3]),
                    **common,
                )
            )
        )
    return servers


async def serve(settings: KariosSettings | None = None, boot: BootapiSettings | None = None) -> None:
    await run_servers(build_servers(settings or KariosSettings(), boot or BootapiSettings()))


def run(settings: KariosSettings | None = None, boot: BootapiSettings | None = None) -> None:
    """Serve until SIGTERM/SIGINT, on uvloop where it is installed (``karios run bootapi``).

    The fast event loop matters here: granian hands every request to this one loop, and under
    uvloop the cached ``/ipxe`` answers ~1.3x the requests/s of the default loop at 200
    connections (24,000 -> 30,000 req/s, benchmarks/hot_paths.py section 1).
    """
    on_uvloop(serve(settings, boot))


def on_uvloop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # not built for this platform
        asyncio.run(main)
        return
    uvloop.run(main)


async def run_servers(servers: list[Listener]) -> None:
    """Start the plain listener (it runs the lifespan) first, then the HTTPS one; stop together
    (SIGTERM/SIGINT: granian listeners get handlers here, uvicorn installs its own)."""
    loop = asyncio.get_running_loop()
    handled = []
    if any(isinstance(s, GranianListener) for s in servers):

        def stop() -> None:
            for s in servers:
                s.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop)
                handled.append(sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
    try:
        first = asyncio.create_task(servers[0].serve())
        while not servers[0].started and not first.done():  # noqa: ASYNC110 - the servers expose only a flag
            await asyncio.sleep(0.05)
        if servers[0].started:
            # Start-up's objects (modules, templates, the app) move out of the collector's view:
            # the full collections a request burst triggers then scan only what requests made
            # (p99 at 200 connections: ~70 -> ~20 ms, benchmarks/hot_paths.py 1b).
            gc.collect()
            gc.freeze()
        others = [asyncio.create_task(s.serve()) for s in servers[1:]]
        await first
        for s in servers[1:]:
            s.should_exit = True
        await asyncio.gather(*others)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    if not servers[0].started and not servers[0].should_exit:
        raise SystemExit("bootapi: the server stopped before it started (see the lines above)")
