"""``karios`` — run the whole system (``karios up``) or one service (``karios run <service>``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.error
import urllib.request

from karios.cli.services import SERVICES


def cmd_run(args: argparse.Namespace) -> int:
    import uvicorn

    from karios.common.settings import KariosSettings

    spec = SERVICES[args.service]
    settings = KariosSettings()
    if spec.name == "bootapi" and not args.port:
        # bootapi honours its seed's BOOTAPI_LISTEN_ADDR and the optional parallel HTTPS listener.
        from karios.bootapi.listeners import serve

        asyncio.run(serve(settings))
        return 0
    port = args.port or int(getattr(settings, spec.port_setting))
    # SSE streams never end on their own: give open connections 5 s on SIGTERM, then close them.
    uvicorn.run(
        spec.create_app(),
        host=settings.host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from karios.cli.up import Up, state_dir

    return Up(args, state_dir()).run()


def cmd_token(args: argparse.Namespace) -> int:
    from karios.api_gateway.auth import Role, create_token, revoke_token
    from karios.common.bus.runtime import Bus
    from karios.common.db import Database
    from karios.common.settings import KariosSettings

    settings = KariosSettings()

    async def run() -> str | None:
        db = Database(settings.database_url)
        bus: Bus | None = Bus.from_settings(settings, "karios-cli")
        try:
            await bus.broker.connect()  # type: ignore[union-attr]
        except Exception:
            print("karios: bus unavailable; gateways see the change within token_cache_ttl", file=sys.stderr)
            bus = None
        try:
            if args.revoke:
                await revoke_token(db, args.name, bus=bus)
                return None
            return await create_token(db, args.name, Role[args.role], bus=bus)
        finally:
            if bus is not None:
                await bus.stop()
            await db.close()

    from karios.common.errors import KariosError

    try:
        token = asyncio.run(run())
    except KariosError as exc:
        print(f"karios: {exc.message}", file=sys.stderr)
        return 1
    print(token if token is not None else f"revoked {args.name}")
    return 0


def cmd_ready(args: argparse.Namespace) -> int:
    """Exit 0 when the service's /readyz on this host answers 200 (container health checks)."""
    from karios.common.settings import KariosSettings

    spec = SERVICES[args.service]
    port = int(getattr(KariosSettings(), spec.port_setting))
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            body = r.read().decode(errors="replace")
            ok = r.status == 200
    except urllib.error.HTTPError as exc:
        body, ok = exc.read().decode(errors="replace"), False
    except OSError as exc:
        body, ok = f"no answer: {exc}", False
    print(f"{args.service}: {'ready' if ok else 'not ready'} {body}")
    return 0 if ok else 1


def cmd_openapi(args: argparse.Namespace) -> int:
    import json

    from karios.common.settings import KariosSettings

    spec = SERVICES[args.service]
    module = __import__(spec.module, fromlist=["create_app"])
    app = module.create_app(KariosSettings(dev_mode=True))
    print(json.dumps(app.openapi(), indent=2, sort_keys=True))
    return 0


def cmd_asyncapi(_args: argparse.Namespace) -> int:
    import json

    from karios.common.contracts.asyncapi import build_document

    print(json.dumps(build_document(), indent=2, sort_keys=True))
    return 0


def cmd_config_doc(_args: argparse.Namespace) -> int:
    from karios.cli.configdoc import render

    print(render(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="karios", description="Karios control plane")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run the whole system on this machine (embedded NATS + PostgreSQL)")
    up.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for every service to be ready"
    )
    up.add_argument(
        "--max-crashes",
        type=int,
        default=5,
        help="give up (stop everything) when one service crashes this often within --crash-window",
    )
    up.add_argument("--crash-window", type=float, default=60.0, help="seconds (see --max-crashes)")
    up.set_defaults(fn=cmd_up)
    run = sub.add_parser("run", help="run one service (how production runs it)")
    run.add_argument("service", choices=sorted(SERVICES))
    run.add_argument("--port", type=int, default=None)
    run.set_defaults(fn=cmd_run)
    tok = sub.add_parser("token", help="create (or replace) an API token; prints it once")
    tok.add_argument("name")
    tok.add_argument("--role", choices=["viewer", "operator", "fabric_admin"], default="operator")
    tok.add_argument("--revoke", action="store_true", help="revoke the token of that name instead")
    tok.set_defaults(fn=cmd_token)
    rd = sub.add_parser("ready", help="exit 0 if a service on this host is ready (health checks)")
    rd.add_argument("service", choices=sorted(SERVICES))
    rd.add_argument("--timeout", type=float, default=2.0)
    rd.set_defaults(fn=cmd_ready)
    oa = sub.add_parser("openapi", help="print a service's OpenAPI document (docs/openapi/<service>.json)")
    oa.add_argument("service", choices=sorted(SERVICES))
    oa.set_defaults(fn=cmd_openapi)
    aa = sub.add_parser("asyncapi", help="print the bus's AsyncAPI document (docs/asyncapi.json)")
    aa.set_defaults(fn=cmd_asyncapi)
    cd = sub.add_parser("config-doc", help="print docs/configuration.md (every setting of every service)")
    cd.set_defaults(fn=cmd_config_doc)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
