"""`karios demo --vm`'s pure parts: the qemu command, the guest's routes to the services, the
emulator's power patch (on a stand-in for sushy-tools' fake driver, with real processes), the
launcher and the inventory of a VM server. Booting the VM is tests/e2e/test_demo.py's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from karios.cli.demo import vm as demo_vm
from karios.cli.demo.bmc import launcher
from karios.cli.demo.command import demo_inventory
from karios.cli.demo.vm import DemoVm, guest_routes, qemu_argv, qemu_spec
from karios.cli.demo.vm_power import QemuPower, inserted_medium, patch_fake_driver, qemu_command
from tests.fixtures.wait import wait_until_sync

UUID = "0d5c1a52-3f1e-4a7e-9c55-6a1d2b3c4d5e"


def _vm(tmp_path: Path) -> DemoVm:
    routes = guest_routes("http://127.0.0.1:8080", "http://127.0.0.1:8081")
    return DemoVm(UUID, "52:54:00:aa:bb:cc", tmp_path, guestfwd=routes.guestfwd)


def test_qemu_boots_the_inserted_medium_once_then_the_disk(tmp_path: Path):
    vm = _vm(tmp_path)
    assert qemu_argv(vm, iso="/m/job.iso") == [
        "qemu-system-x86_64", "-accel", "tcg", "-m", "1024", "-smp", "1", "-display", "none",
        "-name", "karios-demo-0d5c1a52",
        "-chardev", f"file,id=serial0,path={tmp_path}/serial.log,append=on", "-serial", "chardev:serial0",
        "-netdev",
        "user,id=n0,restrict=on"
        ",guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:8080"
        ",guestfwd=tcp:10.0.2.101:8081-cmd:socat - TCP:127.0.0.1:8081",
        "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:aa:bb:cc",
        "-drive", f"file={tmp_path}/vda.img,format=raw,if=none,id=d0,discard=unmap,cache=unsafe",
        "-device", "virtio-blk-pci,drive=d0",
        "-drive", "file=/m/job.iso,media=cdrom,readonly=on", "-boot", "once=d",
    ]  # fmt: skip


def test_qemu_without_a_medium_or_without_the_override_boots_the_disk(tmp_path: Path):
    vm = _vm(tmp_path)
    bare = qemu_argv(vm, iso=None)
    assert "media=cdrom" not in " ".join(bare) and "-boot" not in bare
    inserted = qemu_argv(vm, iso="/m/job.iso", boot_cd=False)
    assert inserted[-2:] == ["-drive", "file=/m/job.iso,media=cdrom,readonly=on"]
    assert "-boot" not in inserted
    # qemu's option syntax: a comma in the path is doubled, not an option separator.
    assert qemu_command(qemu_spec(vm), "/m/a,b.iso", False)[-1] == "file=/m/a,,b.iso,media=cdrom,readonly=on"


def test_the_guest_reaches_the_services_at_the_guestfwd_addresses():
    routes = guest_routes("http://127.0.0.1:8080", "http://0.0.0.0:8081")
    assert routes.env == {
        "KARIOS_PROVISIONER_CALLBACK_URL": "http://10.0.2.100:8080",
        "KARIOS_PROVISIONER_IMAGE_URL": "http://10.0.2.101:8081",
    }
    # A wildcard listener is reached on loopback; the scheme is the service's own.
    assert routes.guestfwd == {"10.0.2.100:8080": "127.0.0.1:8080", "10.0.2.101:8081": "127.0.0.1:8081"}
    tls = guest_routes("https://127.0.0.1:9443", "https://[::1]:9444")
    assert tls.env["KARIOS_PROVISIONER_CALLBACK_URL"] == "https://10.0.2.100:9443"
    assert tls.guestfwd["10.0.2.101:9444"] == "[::1]:9444"


def test_a_vm_server_is_in_the_inventory_with_the_disk_its_qemu_has():
    systems: list[dict[str, object]] = [{"nics": [{"mac": f"52:54:00:00:00:0{i}"}]} for i in (1, 2)]
    inv = demo_inventory(["192.0.2.11", "192.0.2.12"], systems, vm_servers=1)
    devices = inv["devices"]
    assert devices[0]["disks"] == [{"name": "vda", "size_gb": demo_vm.DISK_GB}]  # type: ignore[index]
    assert [d["name"] for d in devices[1]["disks"]] == ["sda", "sdb"]  # type: ignore[index]
    assert devices[0]["interfaces"][0]["macs"] == ["52:54:00:00:00:01"]  # type: ignore[index]


def test_the_launcher_patches_the_fake_driver_only_for_vm_demos(tmp_path: Path):
    plain = launcher(tmp_path)
    with_vm = launcher(tmp_path, tmp_path / "vms.json")
    for script in (plain, with_vm):
        compile(script, "launch.py", "exec")  # valid Python, whatever the paths
        assert "fakedriver.random = _NoPowerDelay()" in script
    assert "karios_vm_power" not in plain
    assert f"patch_fake_driver(fakedriver.FakeDriver, {str(tmp_path / 'vms.json')!r})" in with_vm
    assert with_vm.index("patch_fake_driver") < with_vm.index("from sushy_tools.emulator.main import main")


def test_vm_demo_needs_root(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert demo_vm.vm_unavailable() == (
        "needs root (it builds the install image with mmdebstrap and chroot); run it with sudo"
    )


# -- the power patch on a stand-in for sushy-tools' FakeDriver ---------------------------------


class StandInFakeDriver:
    """The part of sushy-tools' FakeDriver the patch wraps: systems by UUID, _get/_update and the
    delayed power change (recorded here)."""

    def __init__(self, systems: list[dict[str, Any]]) -> None:
        self.systems = {s["uuid"]: s for s in systems}
        self.fake_calls: list[tuple[str, str]] = []

    def _get(self, identity: str) -> dict[str, Any]:
        return self.systems[identity]

    def _update(self, system: dict[str, Any], **changes: Any) -> None:
        system.update(changes)

    def set_power_state(self, identity: str, state: str) -> None:
        self.fake_calls.append((identity, state))

    def get_power_state(self, identity: str) -> str:
        return str(self._get(identity)["power_state"])


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)", "qemu"]


@pytest.fixture
def driver(tmp_path: Path):  # type: ignore[no-untyped-def]
    iso = tmp_path / "job.iso"
    iso.write_bytes(b"iso")
    spec = {
        UUID: {"argv": SLEEPER, "cd": ["cd={iso}"], "boot_cd": ["boot=cd"], "log": str(tmp_path / "qemu.log")}
    }
    (tmp_path / "vms.json").write_text(json.dumps(spec))
    cls = type("Driver", (StandInFakeDriver,), {})
    power = patch_fake_driver(cls, tmp_path / "vms.json")
    vm_system = {
        "uuid": UUID,
        "power_state": "Off",
        "boot_device": "Cd",
        "boot_image": {"Cd": (str(iso), True, True)},
    }
    other = {"uuid": "fake-2", "power_state": "Off"}
    drv = cls([vm_system, other])
    yield drv, power, iso
    for uuid in list(power.procs):
        power._stop(uuid)


def test_power_on_boots_qemu_from_the_inserted_medium_and_off_stops_it(driver):  # type: ignore[no-untyped-def]
    drv, power, iso = driver
    drv.set_power_state(UUID, "On")
    first = power.procs[UUID]
    assert drv.get_power_state(UUID) == "On" and first.poll() is None
    assert power.commands[UUID] == [*SLEEPER, f"cd={iso}", "boot=cd"]
    drv.set_power_state(UUID, "On")  # already on: the same process
    assert power.procs[UUID] is first

    drv.set_power_state(UUID, "ForceRestart")  # a new qemu, the old one gone
    assert power.procs[UUID] is not first and first.poll() is not None
    assert drv.get_power_state(UUID) == "On"

    drv.systems[UUID]["boot_device"] = "Hdd"  # the override cleared, the medium still inserted
    drv.set_power_state(UUID, "ForceRestart")
    assert power.commands[UUID] == [*SLEEPER, f"cd={iso}"]

    last = power.procs[UUID]
    drv.set_power_state(UUID, "ForceOff")
    assert last.poll() is not None and drv.get_power_state(UUID) == "Off"
    assert drv.fake_calls == []  # the fake driver's delayed power change never ran for the VM


def test_an_ejected_medium_boots_the_disk_and_a_guest_power_off_shows(driver):  # type: ignore[no-untyped-def]
    drv, power, iso = driver
    iso.unlink()  # EjectMedia removes the downloaded file
    assert inserted_medium(drv.systems[UUID]) is None
    drv.set_power_state(UUID, "On")
    assert power.commands[UUID] == SLEEPER
    power.procs[UUID].kill()  # the guest powered itself off: qemu exits
    wait_until_sync(lambda: drv.get_power_state(UUID) == "Off", timeout=10, what="power state Off")


def test_plain_fake_systems_and_other_actions_keep_the_fake_driver(driver):  # type: ignore[no-untyped-def]
    drv, power, _ = driver
    drv.set_power_state("fake-2", "On")
    drv.set_power_state(UUID, "Nmi")
    assert drv.fake_calls == [("fake-2", "On"), (UUID, "Nmi")]
    assert power.procs == {}


def test_qemu_outlives_the_request_thread_and_dies_with_the_emulator(tmp_path: Path):
    """PR_SET_PDEATHSIG fires when the *thread* that forked ends: qemu is forked by the spawner
    thread, so it survives the request thread that powered it on and dies with the emulator
    (here a child process playing it, the module loaded alone as the launcher loads it)."""
    spec = {UUID: {"argv": SLEEPER, "cd": [], "boot_cd": [], "log": str(tmp_path / "qemu.log")}}
    (tmp_path / "vms.json").write_text(json.dumps(spec))
    emulator = f"""
