"""``karios up``: the whole system on this machine — embedded NATS and PostgreSQL (unless
configured), every service as a supervised child, a clean stop on Ctrl-C/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from karios.cli.embedded import EmbeddedNats, EmbeddedPostgres, die_with_parent, free_port, nats_cluster
from karios.cli.readiness import probe
from karios.cli.services import SERVICES
from karios.cli.supervisor import Child, CrashLoop, CrashPolicy, Supervisor, is_ready


def state_dir() -> Path:
    from karios.common.settings import default_state_dir

    return Path(os.environ["KARIOS_STATE_DIR"]) if os.environ.get("KARIOS_STATE_DIR") else default_state_dir()


def _persisted_secret(path: Path, make) -> str:  # type: ignore[no-untyped-def]
    if path.exists():
        return path.read_text().strip()
    value = make()
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


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


def otlp_env(env: dict[str, str], endpoint: str | None) -> dict[str, str]:
    """Tracing settings of every service: the ``OTEL_*`` of this environment reach each one as
    they are (export stays off unless configured); ``--otlp-endpoint`` sets the collector. One
    ``OTEL_SERVICE_NAME`` cannot name five services: each names itself ``karios-<service>``."""
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        env.setdefault("OTEL_TRACES_EXPORTER", "otlp")
    env.pop("OTEL_SERVICE_NAME", None)
    return env


def _print_ready(t0: float, state: Path, env: dict[str, str], host: str, gw: str, token: str) -> None:
    from karios.cli.client.context import ClientContext, save_context

    # Every other verb (`karios provision`, `karios jobs --watch`, …) talks to this gateway.
    ctx_path = save_context(ClientContext(url=gw, token=token, name="bootstrap-admin"))
    print(
        f"\nkarios: all services ready in {time.monotonic() - t0:.1f}s (state in {state})\n"
        f"  NATS      {env['KARIOS_NATS_URL']}\n"
        f"  API       {gw}/docs\n"
        f"  admin token (dev mode): {token}\n"
        f"  events:   curl -N -H 'Authorization: Bearer {token}' {gw}/controlnode/events\n"
        f"  CLI:      karios nodes | karios provision BMC --watch | karios jobs (context in {ctx_path})\n"
        "A crashed service is restarted (see logs/karios.log). Ctrl-C stops everything.",
        flush=True,
    )


async def _create_streams(servers: list[str], prefix: str, replicas: str) -> None:
    import nats

    from karios.common.bus.streams import ensure_streams
    from karios.common.bus.subjects import Subjects

    nc = await nats.connect(servers)
    try:
        await ensure_streams(nc.jetstream(), Subjects(prefix), int(replicas))
    finally:
        await nc.close()


class Up:
    """One ``karios up`` run: start-up, the supervision loop and the clean stop share the
    embedded servers, the supervisor and the once-only stop guard (a second signal must not cut
    the stop short)."""

    def __init__(self, args: argparse.Namespace, state: Path) -> None:
        self.args, self.state, self.t0 = args, state, time.monotonic()
        state.mkdir(parents=True, exist_ok=True)
        self.env, self.admin_token = _up_env(state)
        otlp_env(self.env, getattr(args, "otlp_endpoint", None))
        self.logs = state / "logs"
        self.logs.mkdir(exist_ok=True)
        self.sup = Supervisor(self.env, self.logs, preexec=die_with_parent)
        self.nats: EmbeddedNats | None = None
        self.pg: EmbeddedPostgres | None = None
        self.stopping = False
        # `--cluster N`: N clustered nats-servers (supervised like the services, stopped after
        # them) and `--replicas` (default 2) processes of every service.
        self.cluster = int(getattr(args, "cluster", 0) or 0)
        self.replicas = int(getattr(args, "replicas", 0) or (2 if self.cluster else 1))
        self.nats_sup = Supervisor(self.env, self.logs, preexec=die_with_parent)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            self._start_backends()
            host, urls = self._add_services()
            self.sup.start_all()
            if not self._wait_all_ready(urls):
                self.shutdown()
                return 1
            _print_ready(self.t0, self.state, self.env, host, urls["api-gateway"], self.admin_token)
            return self._supervise()
        except KeyboardInterrupt:
            self.shutdown()
            return 0
        except Exception:
            self.shutdown()
            raise

    def shutdown(self, *_a: object) -> None:
        if self.stopping:
            return
        self.stopping = True
        # A second Ctrl-C/SIGTERM (uv and `timeout` both forward signals) must not cut the stop short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("\nkarios: stopping…", flush=True)
        self.sup.stop_all()
        self.nats_sup.stop_all()
        if self.nats:
            self.nats.stop()
        if self.pg:
            self.pg.stop()
        print("karios: stopped", flush=True)

    def _start_backends(self) -> None:
        """Embedded NATS / PostgreSQL unless the environment names servers; the database exists."""
        if self.cluster and not self.env.get("KARIOS_NATS_URL"):
            self._start_nats_cluster()
        elif not self.env.get("KARIOS_NATS_URL"):
            self.nats = EmbeddedNats(self.state)
            self.env["KARIOS_NATS_URL"] = self.nats.start()
        if not self.env.get("KARIOS_DATABASE_URL"):
            self.pg = EmbeddedPostgres(self.state)
            self.env["KARIOS_DATABASE_URL"] = self.pg.start()
        from karios.common.db.migrate import ensure_database

        asyncio.run(ensure_database(self.env["KARIOS_DATABASE_URL"]))

    def _start_nats_cluster(self) -> None:
        """N nats-servers routed to each other; every service gets all N URLs (nats-py moves to
        another server when its own dies) and streams replicated on min(N, 3) of them."""
        nodes = nats_cluster(self.state, self.cluster)
        for node in nodes:
            self.nats_sup.add(
                Child(
                    node.name,
                    node.argv(nodes),
                    self.logs / f"{node.name}.log",
                    node.ready_url,
                    policy=CrashPolicy(max_crashes=self.args.max_crashes, window=self.args.crash_window),
                )
            )
        self.nats_sup.start_all()
        deadline = time.monotonic() + self.args.timeout
        for child in self.nats_sup.children.values():
            assert child.proc is not None
            _wait_ready(child.ready_url, child.proc, deadline)
        self.env["KARIOS_NATS_URL"] = ",".join(n.url for n in nodes)
        self.env.setdefault("KARIOS_BUS_REPLICAS", str(min(3, self.cluster)))
        # The replicated streams once, before ten services race to create them on a new cluster.
        prefix = self.env.get("KARIOS_BUS_PREFIX", "karios")
        asyncio.run(_create_streams([n.url for n in nodes], prefix, self.env["KARIOS_BUS_REPLICAS"]))
        print(f"  NATS cluster of {self.cluster} ready ({self.env['KARIOS_NATS_URL']})", flush=True)

    def _add_services(self) -> tuple[str, dict[str, str]]:
        """One supervised child per service replica (replica 1 on the configured port, the others
        on free ones, named ``<service>-<n>``); returns the host and each child's base URL."""
        from karios.common.settings import KariosSettings

        settings = KariosSettings(_env_file=None, **{"dev_mode": True})  # ports/host as configured
        host = self.env.get("KARIOS_HOST", settings.host)
        urls = {}
        for name, spec in SERVICES.items():
            var = f"KARIOS_{spec.port_setting.upper()}"
            for n in range(1, self.replicas + 1):
                port = int(self.env.get(var, getattr(settings, spec.port_setting))) if n == 1 else free_port()
                child = name if n == 1 else f"{name}-{n}"
                urls[child] = f"http://{host}:{port}"
                self.sup.add(
                    Child(
                        child,
                        [sys.executable, "-m", "karios.cli", "run", name],
                        self.logs / f"{child}.log",
                        f"{urls[child]}/readyz",
                        policy=CrashPolicy(max_crashes=self.args.max_crashes, window=self.args.crash_window),
                        env={var: str(port)},
                    )
                )
        if self.replicas > 1:
            (self.state / "replicas.json").write_text(json.dumps(urls, indent=1) + "\n")
        return host, urls

    def _wait_all_ready(self, urls: dict[str, str]) -> bool:
        """Every child ready before the deadline. Start-up is supervised like the rest of the
        run: a child that exits early (a port a moment ago still held, a database still
        starting) is restarted with backoff; only a crash loop or the deadline fails it."""
        deadline = time.monotonic() + self.args.timeout
        pending = dict(self.sup.children)
        while pending:
            try:
                self.sup.poll()
            except CrashLoop as exc:
                child = self.sup.children[str(exc)]
                print(
                    f"karios: {child.name} failed to start{_foreign(child)}; see {child.log_path}",
                    file=sys.stderr,
                )
                return False
            for name, child in list(pending.items()):
                if child.restart_at is None and is_ready(child.ready_url, timeout=1, instance=child.instance):
                    print(f"  {name:14s} ready  {urls[name]}", flush=True)
                    child.down_since = None
                    del pending[name]
            if pending and time.monotonic() >= deadline:
                for name, child in pending.items():
                    print(
                        f"karios: {name} failed to start: not ready in {self.args.timeout:.0f} s"
                        f"{_foreign(child)}; "
                        f"see {child.log_path}",
                        file=sys.stderr,
                    )
                return False
            if pending:
                time.sleep(0.1)
        return True

    def _supervise(self) -> int:
        """Restart crashed children until a crash loop (exit 1) or a signal (KeyboardInterrupt)."""
        while True:
            try:
                self.nats_sup.poll()
                self.sup.poll()
            except CrashLoop:
                self.shutdown()
                return 1
            time.sleep(0.5)


def _foreign(child: Child) -> str:
    """ ", its port is held by another process …" when another process answers its readiness URL."""
    ok, said = probe(child.ready_url, 1.0, child.instance)
    return f": {child.ready_url} is {said}" if not ok and said.startswith("answered by another") else ""
