"""One service's process: ``karios run <service>``, and the same run in a child ``karios up`` forks.

:func:`run_service` is what ``karios run`` does (settings from the environment, the app, its HTTP
server until SIGTERM). :func:`preload` imports the services' code once in ``karios up``, which
then forks each service (and each restart) from itself (:mod:`karios.cli.supervisor`,
``fork_process``) instead of starting a new interpreter that imports it all again: ~80 % of a
service's start-up CPU was its imports (docs/DEVELOPING.md).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path
from typing import Any

from karios.cli.services import SERVICES, server_tls

#: What a service's start imports beyond its app module (its HTTP server and event loop).
SERVER_MODULES = (
    "uvicorn",
    "uvicorn.config",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.loops.uvloop",
    "karios.bootapi.listeners",
    "karios.bootapi.settings",
    "karios.common.http",
    "karios.common.settings",
)


def preload(names: list[str]) -> dict[str, str]:
    """Import the named services' app modules and the servers they run on; ``{service: error}``
    for those that would not import (``karios up`` starts them as their own interpreter, whose
    log then says why)."""
    failed: dict[str, str] = {}
    for module in SERVER_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    for name in names:
        try:
            importlib.import_module(SERVICES[name].module)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


def run_service(name: str, port: int | None = None, server: str | None = None) -> None:
    """Run service ``name`` until it is stopped (``karios run``): ``port`` overrides its port
    setting, ``server`` ("uvicorn" / "granian") its default HTTP server."""
    from karios.common.settings import KariosSettings

    spec = SERVICES[name]
    settings = KariosSettings()
    if spec.name == "bootapi":
        # bootapi honours its seed's BOOTAPI_LISTEN_ADDR (--port overrides it), the optional
        # parallel HTTPS listener and BOOTAPI_SERVER (granian by default).
        from karios.bootapi.listeners import run as run_bootapi
        from karios.bootapi.settings import BootapiSettings

        boot = BootapiSettings(**({"listen_addr": f"{settings.host}:{port}"} if port else {}))
        run_bootapi(settings, boot)  # on uvloop, as uvicorn runs the other services
        return
    listen_port = port or int(getattr(settings, spec.port_setting))
    tls = server_tls(spec.name, settings)
    if (server or spec.server) == "granian":
        from karios.bootapi.listeners import GranianListener, on_uvloop, run_servers

        certs = {"ssl_cert": Path(tls["ssl_certfile"]), "ssl_key": Path(tls["ssl_keyfile"])} if tls else {}
        listener = GranianListener(
            spec.create_app(), settings.host, listen_port, lifespan=True, threads=2, **certs
        )
        on_uvloop(run_servers([listener]))
        return
    import uvicorn

    from karios.common.http import SERVER_KEEP_ALIVE_S

    StoppingServer = _stopping_server()

    # SSE streams never end on their own: the app's "about to stop" hooks end them at SIGTERM (the
    # gateway's relay sends each client `event: reconnect` with the id to resume from, as under
    # granian); whatever is still open after 5 s is closed.
    config = uvicorn.Config(
        spec.create_app(),
        host=settings.host,
        port=listen_port,
        log_level="warning",
        access_log=False,
        log_config=None,  # uvicorn's lines go through the service's JSON pipeline (telemetry.py)
        timeout_graceful_shutdown=5,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        **tls,  # type: ignore[arg-type]
    )
    server_ = StoppingServer(config)
    with contextlib.suppress(KeyboardInterrupt):
        server_.run()
    if not server_.started:  # as uvicorn.run: a start-up failure (a taken port…) exits 3
        sys.exit(3)


def _stopping_server() -> type:
    import asyncio

    import uvicorn

    class StoppingServer(uvicorn.Server):
        """uvicorn's server that, at the first SIGTERM/SIGINT, calls the app's
        ``app.state.before_server_stop`` hooks before it starts to stop."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                app = self.config.app
                hooks = list(getattr(getattr(app, "state", None), "before_server_stop", ()))
                try:  # a signal interrupts the loop's code anywhere: run them at its next turn
                    loop = asyncio.get_running_loop()
                    for hook in hooks:
                        loop.call_soon_threadsafe(hook)
                except RuntimeError:  # no loop running (yet): nothing is streaming
                    pass
            super().handle_exit(sig, frame)

    return StoppingServer