import sys, threading, time
sys.path.insert(0, {str(Path(demo_vm.__file__).parent)!r})
import vm_power
power = vm_power.QemuPower(vm_power.Path({str(tmp_path / "vms.json")!r}))
request = threading.Thread(target=power.apply, args=({UUID!r}, power.spec({UUID!r}), "On", None, False))
request.start()
request.join()
time.sleep(1)  # the request thread is gone: a qemu tied to it would be dead by now
print(power.procs[{UUID!r}].pid, power.running({UUID!r}), flush=True)
time.sleep(120)
"""
    proc = subprocess.Popen([sys.executable, "-c", emulator], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid, running = proc.stdout.readline().split()
        assert running == "True" and _alive(int(pid))
    finally:
        proc.kill()
        proc.wait()
    wait_until_sync(lambda: not _alive(int(pid)), timeout=10, what="qemu to die with the emulator")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_qemu_power_reads_no_spec_before_the_demo_wrote_it(tmp_path: Path):
    power = QemuPower(tmp_path / "absent.json", spawn=lambda argv, log: None)
    assert power.spec(UUID) is None


# -- the one-time image build: a line before, its time after, nothing when cached ---------------


class StandInImages:
    """A ``LiveImages`` stand-in: ready once built; a build that may fail."""

    def __init__(self, images_dir: Path, *, ready: bool = False, fails: str = "") -> None:
        self.images_dir, self.built, self.fails = images_dir, ready, fails
        self.builds: list[str] = []

    def ready(self, suite: str) -> bool:
        return self.built

    def build(self, suite: str) -> dict[str, float]:
        from karios.common.errors import PermanentFailure

        self.builds.append(suite)
        if self.fails:
            raise PermanentFailure(self.fails)
        self.built = True
        return {}


def test_a_fresh_machine_builds_the_images_once_and_says_how_long(tmp_path: Path):
    images = StandInImages(tmp_path / "images" / "k1")
    said: list[str] = []
    took = demo_vm.ensure_images(images, said.append)
    assert images.builds == ["bookworm"] and took is not None
    assert said[0] == (
        f"karios demo --vm: building the image install's Debian bookworm images into {tmp_path}/images/k1 "
        "(once; a few minutes)…"
    )
    assert re.fullmatch(r"karios demo --vm: images built in \d+s", said[1]), said
    said.clear()
    assert demo_vm.ensure_images(images, said.append) is None  # cached: no build, not a word
    assert images.builds == ["bookworm"] and said == []


def test_a_failed_image_build_is_one_message(tmp_path: Path):
    images = StandInImages(tmp_path / "images" / "k1", fails="image build tools missing: mmdebstrap")
    with pytest.raises(RuntimeError) as err:
        demo_vm.ensure_images(images, lambda line: None)
    assert str(err.value) == "building the install images failed: image build tools missing: mmdebstrap"
