"""How a benchmark starts the whole system: ``karios up`` on free ports, a database of its own, the
run's file inventory, the output read in a thread, the admin token read from the state directory;
and how it stops it (SIGTERM, the database dropped). One launcher for every benchmark that needs
the real services (``every_route.py``, ``hot_paths.py``, ``provision_storm.py``). For those that
run parts of a service in-process: :func:`scratch_database` (a database of their own, dropped
afterwards) and :func:`cpu_seconds` (what a set of processes used).

``up_args`` adds to ``karios up``'s command line (``--cluster 3``, ``--service-replicas
provisioner=3``…); then :meth:`KariosUp.processes_of` lists every replica of a service,
:meth:`KariosUp.gateway_urls` every gateway replica's URL (``<state>/replicas.json``) and
:meth:`KariosUp.nats_options` how to reach the run's NATS (the embedded cluster and its login).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

#: The services whose ports ``karios up`` takes from ``KARIOS_<NAME>_PORT``.
PORTS = ("GATEWAY", "BOOTAPI", "PROVISIONER", "INVENTORY", "FABRIC_WORKER")
READY_LINE = "Ctrl-C stops everything"  # what ``karios up`` prints once every service is ready


def ensure_debian_tools(*tools: tuple[str, str]) -> list[str]:
    """Install the Debian packages of `tools` ((package, executable) pairs) whose executable is
    missing; as a normal user nothing is installed. Returns the packages still missing."""
    missing = [pkg for pkg, exe in tools if not Path(exe).exists()]
    if missing and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, capture_output=True)
    return [pkg for pkg, exe in tools if not Path(exe).exists()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def sql(db_url: str, statement: str, db: str | None = None) -> list[Any]:
    """Run one statement (on ``db`` instead of the URL's database when given); its rows, if any."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = db_url.rsplit("/", 1)[0] + "/" + db if db else db_url
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as c:
            res = await c.execute(text(statement))
            return list(res.all()) if res.returns_rows else []
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def scratch_database(admin_url: str, prefix: str) -> AsyncIterator[tuple[str, str]]:
    """A new database ``<prefix>_<random>`` on the server of ``admin_url``: its name and URL;
    dropped (connections and all) when the block ends, however it ends."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as c:
            await c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield name, sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as c:
                await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


def cpu_seconds(procs: Any) -> float:
    """User + system CPU seconds of ``procs`` (``psutil.Process``es); one that is gone counts 0."""
    import psutil

    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def shown_argv(proc: Any) -> list[str]:
    """The command line ``proc`` shows, as words. A service ``karios up`` forked shows its
    ``karios run <service>`` through setproctitle: one string padded with NULs (or spaces) in
    the memory of up's own, longer argv, which psutil returns as one element plus empty ones, or
    split at the spaces. Read as words, both are the argv of a ``karios run`` started apart."""
    return " ".join(proc.cmdline()).split()


class KariosUp:
    """``karios up`` for one benchmark run. ``inventory`` is written as the file inventory;
    ``env`` adds to (or overrides) the launcher's environment; ``up_args`` adds to ``karios up``'s
    command line; a start that fails (a port picked here taken meanwhile by another process) is
    retried ``attempts`` times with fresh ports.

    ``--cluster N`` starts ``karios up``'s own NATS cluster only when no ``KARIOS_NATS_URL`` is
    set (with one, ``karios up`` would use that server and start no cluster): both together are
    refused here. The launcher never passes the caller's own ``KARIOS_*`` variables on."""

    def __init__(
        self,
        name: str,
        inventory: dict[str, Any],
        env: dict[str, str] | None = None,
        attempts: int = 1,
        up_args: list[str] | None = None,
    ) -> None:
        import yaml

        self.up_args = [str(a) for a in up_args or []]
        if _cluster_size(self.up_args) and (env or {}).get("KARIOS_NATS_URL"):
            raise ValueError("karios up --cluster starts its own NATS cluster: do not set KARIOS_NATS_URL")

        self.root = Path(tempfile.mkdtemp(prefix=f"karios-{name}-"))
        self.root.chmod(0o755)
        pg = os.environ.get("KARIOS_BENCH_PG", "postgres@127.0.0.1:5432")
        self.db = f"karios_{name}_{uuid.uuid4().hex[:8]}"
        self.db_url = f"postgresql+asyncpg://{pg}/{self.db}"
        self.state = self.root / "state"
        (self.root / "inventory.yaml").write_text(yaml.safe_dump(inventory))
        for attempt in range(1, attempts + 1):
            try:
                self._up(env or {})
                return
            except RuntimeError as exc:
                print(f"karios up, attempt {attempt} of {attempts}: {exc}")
                self.state = self.root / f"state-{attempt + 1}"
        self._clean(keep=False)
        raise SystemExit(f"karios up did not start in {attempts} attempt(s)")

    def _up(self, extra: dict[str, str]) -> None:
        self.ports = {p: free_port() for p in PORTS}
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        env |= {f"KARIOS_{p}_PORT": str(n) for p, n in self.ports.items()}
        env |= {
            "KARIOS_STATE_DIR": str(self.state),
            "KARIOS_CONFIG": str(self.root / "client.json"),
            "KARIOS_DATABASE_URL": self.db_url,
            "KARIOS_INVENTORY_FILE": str(self.root / "inventory.yaml"),
            "KARIOS_LOG_LEVEL": "WARNING",
        }
        env |= extra
        self.env_nats_url = env.get("KARIOS_NATS_URL", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "karios.cli", "up", "--timeout", "180", *self.up_args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.out: list[str] = []
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout or []), daemon=True).start()
        deadline = time.monotonic() + 240
        while READY_LINE not in "".join(self.out):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._terminate()
                raise RuntimeError("did not start:\n" + "".join(self.out)[-3000:])
            time.sleep(0.2)
        self.token = (self.state / "admin.token").read_text().strip()

    def url(self, port: str = "GATEWAY") -> str:
        return f"http://127.0.0.1:{self.ports[port]}"

    def process_of(self, service: str) -> Any:
        """The ``psutil.Process`` of ``karios run <service>`` under this ``karios up`` (the first
        found: one of the replicas when there are several, see :meth:`processes_of`)."""
        procs = self.processes_of(service)
        if not procs:
            raise LookupError(f"no {service} process")
        return procs[0]

    def processes_of(self, service: str) -> list[Any]:
        """Every ``karios run <service>`` process under this ``karios up`` (one per replica: the
        replicas have the same command line; :meth:`replica_name` tells them apart)."""
        return [p for group, p in self.children() if group == service]

    def children(self) -> list[tuple[str, Any]]:
        """``karios up``'s own children as (group, ``psutil.Process``): group is the service of a
        ``karios run <service>``, ``nats-server`` for a node of ``--cluster``, else ``other``
        (their own children, if any, are not listed: see :func:`tree`)."""
        import psutil

        out = []
        try:
            kids = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        for child in kids:
            try:
                argv = shown_argv(child)
            except psutil.Error:
                continue
            if argv[-2:-1] == ["run"] and "karios.cli" in argv:
                out.append((argv[-1], child))
            elif argv and Path(argv[0]).name == "nats-server":
                out.append(("nats-server", child))
            else:
                out.append(("other", child))
        return out

    def replica_urls(self) -> dict[str, str]:
        """Child name (``provisioner``, ``provisioner-2``…) → base URL: ``<state>/replicas.json``
        when ``karios up`` runs replicas, else replica 1 of the services whose port is set here."""
        path = self.state / "replicas.json"
        if path.exists():
            return dict(json.loads(path.read_text()))
        names = {"GATEWAY": "api-gateway", "FABRIC_WORKER": "fabric-worker"}
        return {names.get(p, p.lower()): self.url(p) for p in self.ports}

    def gateway_urls(self) -> list[str]:
        """The base URL of every api-gateway replica (replica 1 first)."""
        urls = self.replica_urls()
        return [urls[n] for n in sorted(urls, key=_replica_order) if _service_of(n) == "api-gateway"]

    def replica_name(self, proc: Any) -> str:
        """The child name of a ``karios run <service>`` process (``provisioner-2``): its own port
        (``KARIOS_<SERVICE>_PORT`` in its environment) in :meth:`replica_urls`; else the service."""
        import psutil

        service = shown_argv(proc)[-1]
        try:
            port = proc.environ().get(_port_var(service))
        except psutil.Error:  # gone, or not readable: the service's name will do
            return service
        for name, url in self.replica_urls().items():
            if _service_of(name) == service and url.rsplit(":", 1)[-1] == port:
                return name
        return service

    def nats_options(self) -> dict[str, Any]:
        """``nats.connect`` keyword arguments for this run's NATS: the URL(s) ``karios up``
        printed (every node of ``--cluster``) and, for its embedded NATS, the login it keeps in
        ``<state>/nats-credentials.json``."""
        servers = next(
            (line.split()[1] for line in "".join(self.out).splitlines() if line.strip().startswith("NATS  ")),
            "nats://127.0.0.1:4222",
        )
        options: dict[str, Any] = {"servers": servers.split(",")}
        creds = self.state / "nats-credentials.json"
        if creds.exists() and not self.env_nats_url:
            doc = json.loads(creds.read_text())
            options |= {"user": doc["user"], "password": doc["password"]}
        return options

    def _terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _clean(self, keep: bool) -> None:
        if keep:
            print(f"kept {self.root} (logs under {self.state.name}/)")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        asyncio.run(sql(self.db_url, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)', db="postgres"))

    def stop(self, keep: bool = False) -> None:
        self._terminate()
        self._clean(keep)


def tree(proc: Any) -> list[Any]:
    """``proc`` and its live descendants (what a service or an emulator runs under it)."""
    import psutil

    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _cluster_size(up_args: list[str]) -> int:
    for i, arg in enumerate(up_args):
        if arg == "--cluster" and i + 1 < len(up_args):
            return int(up_args[i + 1])
        if arg.startswith("--cluster="):
            return int(arg.split("=", 1)[1])
    return 0


def _service_of(child: str) -> str:
    """``provisioner-2`` → ``provisioner`` (``fabric-worker`` stays itself)."""
    base, _, n = child.rpartition("-")
    return base if base and n.isdigit() else child


def _replica_order(child: str) -> tuple[str, int]:
    base, _, n = child.rpartition("-")
    return (base, int(n)) if base and n.isdigit() else (child, 1)


def _port_var(service: str) -> str:
    from karios.cli.services import SERVICES

    return f"KARIOS_{SERVICES[service].port_setting.upper()}"
