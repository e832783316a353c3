"""How a benchmark starts the whole system: ``karios up`` on free ports, a database of its own, the
run's file inventory, the output read in a thread, the admin token read from the state directory;
and how it stops it (SIGTERM, the database dropped). One launcher for every benchmark that needs
the real services (``every_route.py``, ``hot_paths.py``, ``provision_storm.py``).
"""

from __future__ import annotations

import asyncio
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
from pathlib import Path
from typing import Any

#: The services whose ports ``karios up`` takes from ``KARIOS_<NAME>_PORT``.
PORTS = ("GATEWAY", "BOOTAPI", "PROVISIONER", "INVENTORY", "FABRIC_WORKER")
READY_LINE = "Ctrl-C stops everything"  # what ``karios up`` prints once every service is ready


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


class KariosUp:
    """``karios up`` for one benchmark run. ``inventory`` is written as the file inventory;
    ``env`` adds to (or overrides) the launcher's environment; a start that fails (a port picked
    here taken meanwhile by another process) is retried ``attempts`` times with fresh ports."""

    def __init__(
        self, name: str, inventory: dict[str, Any], env: dict[str, str] | None = None, attempts: int = 1
    ) -> None:
        import yaml

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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "karios.cli", "up", "--timeout", "180"],
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
        """The ``psutil.Process`` of ``karios run <service>`` under this ``karios up``."""
        import psutil

        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if child.cmdline()[-2:] == ["run", service]:
                    return child
            except psutil.Error:
                continue
        raise LookupError(f"no {service} process")

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
