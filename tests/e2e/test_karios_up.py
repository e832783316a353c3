"""`karios up` on the embedded default: five services ready, register → SSE, clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fixtures.apps import free_port
from tests.fixtures.chaos import state_dir
from tests.fixtures.wait import wait_until_sync

SERVICES = ("GATEWAY", "BOOTAPI", "PROVISIONER", "INVENTORY", "FABRIC_WORKER")


def _get(url: str, token: str, timeout: float = 5) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


@pytest.fixture
def state_root() -> Iterator[Path]:
    # Not tmp_path: embedded initdb runs as another user, who cannot enter /tmp/pytest-of-root.
    with state_dir("karios-e2e-") as root:
        yield root


@pytest.mark.timeout(240)
def test_karios_up_runs_everything_and_stops_cleanly(state_root: Path):
    state = state_root / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env["KARIOS_STATE_DIR"] = str(state)
    ports = {name: free_port() for name in SERVICES}
    for name, port in ports.items():
        env[f"KARIOS_{name}_PORT"] = str(port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "karios.cli", "up", "--timeout", "150"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    try:
        t0 = time.monotonic()
        while True:
            line = proc.stdout.readline()
            assert line, "karios up exited early:\n" + "".join(out)
            out.append(line)
            if "Ctrl-C stops everything" in line:
                break
        startup = time.monotonic() - t0
        text = "".join(out)
        assert text.count(" ready  http://") == 5, text
        token = (state / "admin.token").read_text().strip()
        assert token in text  # dev mode prints the generated admin token
        gw = f"http://127.0.0.1:{ports['GATEWAY']}"

        # Register a node and see the event on the SSE stream (resume from 0 = the whole stream).
        body = json.dumps({"bmc_ip": "10.9.0.1", "os_hostname": "demo-1", "bmc_password": "pw-123"}).encode()
        req = urllib.request.Request(
            f"{gw}/controlnode/register",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["success"] is True
        sse = urllib.request.Request(
            f"{gw}/controlnode/events?channel=provision",
            headers={"Authorization": f"Bearer {token}", "Last-Event-ID": "0"},
        )
        with urllib.request.urlopen(sse, timeout=10) as r:
            buf = b""
            while b"node_registered" not in buf:
                chunk = r.read1(4096)
                assert chunk
                buf += chunk
        assert b"10.9.0.1" in buf and b"pw-123" not in buf
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 6  # 5 services + nats-server (+ postgres)
        print(f"karios up: ready in {startup:.1f}s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise

    def orphans() -> list[psutil.Process]:
        alive = []
        for c in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                    alive.append(c)
        return alive

    with contextlib.suppress(AssertionError):
        wait_until_sync(lambda: not orphans(), timeout=10, what="every child to exit")
    alive = orphans()
    assert not alive, f"orphans left: {[c.cmdline() for c in alive]}"
    assert proc.returncode == 0
