"""``karios run bootapi`` as ``karios up`` runs it, under each ``BOOTAPI_SERVER``: ready, the fast
path's answer, one process (no worker processes to orphan), SIGTERM stops it cleanly (lifespan
shutdown ran, exit 0), and every line it writes is JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import httpx
import psutil
import pytest

from tests.fixtures.apps import free_port
from tests.fixtures.wait import wait_until_sync


def _env(server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KARIOS_", "BOOTAPI_"))}
    env |= {
        "KARIOS_BUS_PREFIX": f"serve{uuid.uuid4().hex[:8]}",
        "KARIOS_LOG_JSON": "true",
        "KARIOS_LOG_LEVEL": "INFO",
        "KARIOS_DEV_MODE": "true",
        "KARIOS_REQUEST_TIMEOUT": "0.5",  # no inventory on this prefix: the fallback, quickly
        "BOOTAPI_SERVER": server,
    }
    return env


def _wait_ready(proc: subprocess.Popen, base: str, what: str) -> None:
    """Until /readyz answers 200 (or the process ended: the caller's next assert says so)."""

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    wait_until_sync(ready, timeout=60, interval=0.2, what=what)


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_karios_run_bootapi_serves_and_stops_on_sigterm(server: str):
    port = free_port()
    env = _env(server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "karios.cli", "run", "bootapi", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, "bootapi ready")
        assert proc.poll() is None
        r = httpx.get(f"{base}/ipxe/52:54:00:00:00:99", timeout=5)  # unknown MAC: the fallback
        assert r.status_code == 200 and r.text.startswith("#!ipxe") and r.headers["server"] == server
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        assert 'bootapi_http_requests_total{endpoint="ipxe",status="2xx"} 1.0' in metrics
        assert psutil.Process(proc.pid).children(recursive=True) == []  # one process, nothing to orphan
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # uvicorn re-raises the SIGTERM it handled once it has stopped (as before); granian returns.
    assert proc.returncode == (0 if server == "granian" else -signal.SIGTERM), out
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]  # each line is JSON
    events = [e.get("event") for e in lines]
    assert "service started" in events, out
    assert not any("experimental" in str(e) for e in events), out


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_a_second_bootapi_on_a_taken_port_exits_instead_of_sharing_it(server: str):
    """Issue 24, S4: granian binds with SO_REUSEPORT, so a second bootapi on the same port used to
    start and silently take half of the iPXE/kickstart traffic. Now it exits non-zero, saying so,
    and the first keeps serving everything."""
    port = free_port()
    argv = [sys.executable, "-m", "karios.cli", "run", "bootapi", "--port", str(port)]
    first = subprocess.Popen(
        argv, env=_env("granian"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(first, base, "the first bootapi ready")
        assert first.poll() is None
        second = subprocess.run(argv, env=_env(server), capture_output=True, text=True, timeout=60)
        assert second.returncode != 0, second.stdout
        said = second.stdout + second.stderr
        assert "address already in use" in said.lower(), said
        if server == "granian":
            assert f"127.0.0.1:{port}" in said and "another process holds the port" in said, said
        ids = {httpx.get(f"{base}/readyz", timeout=2).headers.get("x-karios-instance") for _ in range(20)}
        assert len(ids) == 1, "every answer comes from the first bootapi"
    finally:
        first.kill()
        first.communicate()
