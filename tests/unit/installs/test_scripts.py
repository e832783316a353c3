"""The image and wipe methods' pure core: rendered scripts, network/serial settings, modules."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.common.errors import PermanentFailure
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, HostContext
from karios.provisioner.install.image import ImageMethod, installed_cmdline, network_unit, serial_grub
from karios.provisioner.install.live import keep_modules, net_env, render_init
from karios.provisioner.install.wipe import WipeMethod
from karios.provisioner.media.cpio import read_initrd
from tests.fixtures.apps import REQUIRE, free_port
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


def test_install_script_zfs_backend(tmp_path: Path) -> None:
    """pool_backend zfs: four partitions a disk, /boot md RAID1 (metadata at the end: GRUB and
    firmware read each member as ext4), the pool of the 4th partitions as the vdev asked, the root
    a dataset, the pool exported at the end; the ZFS /boot counted in the disk overhead."""
    ctx = _ctx(disks=["/dev/vda", "/dev/vdb", "/dev/vdc"], md_level=5, pool_backend="zfs", zfs_vdev="raidz1")
    script = ImageMethod(_cfg(tmp_path)).render_install_script(ctx, installed_bytes=600 << 20)
    _sh_ok(script)
    assert "POOL_BACKEND=zfs" in script and "ZFS_VDEV=raidz1" in script
    assert f"DISK_OVERHEAD={(258 + 512) << 20}" in script
    assert "POOL_WORDS='a ZFS raidz1'" in script
    assert '-R $T "$ZFS_POOL" $ZFS_VDEV "$@"' in script
    assert "--metadata=1.0" in script and 'zpool export "$ZFS_POOL"' in script
    assert 'ROOT_ARG="root=ZFS=$ZFS_ROOT"' in script
    md = ImageMethod(_cfg(tmp_path)).render_install_script(_ctx(), installed_bytes=600 << 20)
    assert "POOL_BACKEND=md" in md and f"DISK_OVERHEAD={258 << 20}" in md and "POOL_WORDS=RAID1" in md


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


def test_wipe_policy_comes_from_the_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``wipe_policy`` (KARIOS_PROVISIONER_WIPE_POLICY): fast by default, secure runs the ladder."""
    from karios.provisioner.config import ProvisionerConfig

    assert "\nWIPE_POLICY=fast\n" in WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx())
    secure = WipeMethod(SimpleNamespace(**vars(_cfg(tmp_path)), wipe_policy="secure"))
    script = secure.render_wipe_script(_ctx())
    _sh_ok(script)
    assert "\nWIPE_POLICY=secure\n" in script and 'if [ "$WIPE_POLICY" = secure ]; then' in script
    with pytest.raises(PermanentFailure, match="wipe_policy 'slow'"):
        WipeMethod(SimpleNamespace(**vars(_cfg(tmp_path)), wipe_policy="slow"))
    monkeypatch.setenv("KARIOS_PROVISIONER_WIPE_POLICY", "secure")
    assert ProvisionerConfig().wipe_policy == "secure"
    monkeypatch.setenv("KARIOS_PROVISIONER_WIPE_POLICY", "thorough")
    with pytest.raises(ValueError, match="wipe_policy"):
        ProvisionerConfig()


def test_init_loads_modules_and_runs_the_overlay() -> None:
    init = render_init(["virtio_blk", "nvme", "sd_mod", "ext4"])
    _sh_ok(init)
    # Device drivers load by the modalias of the devices present; the rest always.
    assert "for m in sd_mod ext4; do" in init
    assert "cat /sys/bus/*/devices/*/modalias" in init and "modprobe -qab $now" in init
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


#: The awks the callbacks meet: mawk in the live environment (Debian's required awk), gawk on a
#: developer's host, busybox awk in debian-installer. Each is the apt package of the same name.
AWKS = ("mawk", "gawk", "busybox")


