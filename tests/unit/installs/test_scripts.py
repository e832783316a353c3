"""The image and wipe methods' pure core: rendered scripts, network/serial settings, modules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.common.errors import PermanentFailure
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, HostContext
from karios.provisioner.install.image import ImageMethod, installed_cmdline, network_unit, serial_grub
from karios.provisioner.install.live import keep_modules, net_env, render_init
from karios.provisioner.install.wipe import WipeMethod
from karios.provisioner.media.cpio import read_initrd
from tests.fixtures.installs import initrd_with_overlay


def _cfg(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        cache_dir=tmp_path, images_dir=tmp_path / "images", mirror_host="", mirror_dir="/debian"
    )


def _ctx(**kw: object) -> HostContext:
    base: dict[str, object] = {
        "job_id": "job-1",
        "token": "tok'en$1",
        "callback_base": "http://10.0.2.100:8080/controlnode",
        "hostname": "node-1",
        "bmc_ip": "10.0.0.5",
        "os_username": "karios",
        "password_hash": "$6$salt$hash",
        "ssh_authorized_keys": ["ssh-ed25519 AAAAC3Nza test@lab"],
        "disks": ["/dev/vda", "/dev/vdb"],
        "md_level": 1,
        "image_url": "http://10.0.2.101:8081/images/bookworm/root.tar.zst",
        "kernel_args": ["intel_iommu=on", "iommu=pt"],
    }
    base.update(kw)
    return HostContext(**base)  # type: ignore[arg-type]


def _sh_ok(text: str) -> None:
    res = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_install_script_reports_every_stage_in_order_and_parses(tmp_path: Path) -> None:
    script = ImageMethod(_cfg(tmp_path)).render_install_script(_ctx())
    _sh_ok(script)
    reported = re.findall(r"^step ([a-z-]+) (?:active|done) (\d+)", script, re.M)
    assert reported == [(s.key, str(s.percent)) for s in INSTALL_STAGES]
    # secrets and values are shell-quoted, not interpolated raw
    assert "TOKEN='tok'\"'\"'en$1'" in script
    assert "USER_HASH='$6$salt$hash'" in script
    assert "MD_LEVEL=1" in script and "WANT_DISKS='/dev/vda /dev/vdb'" in script
    assert "CMDLINE='console=tty0 console=ttyS0,115200n8 intel_iommu=on iommu=pt'" in script
    assert "ssh-ed25519 AAAAC3Nza test@lab" in script
    assert "--target=x86_64-efi --efi-directory=/boot/efi --removable" in script


def test_install_script_single_disk_has_no_array(tmp_path: Path) -> None:
    script = ImageMethod(_cfg(tmp_path)).render_install_script(_ctx(disks=["/dev/sda"], md_level=None))
    _sh_ok(script)
    assert "MD_LEVEL=''" in script


def test_install_needs_image_url(tmp_path: Path) -> None:
    with pytest.raises(PermanentFailure, match="image_url"):
        ImageMethod(_cfg(tmp_path)).render_install_script(_ctx(image_url=""))


def test_medium_refuses_unbuilt_artifacts(tmp_path: Path) -> None:
    with pytest.raises(PermanentFailure, match="not built"):
        ImageMethod(_cfg(tmp_path)).medium(_ctx())
    with pytest.raises(PermanentFailure, match="not built"):
        WipeMethod(_cfg(tmp_path)).medium(_ctx())


def test_medium_overlay_lands_in_the_initrd(tmp_path: Path) -> None:
    import gzip

    suite = tmp_path / "images" / "bookworm"
    suite.mkdir(parents=True)
    (suite / "vmlinuz").write_bytes(b"kernel")
    (suite / "live.img").write_bytes(gzip.compress(b""))
    (suite / "root.tar.zst").write_bytes(b"root")
    medium = ImageMethod(_cfg(tmp_path)).medium(_ctx())
    assert medium.kernel == suite / "vmlinuz" and "rdinit=/init" in medium.kernel_args
    files = read_initrd(initrd_with_overlay(medium, tmp_path / "initrd").read_bytes())
    assert set(files) == {
        "karios/run.sh",
        "karios/net.env",
        "karios/firstboot.sh",
        "karios/firstboot.service",
    }
    assert b"JOB=job-1" in files["karios/run.sh"] and b"NET_MODE=dhcp" in files["karios/net.env"]
    assert b"/firstboot" in files["karios/firstboot.sh"]


def test_wipe_script_reports_per_disk_then_wiped(tmp_path: Path) -> None:
    script = WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx(disks=[]))
    _sh_ok(script)
    assert "WANT_DISKS=''" in script  # every disk
    assert re.search(r'step "wipe:\$d" done', script)
    keys = re.findall(r"^step (network|wiped) done (\d+)", script, re.M)
    assert keys == [(s.key, str(s.percent)) for s in WIPE_STAGES if s.key != "wipe"]
    for needed in ("wipefs -a -f", "blkdiscard -f", "oflag=direct", "iflag=direct", "mdadm --stop"):
        assert needed in script


def test_init_loads_modules_and_runs_the_overlay() -> None:
    init = render_init(["virtio_blk", "nvme"])
    _sh_ok(init)
    assert "for m in virtio_blk nvme; do" in init
    assert "/karios/run.sh" in init and "udhcpc" in init


def test_net_env_static_and_dhcp() -> None:
    static = {
        "address": "192.0.2.10",
        "netmask": "255.255.255.0",
        "gateway": "192.0.2.1",
        "nameservers": ["192.0.2.53"],
    }
    env = net_env("52:54:00:AA:BB:CC", static, [])
    assert "NET_MODE=static" in env and "NET_ADDRESS=192.0.2.10" in env and "NET_PREFIX=24" in env
    assert (
        "NET_GATEWAY=192.0.2.1" in env and "NET_DNS=192.0.2.53" in env and "NET_MAC=52:54:00:aa:bb:cc" in env
    )
    assert net_env("", None, ["9.9.9.9"]).startswith("NET_MODE=dhcp\n")


def test_installed_network_serial_and_cmdline() -> None:
    ctx = _ctx(
        static={"address": "192.0.2.10", "netmask": "24", "gateway": "192.0.2.1"}, nic_mac="52:54:00:AA:BB:CC"
    )
    unit = network_unit(ctx)
    assert (
        "MACAddress=52:54:00:aa:bb:cc" in unit
        and "Address=192.0.2.10/24" in unit
        and "Gateway=192.0.2.1" in unit
    )
    assert "DHCP=ipv4" in network_unit(_ctx())
    assert serial_grub("ttyS1,57600n8") == ("1", "57600")
    assert installed_cmdline(_ctx(serial_console="", kernel_args=[])) == ""


def test_keep_modules_keeps_the_dependency_closure(tmp_path: Path) -> None:
    kdir = tmp_path / "kernel/drivers"
    kdir.mkdir(parents=True)
    for name in ("virtio_blk", "virtio_ring", "snd_hda", "raid456", "async_xor"):
        (kdir / f"{name}.ko").write_bytes(b"")
    (tmp_path / "modules.dep").write_text(
        "kernel/drivers/virtio_blk.ko: kernel/drivers/virtio_ring.ko\n"
        "kernel/drivers/virtio_ring.ko:\n"
        "kernel/drivers/snd_hda.ko:\n"
        "kernel/drivers/raid456.ko: kernel/drivers/async_xor.ko\n"
        "kernel/drivers/async_xor.ko:\n"
    )
    assert keep_modules(tmp_path, ["virtio_blk", "raid456", "not_built"]) == ["virtio_blk", "raid456"]
    assert sorted(p.stem for p in kdir.iterdir()) == ["async_xor", "raid456", "virtio_blk", "virtio_ring"]


def test_callback_json_encoding_survives_quotes_newlines_and_empty(tmp_path: Path) -> None:
    """The scripts' ``json_str`` (shell + awk) makes valid JSON strings of log lines."""
    import json

    script = WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx())
    fn = re.search(r"^json_str\(\) \{.*?^\}", script, re.S | re.M)
    assert fn
    values = ["", "plain", 'quote " and back\\slash', "line1\nline2\ttab"]
    prog = fn.group(0) + "\n" + "".join(f"json_str {shlex_quote(v)}; echo\n" for v in values)
    out = subprocess.run(["sh", "-c", prog], capture_output=True, text=True, check=True).stdout.splitlines()
    assert [json.loads(line) for line in out] == ["", "plain", 'quote " and back\\slash', "line1\nline2 tab"]
    fn = re.search(r"^json_lines\(\) \{.*?^\}", script, re.S | re.M)
    assert fn
    prog = fn.group(0) + "\n" + "".join(f"json_lines {shlex_quote(v)}; echo\n" for v in values)
    out = subprocess.run(["sh", "-c", prog], capture_output=True, text=True, check=True).stdout.splitlines()
    expected = [[], ["plain"], ['quote " and back\\slash'], ["line1", "line2 tab"]]
    assert [json.loads(line) for line in out] == expected


def shlex_quote(v: str) -> str:
    import shlex

    return shlex.quote(v)
