"""Plain HTTP on BOOTAPI_LISTEN_ADDR, plus an optional parallel HTTPS listener on the same app."""

from __future__ import annotations

import asyncio

import uvicorn

from karios.bootapi.app import create_app
from karios.bootapi.settings import BootapiSettings, split_addr
from karios.common.settings import KariosSettings


def build_servers(settings: KariosSettings, boot: BootapiSettings) -> list[uvicorn.Server]:
    """One uvicorn server per listener; only the plain one runs the app's lifespan."""
    app = create_app(settings, boot)
    host, port = boot.resolved_listen_addr(settings.host, settings.bootapi_port)
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="warning",
                access_log=False,
                lifespan="on",
                log_config=None,
            )
        )
    ]
    if boot.tls_listen_addr:
        if not (boot.tls_cert_file and boot.tls_key_file):
            raise SystemExit("BOOTAPI_TLS_LISTEN_ADDR needs BOOTAPI_TLS_CERT_FILE and BOOTAPI_TLS_KEY_FILE")
        thost, tport = split_addr(boot.tls_listen_addr)
        servers.append(
            uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=thost,
                    port=tport,
                    log_level="warning",
                    access_log=False,
                    lifespan="off",
                    log_config=None,
                    ssl_certfile=str(boot.tls_cert_file),
                    ssl_keyfile=str(boot.tls_key_file),
                )
            )
        )
    return servers


async def serve(settings: KariosSettings | None = None, boot: BootapiSettings | None = None) -> None:
    await run_servers(build_servers(settings or KariosSettings(), boot or BootapiSettings()))


async def run_servers(servers: list[uvicorn.Server]) -> None:
    """Start the plain listener (it runs the lifespan) first, then the HTTPS one; stop together."""
    first = asyncio.create_task(servers[0].serve())
    while not servers[0].started and not first.done():  # noqa: ASYNC110 - uvicorn exposes only a flag
        await asyncio.sleep(0.05)
    others = [asyncio.create_task(s.serve()) for s in servers[1:]]
    await first
    for s in servers[1:]:
        s.should_exit = True
    await asyncio.gather(*others)
