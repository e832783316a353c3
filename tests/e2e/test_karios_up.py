"""`karios up` on the embedded default: five services ready, register → SSE, clean stop; its main
thread imports nothing while the services' code is preloaded beside it."""

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


# `karios up` as `python -m karios.cli up`, with an audit hook recording each import made by a
# thread other than "preload" while that thread runs (Up.run): two threads importing one package at
# once can hand one of them the half-initialised module (a start failed on prometheus_client so).
AUDITED_UP = """
import json, os, runpy, sys, threading
mine, others = [], []
def hook(event, args):
    if event != "import":
        return
    me = threading.current_thread().name
    if me == "preload":
        mine.append(args[0])
    elif any(t.name == "preload" for t in threading.enumerate()):
        others.append(f"{me}: {args[0]}")
sys.addaudithook(hook)
def record():
    with open(os.environ["KARIOS_TEST_IMPORTS"], "w") as f:
        json.dump({"preload": mine, "others": others}, f)
import atexit
atexit.register(record)
runpy.run_module("karios.cli", run_name="__main__", alter_sys=True)
"""


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
    env["KARIOS_TEST_IMPORTS"] = str(state_root / "imports.json")
    proc = subprocess.Popen(
        [sys.executable, "-c", AUDITED_UP, "up", "--timeout", "150"],
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
    imports = json.loads((state_root / "imports.json").read_text())
    # The hook sees `import` statements (importlib.import_module raises no audit event): the
    # gateway's own modules, imported by its app module in the preload thread.
    assert any(m.startswith("karios.api_gateway.") for m in imports["preload"]), imports
    assert imports["others"] == [], "imported beside the preload (karios.cli.up: _import_for_backends)"
