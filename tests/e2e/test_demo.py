"""`karios demo` as a newcomer runs it: one command, then `karios provision <demo BMC> --watch
--until booting` succeeds against the emulated BMCs it started; SIGTERM leaves no process behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest

from tests.fixtures.apps import free_port
from tests.fixtures.chaos import PORT_VARS, state_dir
from tests.fixtures.provision import bmc_posts
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import find_sushy_emulator

pytestmark = pytest.mark.lab  # the sushy-tools emulator (the lab's cached venv)

DEMO_BMC = "192.0.2.11"
KARIOS = [sys.executable, "-m", "karios.cli"]


class DemoRun:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {name: free_port() for name in PORT_VARS}
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        env |= {f"KARIOS_{var}_PORT": str(self.ports[n]) for n, var in PORT_VARS.items()}
        env |= {"KARIOS_STATE_DIR": str(root / "state"), "KARIOS_CONFIG": str(root / "client.json")}
        env["COLUMNS"] = "160"
        self.env = env
        self.proc = subprocess.Popen(
            [*KARIOS, "demo", "--timeout", "150", "--sushy-emulator", find_sushy_emulator()],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def karios(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*KARIOS, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def emulator_log(self) -> str:
        return (self.root / "state" / "demo" / "demo-bmcs" / "emulator.log").read_text(errors="replace")


def _mine(root: Path) -> list[psutil.Process]:
    """Every process whose command line names the demo's directory (services, emulator, PostgreSQL)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(root) in cmd:
            found.append(p)
    return found


def _alive(pids: set[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(pid))
    return found


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_demo_provisions_an_emulated_server_to_booting_and_stops_clean():
    with state_dir("karios-demo-") as root:
        demo = DemoRun(root)
        pids: set[int] = set()
        try:
            t0 = time.monotonic()

            def ready() -> bool:
                if demo.proc.poll() is not None:
                    raise AssertionError("karios demo exited early:\n" + demo.text())
                return f"karios provision {DEMO_BMC} --watch --until booting" in demo.text()

            wait_until_sync(ready, timeout=240, interval=0.2, what="karios demo to be ready")
            started = time.monotonic() - t0
            out = demo.text()
            system_id = re.search(rf"BMC {re.escape(DEMO_BMC)}\s+demo-1\s+Redfish system (\S+)", out)
            assert system_id, out
            pids = {p.pid for p in psutil.Process(demo.proc.pid).children(recursive=True)}
            assert len(pids) >= 6, pids  # five services and the emulator (at least)

            # What the demo prints is what works: the CLI context it wrote, the console.
            gw = f"http://127.0.0.1:{demo.ports['api-gateway']}"
            assert f"console: {gw}/console" in out
            t1 = time.monotonic()
            r = demo.karios("provision", DEMO_BMC, "--watch", "--until", "booting", timeout=180)
            provisioned = time.monotonic() - t1
            assert r.returncode == 0, r.stdout + r.stderr
            assert "booting" in r.stdout and "Traceback" not in r.stdout + r.stderr
            (root.parent / "karios-demo-provision-watch.txt").write_text(r.stdout)
            # The boot medium went into that emulated system, and it was reset into it.
            emu = SimpleNamespace(log=demo.emulator_log)
            assert bmc_posts(emu, system_id.group(1), "Actions/VirtualMedia.InsertMedia") == 1
            assert bmc_posts(emu, system_id.group(1), "Actions/ComputerSystem.Reset") == 1

            # The demo's advice to end a job that waits at booting works too.
            jobs = json.loads(demo.karios("--output", "json", "jobs").stdout)
            job_id = next(e["job_id"] for e in jobs["entries"] if e["bmc_ip"] == DEMO_BMC)
            assert demo.karios("job", "cancel", job_id).returncode == 0
            with httpx.Client(base_url=gw, timeout=10) as c:
                assert c.get("/console/login").status_code == 200
            print(f"demo ready in {started:.1f}s; provision to booting in {provisioned:.1f}s")
        finally:
            if demo.proc.poll() is None:
                demo.proc.send_signal(signal.SIGTERM)
            try:
                rc = demo.proc.wait(90)
            except subprocess.TimeoutExpired:
                demo.proc.kill()
                raise
        assert rc == 0, demo.text()[-3000:]
        assert "karios: stopped" in demo.text()
        # Nothing left behind: not the services, not the emulator, not the embedded servers.
        assert not [p for p in _alive(pids) + _mine(root) if _running(p)]
