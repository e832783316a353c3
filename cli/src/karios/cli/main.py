"""``karios`` — run the whole system (``karios up``) or one service (``karios run <service>``)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from karios.cli.embedded import EmbeddedNats, EmbeddedPostgres, die_with_parent
from karios.cli.services import SERVICES


def _state_dir() -> Path:
    from karios.common.settings import default_state_dir

    return Path(os.environ["KARIOS_STATE_DIR"]) if os.environ.get("KARIOS_STATE_DIR") else default_state_dir()


def _persisted_secret(path: Path, make) -> str:  # type: ignore[no-untyped-def]
    if path.exists():
        return path.read_text().strip()
    value = make()
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


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


def _wait_ready(url: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 (our own 127.0.0.1 URL)
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready in time")


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    state = _state_dir()
    state.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("KARIOS_DEV_MODE", "1")
    env["KARIOS_STATE_DIR"] = str(state)
    env.setdefault(
        "KARIOS_SECRET_KEY",
        _persisted_secret(state / "secret.key", lambda: base64.b64encode(os.urandom(32)).decode()),
    )
    admin_token = env.get("KARIOS_BOOTSTRAP_ADMIN_TOKEN") or _persisted_secret(
        state / "admin.token", lambda: "kt_" + base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    )
    env["KARIOS_BOOTSTRAP_ADMIN_TOKEN"] = admin_token

    nats = pg = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def shutdown(*_a: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        # A second Ctrl-C/SIGTERM (uv and `timeout` both forward signals) must not cut the stop short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("\nkarios: stopping…", flush=True)
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        if nats:
            nats.stop()
        if pg:
            pg.stop()
        print("karios: stopped", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if not env.get("KARIOS_NATS_URL"):
            nats = EmbeddedNats(state)
            env["KARIOS_NATS_URL"] = nats.start()
        if not env.get("KARIOS_DATABASE_URL"):
            pg = EmbeddedPostgres(state)
            env["KARIOS_DATABASE_URL"] = pg.start()
        from karios.common.db.migrate import ensure_database
        from karios.common.settings import KariosSettings

        asyncio.run(ensure_database(env["KARIOS_DATABASE_URL"]))
        settings = KariosSettings(_env_file=None, **{"dev_mode": True})  # ports/host as configured
        logs = state / "logs"
        logs.mkdir(exist_ok=True)
        for name in SERVICES:
            out = open(logs / f"{name}.log", "ab")  # noqa: SIM115
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "karios.cli", "run", name],
                env=env,
                stdout=out,
                stderr=out,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + args.timeout
        host = env.get("KARIOS_HOST", settings.host)
        for name, spec in SERVICES.items():
            port = int(env.get(f"KARIOS_{spec.port_setting.upper()}", getattr(settings, spec.port_setting)))
            try:
                _wait_ready(f"http://{host}:{port}/readyz", procs[name], deadline)
            except RuntimeError as exc:
                print(f"karios: {name} failed to start: {exc}; see {logs / (name + '.log')}", file=sys.stderr)
                shutdown()
                return 1
            print(f"  {name:14s} ready  http://{host}:{port}", flush=True)
        gw = int(env.get("KARIOS_GATEWAY_PORT", settings.gateway_port))
        print(
            f"\nkarios: all services ready in {time.monotonic() - t0:.1f}s (state in {state})\n"
            f"  NATS      {env['KARIOS_NATS_URL']}\n"
            f"  API       http://{host}:{gw}/docs\n"
            f"  admin token (dev mode): {admin_token}\n"
            f"  events:   curl -N -H 'Authorization: Bearer {admin_token}' http://{host}:{gw}/controlnode/events\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    print(f"karios: {name} exited with code {p.returncode}; stopping", file=sys.stderr)
                    shutdown()
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        shutdown()
        return 0
    except Exception:
        shutdown()
        raise


def cmd_token(args: argparse.Namespace) -> int:
    from karios.api_gateway.auth import Role, create_token
    from karios.common.db import Database
    from karios.common.settings import KariosSettings

    async def run() -> str:
        db = Database(KariosSettings().database_url)
        try:
            return await create_token(db, args.name, Role[args.role])
        finally:
            await db.close()

    print(asyncio.run(run()))
    return 0


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
    up.set_defaults(fn=cmd_up)
    run = sub.add_parser("run", help="run one service (how production runs it)")
    run.add_argument("service", choices=sorted(SERVICES))
    run.add_argument("--port", type=int, default=None)
    run.set_defaults(fn=cmd_run)
    tok = sub.add_parser("token", help="create (or replace) an API token; prints it once")
    tok.add_argument("name")
    tok.add_argument("--role", choices=["viewer", "operator", "fabric_admin"], default="operator")
    tok.set_defaults(fn=cmd_token)
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
