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
import urllib.error
import urllib.request
from pathlib import Path

from karios.cli.embedded import EmbeddedNats, EmbeddedPostgres, die_with_parent
from karios.cli.services import SERVICES
from karios.cli.supervisor import Child, CrashLoop, CrashPolicy, Supervisor


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


def _up_env(state: Path) -> tuple[dict[str, str], str]:
    """The services' environment (dev mode, persisted key and admin token) and the admin token."""
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
    return env, admin_token


# One function on purpose: start-up, the supervision loop and the clean stop share the
# `shutdown` closure and its once-only guard (a second signal must not cut the stop short).
def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    state = _state_dir()
    state.mkdir(parents=True, exist_ok=True)
    env, admin_token = _up_env(state)

    nats = pg = None
    logs = state / "logs"
    logs.mkdir(exist_ok=True)
    sup = Supervisor(env, logs, preexec=die_with_parent)
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
        sup.stop_all()
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
        host = env.get("KARIOS_HOST", settings.host)
        urls = {}
        for name, spec in SERVICES.items():
            port = int(env.get(f"KARIOS_{spec.port_setting.upper()}", getattr(settings, spec.port_setting)))
            urls[name] = f"http://{host}:{port}"
            sup.add(
                Child(
                    name,
                    [sys.executable, "-m", "karios.cli", "run", name],
                    logs / f"{name}.log",
                    f"{urls[name]}/readyz",
                    policy=CrashPolicy(max_crashes=args.max_crashes, window=args.crash_window),
                )
            )
        sup.start_all()
        deadline = time.monotonic() + args.timeout
        for name, child in sup.children.items():
            assert child.proc is not None
            try:
                _wait_ready(child.ready_url, child.proc, deadline)
            except RuntimeError as exc:
                print(f"karios: {name} failed to start: {exc}; see {child.log_path}", file=sys.stderr)
                shutdown()
                return 1
            print(f"  {name:14s} ready  {urls[name]}", flush=True)
        _print_ready(t0, state, env, host, urls["api-gateway"], admin_token)
        while True:
            try:
                sup.poll()
            except CrashLoop:
                shutdown()
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        shutdown()
        return 0
    except Exception:
        shutdown()
        raise


def _print_ready(t0: float, state: Path, env: dict[str, str], host: str, gw: str, token: str) -> None:
    print(
        f"\nkarios: all services ready in {time.monotonic() - t0:.1f}s (state in {state})\n"
        f"  NATS      {env['KARIOS_NATS_URL']}\n"
        f"  API       {gw}/docs\n"
        f"  admin token (dev mode): {token}\n"
        f"  events:   curl -N -H 'Authorization: Bearer {token}' {gw}/controlnode/events\n"
        "A crashed service is restarted (see logs/karios.log). Ctrl-C stops everything.",
        flush=True,
    )


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
