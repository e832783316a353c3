"""`karios demo` as a newcomer runs it: one command, then `karios provision <demo BMC> --watch
--until booting` succeeds against the emulated BMCs it started; SIGTERM leaves no process behind.

`karios demo --fabric` (root): the demo also builds a 3-node FRR fabric in network namespaces with
a route reflector, adopts the nodes and stores a fabric configuration; `karios fabric apply --yes
--watch` against the demo's context exits 0 and the route reflector sees all three nodes'
EVPN sessions Established; SIGTERM removes every namespace, link and process it created. Without
root it refuses in one line (exit 2).

`karios demo --vm` (root): from a clean state directory, the README's commands as a user runs them:
the demo, then the `karios provision … --watch` it prints, in another process: the watch shows
every install stage in order and `completed`, the job's events say the same through the API, the
serial log the demo named has the installed system's login prompt, and SIGTERM leaves no qemu."""

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
    def __init__(self, root: Path, *extra: str, env_extra: dict[str, str] | None = None) -> None:
        self.root = root
        self.ports = {name: free_port() for name in PORT_VARS}
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        env |= {f"KARIOS_{var}_PORT": str(self.ports[n]) for n, var in PORT_VARS.items()}
        env |= {"KARIOS_STATE_DIR": str(root / "state"), "KARIOS_CONFIG": str(root / "client.json")}
        env["COLUMNS"] = "160"
        env |= env_extra or {}
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

    def emulator_log(self, state: str = "demo") -> str:
        return (self.root / "state" / state / "demo-bmcs" / "emulator.log").read_text(errors="replace")


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


def _cmdline(p: psutil.Process) -> str:
    """A live process's command line ("" once it has ended)."""
    with contextlib.suppress(psutil.Error):
        if p.status() != psutil.STATUS_ZOMBIE:
            return " ".join(p.cmdline())
    return ""


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


# -- karios demo --vm ------------------------------------------------------------------------


def _vm_skip_reason() -> str | None:
    from karios.cli.demo.vm import vm_unavailable
    from tests.fixtures.installs import install_tools_missing

    missing = install_tools_missing()
    return vm_unavailable() or (f"needs {', '.join(missing)}" if missing else None)


def _job_events(gw: str, token: str, job_id: str) -> list[tuple[str, dict]]:
    """The job's events from the start of the stream (``Last-Event-ID: 0``) up to its end."""
    found: list[tuple[str, dict]] = []
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": "0"}
    timeout = httpx.Timeout(10, read=30)
    with httpx.stream(
        "GET", f"{gw}/controlnode/events?channel=job:{job_id}", headers=headers, timeout=timeout
    ) as r:
        assert r.status_code == 200, r.read()
        name = ""
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                found.append((name, json.loads(line.partition(":")[2])["data"]))
                if name in ("job_completed", "job_failed", "job_cancelled"):
                    return found
    return found


