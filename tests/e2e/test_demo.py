"""`karios demo` as a newcomer runs it: one command, then `karios provision <demo BMC> --watch
--until booting` succeeds against the emulated BMCs it started; SIGTERM leaves no process behind.

`karios demo --fabric` (root): the demo also builds a 3-node FRR fabric in network namespaces with
a route reflector, adopts the nodes and stores a fabric configuration; `karios fabric apply --yes
--watch` against the demo's context exits 0 and the route reflector sees all three nodes'
EVPN sessions Established; SIGTERM removes every namespace, link and process it created. Without
root it refuses in one line (exit 2)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
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
from tests.lab import fabric_lab
from tests.lab.redfish_lab import find_sushy_emulator

pytestmark = pytest.mark.lab  # the sushy-tools emulator (the lab's cached venv)

DEMO_BMC = "192.0.2.11"
KARIOS = [sys.executable, "-m", "karios.cli"]
CI = os.environ.get("CI", "").lower() == "true"


class DemoRun:
    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.ports = {name: free_port() for name in PORT_VARS}
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        env |= {f"KARIOS_{var}_PORT": str(self.ports[n]) for n, var in PORT_VARS.items()}
        env |= {"KARIOS_STATE_DIR": str(root / "state"), "KARIOS_CONFIG": str(root / "client.json")}
        env["COLUMNS"] = "160"
        self.env = env
        self.proc = subprocess.Popen(
            [*KARIOS, "demo", "--timeout", "150", "--sushy-emulator", find_sushy_emulator(), *extra],
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

    def wait_for(self, text: str, timeout: float = 240) -> None:
        def printed() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError("karios demo exited early:\n" + self.text())
            return text in self.text()

        wait_until_sync(printed, timeout=timeout, interval=0.2, what="karios demo to be ready")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

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


# -- karios demo --fabric --------------------------------------------------------------------


def _rr_evpn_states(lab: dict) -> dict[str, str]:
    """{node address: state} of the route reflector's l2vpn evpn sessions, read with vtysh inside
    the route reflector's namespaces (its zebra's network and mount namespace)."""
    pid = (Path(lab["route_reflector"]["run_frr_dir"]) / "zebra.pid").read_text().strip()
    out = subprocess.run(
        ["nsenter", "-t", pid, "-m", "-n", "--", "vtysh", "-c", "show bgp l2vpn evpn summary json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return {ip: p.get("state", "") for ip, p in json.loads(out or "{}").get("peers", {}).items()}


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


@pytest.mark.fabric_lab
@pytest.mark.timeout(900)  # a fresh state dir (initdb), the lab may wait for another lab's host link
def test_demo_fabric_applies_evpn_to_three_namespace_nodes_and_stops_clean():
    reason = fabric_lab.skip_reason()
    if reason:
        if CI:
            pytest.fail(f"karios demo --fabric needs the fabric lab in CI: {reason}", pytrace=False)
        pytest.skip(f"karios demo --fabric: {reason}")
    with state_dir("karios-demo-fabric-") as root:
        demo = DemoRun(root, "--fabric")
        pids: set[int] = set()
        lab: dict = {}
        try:
            t0 = time.monotonic()
            demo.wait_for("karios fabric apply --watch", timeout=600)
            started = time.monotonic() - t0
            out = demo.text()
            lab = json.loads((root / "state" / "demo-fabric" / "fabric-lab.json").read_text())
            node_ips = [n["underlay_ip"] for n in lab["nodes"]]
            assert node_ips == ["198.18.0.11", "198.18.0.12", "198.18.0.13"], lab
            assert set(lab["namespaces"]) <= _netns() and lab["host_link"] in _links(), lab
            gw = f"http://127.0.0.1:{demo.ports['api-gateway']}"
            assert f"console: {gw}/console/fabric" in out, out
            for n in lab["nodes"]:  # printed with the fingerprint the gateway pinned
                assert f"{n['name']}  {n['underlay_ip']}" in out and n["host_key_fingerprint"] in out, out
            assert "AS 65000, VNIs 100,200, peer 198.18.0.1" in out, out
            pids = {p.pid for p in psutil.Process(demo.proc.pid).children(recursive=True)}

            # Adopted through the gateway (the CLI's view), the configuration stored.
            nodes = json.loads(demo.karios("--output", "json", "nodes").stdout)
            entries = nodes["items"]
            assert sorted(e["node_ip"] for e in entries) == node_ips, nodes
            assert {e["source"] for e in entries} == {"adopted"}, nodes
            assert _rr_evpn_states(lab) == {}, "no node peers before the apply"

            t1 = time.monotonic()
            r = demo.karios("fabric", "apply", "--yes", "--watch", timeout=300)
            applied = time.monotonic() - t1
            assert r.returncode == 0, r.stdout + r.stderr
            assert "3 of 3 node(s) would change" in r.stdout and "completed" in r.stdout, r.stdout
            assert all(ip in r.stdout for ip in node_ips), r.stdout
            wait_until_sync(
                lambda: _rr_evpn_states(lab) == dict.fromkeys(node_ips, "Established"),
                timeout=60,
                interval=0.5,
                what="the route reflector's EVPN sessions to all three nodes",
            )
            with httpx.Client(base_url=gw, timeout=10) as c:
                assert c.get("/console/login").status_code == 200
            print(f"demo --fabric ready in {started:.1f}s; fabric apply --yes --watch {applied:.1f}s")
        finally:
            t2 = time.monotonic()
            rc = demo.stop()
            print(f"demo --fabric stopped (lab removed) in {time.monotonic() - t2:.1f}s")
        assert rc == 0, demo.text()[-3000:]
        assert "karios demo: fabric lab removed" in demo.text()
        # Nothing left behind: no namespace, no link, no process (services, sshd, FRR, emulator).
        assert not set(lab["namespaces"]) & _netns()
        assert lab["host_link"] not in _links()
        assert not Path(lab["workdir"]).exists()
        assert not [p for p in _alive(pids) + _mine(root) + _mine(Path(lab["workdir"])) if _running(p)]


def test_demo_fabric_without_root_is_one_line_and_exit_2():
    """As a user who is not root (here: `nobody` through setpriv when the test runs as root)."""
    argv = [*KARIOS, "demo", "--fabric"]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root and no setpriv to drop to an unprivileged user")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env |= {"KARIOS_STATE_DIR": "/nonexistent/karios-state", "HOME": "/nonexistent"}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "karios demo --fabric: needs root (it creates network namespaces, veths and a bridge); "
        "run it with sudo"
    ], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