@pytest.fixture(params=AWKS)
def awk_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ``PATH`` whose ``awk`` is the implementation named (busybox dispatches on the name)."""
    name = request.param
    exe = shutil.which(name)
    if exe is None:
        reason = f"{name} is not installed (apt-get install {name}; tests/lab/setup.sh installs it in CI)"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    bindir = tmp_path / f"awk-{name}"
    bindir.mkdir()
    (bindir / "awk").symlink_to(exe)
    return f"{bindir}{os.pathsep}{os.environ['PATH']}"


def _callbacks(script: str) -> str:
    """The callbacks block of a rendered script: its settings and functions, none of its prelude."""
    return script[script.index("# -- Karios callbacks") : script.index("# Everything below goes to the log")]


#: Every kind of byte a message carries: zstd's backslash, quotes, control characters, tabs,
#: newlines (inside and at the end), non-ASCII UTF-8 of 2, 3 and 4 bytes.
MESSAGES = [
    "",
    "plain",
    "/*stdin*\\ : Decoding error (36) : Data corruption detected",
    'quote " and back\\slash, two \\\\ and a last one\\',
    "line1\nline2\ttab\r\n",
    "ctl \x01\x08\x0c\x1b\x1f del \x7f",
    "UTF-8: é ü 日本 🚀",
    "trailing newline\n",
]


def test_callback_json_encoding_is_exact_under_every_awk(tmp_path: Path, awk_path: str) -> None:
    """``json_str``/``json_lines`` under mawk, gawk and busybox awk: Python's json gives back the
    original message byte for byte; a byte that is not UTF-8 becomes U+FFFD."""
    fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx()))
    env = {"PATH": awk_path, **{f"V{i}": v for i, v in enumerate(MESSAGES)}}
    for fn in ("json_str", "json_lines"):
        prog = fns + "".join(f'{fn} "$V{i}"; echo\n' for i in range(len(MESSAGES)))
        out = subprocess.run(["sh", "-c", prog], env=env, capture_output=True, check=True).stdout
        got = [json.loads(line) for line in out.decode().split("\n")[:-1]]
        if fn == "json_str":
            assert [g.encode() for g in got] == [m.encode() for m in MESSAGES]
        else:
            assert got == [m.removesuffix("\n").split("\n") if m else [] for m in MESSAGES]
    bad = subprocess.run(
        ["sh", "-c", fns + 'json_str "$V"'],
        env={b"PATH": awk_path.encode(), b"V": b"\xff bad \xc3 cut \xe6\x97 \xed\xa0\x80 \xc3\xa9"},
        capture_output=True,
        check=True,
    ).stdout
    assert json.loads(bad) == "\ufffd bad \ufffd cut \ufffd\ufffd \ufffd\ufffd\ufffd é"


class _Callbacks(ThreadingHTTPServer):
    """A stand-in callback endpoint: answers each POST with the next status of ``answers`` (then
    200 to well-formed JSON, 422 to anything else) and keeps what it was sent, and when (``at``).
    ``port``: where it listens (default: a free one)."""

    def __init__(self, answers: list[int], port: int | None = None) -> None:
        self.answers, self.got, self.at = list(answers), [], []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(h) -> None:
                body = h.rfile.read(int(h.headers["Content-Length"]))
                self.at.append(time.monotonic())
                self.got.append((h.path, h.headers["X-Karios-Job-Token"], body))
                if self.answers:
                    code = self.answers.pop(0)
                else:
                    try:
                        json.loads(body)
                        code = 200
                    except ValueError:
                        code = 422
                h.send_response(code)
                h.send_header("Content-Length", "0")
                h.end_headers()

            def log_message(h, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", port or free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/controlnode"


def _report_failed(tmp_path: Path, awk_path: str, answers: list[int]) -> tuple[int, list, str]:
    srv = _Callbacks(answers)
    try:
        fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx(callback_base=srv.url)))
        res = subprocess.run(
            ["sh", "-c", fns + 'report_failed "$S" "$M" "$L"'],
            env={"PATH": awk_path, "S": "base-system", "M": MESSAGES[2] + " é\tx", "L": "a\\b\nc"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        srv.shutdown()
        srv.server_close()
    return res.returncode, srv.got, res.stderr


def test_refused_failure_report_falls_back_to_safe_text(tmp_path: Path, awk_path: str) -> None:
    """A failure report the server refuses (422: it could not parse it) is not retried as is: the
    same failure follows in safe ASCII without the log, so it always arrives."""
    rc, got, err = _report_failed(tmp_path, awk_path, [422])
    assert rc == 0, err
    assert [(p, t) for p, t, _ in got] == [("/controlnode/job/job-1/step", "tok'en$1")] * 2
    first, second = (json.loads(b) for _, _, b in got)
    assert first["message"] == MESSAGES[2] + " é\tx" and first["log"] == ["a\\b", "c"]
    assert second == {
        "step": "base-system",
        "state": "failed",
        "percent": 0,
        "message": "/*stdin*? : Decoding error (36) : Data corruption detected ???x",
    }
    assert "refused (HTTP 422)" in err


def test_failure_report_is_retried_on_5xx_not_reduced(tmp_path: Path, awk_path: str) -> None:
    """503 (provisioner unavailable) is retried with the same body; no reduced report."""
    rc, got, err = _report_failed(tmp_path, awk_path, [503])
    assert rc == 0, err
    assert len(got) == 2 and got[0][2] == got[1][2] and b'"log"' in got[1][2]


#: The reporter's longest pause between two tries (``RETRY_MAX_DELAY`` of callbacks.sh.j2).
RETRY_MAX_DELAY = 4


def _report_across_an_outage(
    tmp_path: Path, argv: Callable[[str], list[str]], path_env: str, outage: float = 3.0
) -> tuple[subprocess.CompletedProcess[str], _Callbacks, float]:
    """``report_failed`` while nothing listens at the callback URL (the gateway's host down), then
    a real server there that answers 503 twice (its provisioner still gone) before taking it.
    ``argv(script)``: how the script runs (the host's sh, or inside the live environment).
    Returns the finished reporter, the server, and when the server came up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/controlnode"
    fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx(callback_base=url)))
    reporter = subprocess.Popen(
        argv(fns + 'report_failed "$S" "$M" "$L"'),
        env={"PATH": path_env, "S": "base-system", "M": MESSAGES[2], "L": "zstd: " + MESSAGES[2]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(outage)  # holding the outage for its length, not waiting for a condition
        assert reporter.poll() is None, reporter.communicate()
        srv = _Callbacks([503, 503], port=port)
        up = time.monotonic()
        try:
            out, err = reporter.communicate(timeout=90)
        finally:
            srv.shutdown()
            srv.server_close()
    finally:
        if reporter.poll() is None:
            reporter.kill()
            reporter.wait()
    return subprocess.CompletedProcess(reporter.args, reporter.returncode, out, err), srv, up


def check_report_across_an_outage(res: subprocess.CompletedProcess[str], srv: _Callbacks, up: float) -> None:
    """The full failure report arrived once the server was back, each try within the backoff's
    longest pause of the one before: the same body three times (503, 503, taken), never reduced."""
    assert res.returncode == 0, res.stderr
    assert "NOT delivered" not in res.stderr and "reduced" not in res.stderr, res.stderr
    assert len(srv.got) == 3, srv.got
    assert len({body for _, _, body in srv.got}) == 1
    report = json.loads(srv.got[0][2])
    assert report["state"] == "failed" and report["message"] == MESSAGES[2], report
    assert report["log"] == ["zstd: " + MESSAGES[2]], report
    gaps = [b - a for a, b in zip([up, *srv.at], srv.at, strict=False)]
    assert all(g < RETRY_MAX_DELAY + 2 for g in gaps), gaps


def test_failure_report_waits_for_a_server_that_is_down_then_up(tmp_path: Path, awk_path: str) -> None:
    """The gateway unreachable, then answering 503 (the provisioner SIGKILLed and restarting):
    the failure report is retried until it is taken, and arrives within seconds of the return."""
    check_report_across_an_outage(*_report_across_an_outage(tmp_path, lambda s: ["sh", "-c", s], awk_path))


def test_callbacks_retry_windows_and_backoff(tmp_path: Path) -> None:
    """A step is retried for two minutes, the failure report — the last word before the power-off
    — for ten, with pauses of at most RETRY_MAX_DELAY seconds."""
    fns = _callbacks(WipeMethod(_cfg(tmp_path)).render_wipe_script(_ctx()))
    assert "\nRETRY_FOR=120\n" in fns and "\nFAILED_RETRY_FOR=600\n" in fns
    assert f"\nRETRY_MAX_DELAY={RETRY_MAX_DELAY}\n" in fns
    report_failed = fns[fns.index("report_failed() {") :]
    assert '"$FAILED_RETRY_FOR"\n}' in report_failed[: report_failed.index("\n}\n") + 2]