@pytest.mark.vm(chain="debian-installer")  # the second VM chain, beside the image chain (tests/conftest.py)
@pytest.mark.timeout(2700)  # the image install under TCG: 6-10 min quiet, more under load
def test_demo_vm_installs_a_real_vm_to_first_boot_and_stops_clean():
    reason = _vm_skip_reason()
    if reason:
        if CI:
            pytest.fail(f"karios demo --vm needs root and qemu in CI: {reason}", pytrace=False)
        pytest.skip(f"karios demo --vm: {reason}")
    from karios.provisioner.install import INSTALL_STAGES
    from tests.fixtures.installs import cached_live_images

    # The images the lab caches (built once per machine, as the demo's own cache would be).
    images = cached_live_images()
    with state_dir("karios-demo-vm-") as root:
        demo = DemoRun(root, "--vm", env_extra={"KARIOS_PROVISIONER_IMAGES_DIR": str(images.images_dir)})
        pids: set[int] = set()
        try:
            t0 = time.monotonic()
            demo.wait_for("--method image --hostname demo-vm --watch", timeout=600)
            started = time.monotonic() - t0
            out = demo.text()
            serial = re.search(r"serial console: tail -f (\S+)", out)
            assert serial, out
            serial_log = Path(serial.group(1))
            assert serial_log == root / "state" / "demo-vm" / "vm" / "serial.log", out
            # The command the demo prints, run as printed (in another process, as a second terminal).
            command = next(ln.strip() for ln in out.splitlines() if "--method image --hostname demo-vm" in ln)
            argv = command.split()
            assert argv[:3] == ["karios", "provision", DEMO_BMC], command
            pids = {p.pid for p in psutil.Process(demo.proc.pid).children(recursive=True)}

            t1 = time.monotonic()
            r = demo.karios(*argv[1:], timeout=2400)
            installed = time.monotonic() - t1
            watch = r.stdout
            (root.parent / "karios-demo-vm-watch.txt").write_text(watch + r.stderr)
            tail = serial_log.read_text(errors="replace")[-3000:]
            assert r.returncode == 0, f"{watch}{r.stderr}\n--- serial log ends:\n{tail}"
            assert "Traceback" not in watch + r.stderr
            # Every install stage, in order, then the first boot and completed.
            labels = [s.label for s in INSTALL_STAGES]
            at = [watch.find(label) for label in labels]
            assert -1 not in at and at == sorted(at), watch
            states = ["booting", "installing", "first_boot", "completed"]
            first = [watch.find(f" {state} ") for state in states]
            assert -1 not in first and first == sorted(first), watch
            assert first[-1] > at[-1], watch

            # The job's events through the API: the same stages, then the first boot and the end.
            job_id = re.search(r"job (\S+) accepted for " + re.escape(DEMO_BMC), watch)
            assert job_id, watch
            token = (root / "state" / "demo-vm" / "admin.token").read_text().strip()
            gw = f"http://127.0.0.1:{demo.ports['api-gateway']}"
            events = _job_events(gw, token, job_id.group(1))
            names = [n for n, _ in events]
            steps = [d.get("message", "") for n, d in events if n == "job_step"]
            assert [next((lbl for lbl in labels if m.startswith(lbl)), m) for m in steps] == labels, steps
            assert names.index("job_booting") < names.index("job_step") < names.index("job_first_boot"), names
            assert names[-1] == "job_completed", names
            done = httpx.get(
                f"{gw}/controlnode/job/{job_id.group(1)}", headers={"Authorization": f"Bearer {token}"}
            )
            assert done.json()["node_ip"] == "10.0.2.15", done.text

            # The serial console the demo named shows the installed system's login prompt.
            wait_until_sync(
                lambda: "demo-vm login:" in serial_log.read_text(errors="replace"),
                timeout=300,
                interval=1,
                what="the installed system's login prompt on the serial log",
            )
            # The medium went into the VM's BMC and the reset booted it.
            emu = SimpleNamespace(log=lambda: demo.emulator_log("demo-vm"))
            system_id = re.search(rf"BMC {re.escape(DEMO_BMC)}\s+demo-1\s+Redfish system (\S+)", out)
            assert system_id, out
            assert bmc_posts(emu, system_id.group(1), "Actions/VirtualMedia.InsertMedia") == 1
            tree = psutil.Process(demo.proc.pid).children(recursive=True)
            pids |= {p.pid for p in tree}
            qemu = [cmd for cmd in map(_cmdline, tree) if cmd.startswith("qemu-system-x86_64 ")]
            assert len(qemu) == 1 and str(serial_log) in qemu[0], qemu  # the emulator's child
            print(f"demo --vm ready in {started:.1f}s; provision --watch to completed in {installed:.1f}s")
        finally:
            rc = demo.stop()
        assert rc == 0, demo.text()[-3000:]
        assert "karios: stopped" in demo.text()
        # Nothing left behind: no qemu, services, emulator or embedded server.
        assert not [p for p in _alive(pids) + _mine(root) if _running(p)]


RECORDER = """
import json, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(sys.argv[2:]) + "\\n")
time.sleep(300)
"""


def test_demo_vm_bmc_boots_the_inserted_medium_in_its_vm(tmp_path: Path):
    """The emulator `karios demo --vm` runs (real sushy-tools, the launcher's power patch), with a
    recorder in place of qemu: InsertMedia downloads the medium, the boot override and a power-on
    start the VM's command with that file as CD booted once; ForceOff stops it; the plain fake
    system beside it keeps the fake driver; stopping the emulator stops the VM. Seconds, no qemu."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from karios.cli.demo.bmc import DemoBmcs
    from karios.cli.demo.vm import DemoVm, qemu_spec

    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "job-1.iso").write_bytes(b"ISO" * 1000)
    handler = type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    media = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(tmp_path / "www")))
    threading.Thread(target=media.serve_forever, daemon=True).start()
    (tmp_path / "recorder.py").write_text(RECORDER)
    started = tmp_path / "started.jsonl"
    bmcs = DemoBmcs(
        tmp_path / "bmcs", count=2, executable=find_sushy_emulator(), vm_spec=tmp_path / "vms.json"
    )
    bmcs.start()
    try:
        vm_system, fake_system = (str(s["uuid"]) for s in bmcs.systems)
        vm = DemoVm(vm_system, "52:54:00:00:00:01", tmp_path / "vm")
        vm.workdir.mkdir()
        spec = qemu_spec(vm)
        spec["argv"] = [sys.executable, str(tmp_path / "recorder.py"), str(started), *spec["argv"][1:]]  # type: ignore[index]
        (tmp_path / "vms.json").write_text(json.dumps({vm_system: spec}))
        auth = (bmcs.username, bmcs.password) if bmcs.auth else None
        with httpx.Client(base_url=bmcs.url, auth=auth, timeout=30) as bmc:

            def system(uuid: str) -> dict:
                return bmc.get(f"/redfish/v1/Systems/{uuid}").json()

            def reset(uuid: str, kind: str) -> None:
                r = bmc.post(
                    f"/redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset", json={"ResetType": kind}
                )
                assert r.status_code < 300, r.text

            for uuid in (vm_system, fake_system):
                r = bmc.post(
                    f"/redfish/v1/Systems/{uuid}/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia",
                    json={"Image": f"http://127.0.0.1:{media.server_address[1]}/job-1.iso"},
                )
                assert r.status_code < 300, r.text
                r = bmc.patch(
                    f"/redfish/v1/Systems/{uuid}",
                    json={"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}},
                )
                assert r.status_code < 300, r.text
                reset(uuid, "On")
            assert system(vm_system)["PowerState"] == "On"
            wait_until_sync(started.exists, timeout=10, what="the VM's command to start")
            argv = json.loads(started.read_text().splitlines()[0])
            cd = next(a for a in argv if "media=cdrom" in a)
            iso = Path(cd.removeprefix("file=").split(",media=")[0])
            assert iso.is_relative_to(tmp_path / "bmcs" / "vmedia") and iso.read_bytes() == b"ISO" * 1000
            assert argv[argv.index(cd) + 1 :] == ["-boot", "once=d"], argv
            assert "mac=52:54:00:00:00:01" in " ".join(argv)
            recorder = [p for p in psutil.Process(bmcs.proc.pid).children() if str(started) in _cmdline(p)]
            assert len(recorder) == 1, "one VM process, the emulator's child"

            reset(vm_system, "ForceOff")
            assert system(vm_system)["PowerState"] == "Off"
            assert not _running(recorder[0])
            reset(vm_system, "On")  # on again: a new process
            wait_until_sync(
                lambda: len(started.read_text().splitlines()) == 2, timeout=10, what="a second start"
            )
            assert len(started.read_text().splitlines()) == 2  # the fake system never started one
            again = [p for p in psutil.Process(bmcs.proc.pid).children() if str(started) in _cmdline(p)]
    finally:
        bmcs.stop()
        media.shutdown()
    assert again and not _running(again[0])  # the VM stops with the emulator


def test_demo_vm_without_root_is_one_line_and_exit_2():
    """As a user who is not root (here: `nobody` through setpriv when the test runs as root)."""
    argv = [*KARIOS, "demo", "--vm"]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root and no setpriv to drop to an unprivileged user")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env |= {"KARIOS_STATE_DIR": "/nonexistent/karios-state", "HOME": "/nonexistent"}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "karios demo --vm: needs root (it builds the install image with mmdebstrap and chroot); "
        "run it with sudo"
    ], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
