"""The image install's own functions (``install.sh.j2``, between ``# -- install functions`` and its
end) run inside the built live environment (its sh, curl, zstd, tar, blockdev — not the host's):

- the disk-size check before a byte is written: loop devices too small for the image fail at once
  with the sizes ("disk /dev/loop0 is 1.0 GiB; the image needs 2.5 GiB"), per pool type with the
  same numbers as the gateway's check (``karios.common.provisioning``);
- the root archive's stream (curl | zstd | tar, no pipefail in dash): a transfer cut short and a
  corrupt archive fail with curl's and zstd's own words; a whole one is extracted.

The rendered script's main part is never run here (it partitions disks and powers off); ``fail``
is replaced by one that prints its message. Needs root (chroot, loop devices) and the cached live
image (``live_root``); the pure rules run everywhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.common.errors import ValidationFailed
from karios.common.provisioning import (
    DISK_OVERHEAD,
    GIB,
    MIB,
    check_disk_space,
    gib,
    pool_capacity,
    root_needs,
)
from karios.provisioner.install import HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.image.manifest import root_manifest, tar_installed_bytes
from tests.fixtures.apps import REQUIRE
from tests.fixtures.installs import LIVE_PATH, in_live

MD_LEVELS = {"single": "", "stripe": "0", "mirror": "1", "raidz1": "5", "raidz2": "6"}
#: ``fail`` of the callbacks, replaced: the message on stdout, exit 1 (no report, no power-off).
FAIL = 'fail() { echo "FAILED: $1"; exit 1; }\n'
#: Refuse to run where /proc is the host's (``fail``'s power-off writes /proc/sysrq-trigger).
NO_PROC = '[ ! -e /proc/self ] || { echo "refusing: /proc is mounted"; exit 99; }\n'


def install_functions(installed_bytes: int | None, md_level: int | None = None) -> str:
    """The settings and the functions block of a rendered install script."""
    cfg = SimpleNamespace(cache_dir=Path("/nonexistent"), images_dir=Path("/nonexistent"), mirror_host="")
    ctx = HostContext(
        job_id="job-i",
        token="t",
        callback_base="http://127.0.0.1:9/controlnode",
        hostname="i",
        bmc_ip="10.0.0.9",
        os_username="u",
        password_hash="x",
        md_level=md_level,
        image_url="http://127.0.0.1:9/images/bookworm/root.tar.zst",
    )
    script = ImageMethod(cfg).render_install_script(ctx, installed_bytes)
    settings = script[script.index("IMAGE_URL=") : script.index("# -- install functions")]
    return (
        settings
        + script[script.index("# -- install functions") : script.index("# -- end of install functions")]
    )


# -- the rules, pure -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "sizes", "want"),
    [
        ("single", [10, 99], 10),
        ("mirror", [10, 4, 7], 4),
        ("stripe", [10, 4, 7], 21),
        ("raidz1", [10, 4, 7], 8),
        ("raidz2", [10, 4, 7, 5], 8),
        ("raidz2", [5, 5, 5, 5, 5, 5], 20),
    ],
)
def test_pool_capacity_per_pool_type(pool: str, sizes: list[int], want: int) -> None:
    """Room for the root: each disk less its boot partitions, then the pool's rule."""
    assert pool_capacity(pool, [s * GIB + DISK_OVERHEAD for s in sizes]) == want * GIB


def test_disk_space_check_names_the_needed_and_available_sizes() -> None:
    installed = 800 * MIB
    need = root_needs(installed)
    assert need == 800 * MIB + 200 * MIB + 256 * MIB  # +25 % and 256 MiB
    with pytest.raises(ValidationFailed) as exc:
        check_disk_space("single", ["/dev/sda"], {"sda": GIB}, installed)
    err = exc.value
    assert err.field == "selected_disks"
    assert str(err).startswith("selected_disks: disk sda is 1.0 GiB; the image needs 1.5 GiB"), str(err)
    assert err.details["needed_bytes"] == need and err.details["available_bytes"] == GIB - DISK_OVERHEAD
    with pytest.raises(ValidationFailed, match=r"mirror of sda, sdb gives 0\.7 GiB .*the smallest disk"):
        check_disk_space("mirror", ["sda", "sdb"], {"sda": GIB, "sdb": 4 * GIB}, installed)
    with pytest.raises(ValidationFailed, match=r"raidz2 of a, b, c, d gives 1\.5 GiB .*\(n-2\)"):
        check_disk_space("raidz2", ["a", "b", "c", "d"], dict.fromkeys("abcd", GIB), 1100 * MIB)
    # Enough room, or anything unknown: accepted.
    check_disk_space("stripe", ["sda", "sdb"], {"sda": GIB, "sdb": GIB}, installed)
    check_disk_space("single", ["sda"], {"sda": 2 * GIB}, installed)
    check_disk_space("single", ["sda"], {"sda": GIB}, None)
    check_disk_space("mirror", ["sda", "sdb"], {"sda": GIB, "sdb": None}, installed)
    check_disk_space("single", ["sdz"], {"sda": GIB}, installed)


def test_image_manifest_is_measured_from_the_archive(tmp_path: Path) -> None:
    """An archive built before manifests existed is measured once (4 KiB blocks per file, one per
    directory) and the manifest written beside it; a build writes it itself."""
    if not shutil.which("zstd"):
        pytest.skip("zstd is not installed")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, size in (("etc/a", 1), ("usr/b", 4096), ("usr/c", 5000)):
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(b"x" * size))
        d = tarfile.TarInfo("usr")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        link = tarfile.TarInfo("usr/l")
        link.type, link.linkname = tarfile.SYMTYPE, "b"
        tf.addfile(link)
    buf.seek(0)
    assert tar_installed_bytes(buf) == {"installed_bytes": 4 * 4096 + 4096, "entries": 5}
    suite = tmp_path / "bookworm"
    suite.mkdir()
    subprocess.run(["zstd", "-q", "-o", str(suite / "root.tar.zst")], input=buf.getvalue(), check=True)
    manifest = root_manifest(suite)
    assert manifest is not None and manifest["installed_bytes"] == 5 * 4096
    assert (suite / "root.json").exists()
    (suite / "root.tar.zst").unlink()  # the manifest is read, not measured again
    assert root_manifest(suite) == manifest
    assert (
        ImageMethod(SimpleNamespace(cache_dir=tmp_path, images_dir=tmp_path)).installed_bytes("trixie")
        is None
    )


# -- in the live environment -----------------------------------------------------------------


def _run_live(root: Path, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        in_live(root, NO_PROC + "set -eu\n" + script, mounts=("dev",)),  # as install.sh runs
        env={"PATH": LIVE_PATH},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("pool", list(MD_LEVELS))
def test_shell_pool_capacity_is_the_gateways(live_root: Path, pool: str) -> None:
    """``pool_capacity`` of install.sh (the live environment's sh) gives the numbers the gateway's
    check uses, for disks of different sizes up to 8 TiB."""
    sizes = [8 << 40, 300 * GIB + 5, 2 * GIB, 120 * MIB, 900 * GIB]
    level = None if pool == "single" else int(MD_LEVELS[pool])
    fns = install_functions(800 * MIB, level)
    for n in range(1, len(sizes) + 1):
        got = _run_live(live_root, fns + FAIL + "pool_capacity " + " ".join(map(str, sizes[:n])))
        assert got.returncode == 0, got.stdout + got.stderr
        assert int(got.stdout) == max(0, pool_capacity(pool, sizes[:n])), (pool, n)


@contextlib.contextmanager
def loop_devices(tmp_path: Path, *sizes: int) -> Iterator[list[str]]:
    if os.geteuid() != 0 or not shutil.which("losetup"):
        if REQUIRE:
            pytest.fail("loop devices need root and losetup")
        pytest.skip("loop devices need root and losetup")
    devs: list[str] = []
    try:
        for i, size in enumerate(sizes):
            img = tmp_path / f"disk{i}.img"
            with open(img, "wb") as f:
                f.truncate(size)
            dev = subprocess.run(
                ["losetup", "-f", "--show", str(img)], capture_output=True, text=True, check=True
            ).stdout.strip()
            devs.append(dev)
        yield devs
    finally:
        for dev in devs:
            subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_a_disk_too_small_fails_before_streaming(live_root: Path, tmp_path: Path) -> None:
    """The live environment's blockdev reads the disks' sizes; the check fails at once with them
    (single: the disk; an array: what the pool gives), and says nothing when the image fits."""
    installed = 1600 * MIB  # needs 2.25 GiB for the root, 2.5 GiB of a single disk
    with loop_devices(tmp_path, GIB, GIB, 3 * GIB) as (small, small2, big):
        res = _run_live(live_root, install_functions(installed) + FAIL + f"check_space {small}; echo fits")
        assert res.returncode == 1, res.stdout + res.stderr
        need = gib(root_needs(installed) + DISK_OVERHEAD)
        assert f"FAILED: disk {small} is 1.0 GiB; the image needs {need} (1.6 GiB installed" in res.stdout
        assert need == "2.5 GiB"

        res = _run_live(live_root, install_functions(installed, 1) + FAIL + f"check_space {small} {big}")
        assert res.returncode == 1
        assert (
            f"FAILED: disks {small} {big} give 0.7 GiB for the root as RAID1; the image needs 2.2 GiB"
            in res.stdout
        ), res.stdout

        for level, disks in ((None, [big]), (0, [small, small2, big])):
            res = _run_live(
                live_root,
                install_functions(installed, level) + FAIL + f"check_space {' '.join(disks)}; echo fits",
            )
            assert res.returncode == 0 and res.stdout.strip().endswith("fits"), res.stdout + res.stderr
        # The image's size unknown (no manifest): nothing is checked.
        res = _run_live(live_root, install_functions(None) + FAIL + f"check_space {small}; echo fits")
        assert res.returncode == 0 and res.stdout.strip() == "fits", res.stdout + res.stderr


# -- the stream -------------------------------------------------------------------------------


def root_archive(tmp_path: Path) -> bytes:
    """A small root archive (tar.zst) of incompressible files, made with the host's zstd."""
    if not shutil.which("zstd"):
        pytest.skip("zstd is not installed")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(4):
            data = os.urandom(1 << 20)
            info = tarfile.TarInfo(f"usr/lib/file{i}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return subprocess.run(["zstd", "-q", "-c"], input=buf.getvalue(), capture_output=True, check=True).stdout


class CuttingServer:
    """Serves ``body`` with its full Content-Length, but only ``send`` bytes of it, then closes."""

    def __init__(self, body: bytes, send: int) -> None:
        self.body, self.send = body, send
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/images/bookworm/root.tar.zst"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
                with contextlib.suppress(OSError):
                    conn.sendall(head.encode() + self.body[: self.send])

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("case", ["whole", "cut", "corrupt"])
def test_the_stream_fails_with_curls_and_zstds_words(live_root: Path, tmp_path: Path, case: str) -> None:
    body = root_archive(tmp_path)
    if case == "corrupt":
        mid = len(body) // 2
        body = body[:mid] + bytes(b ^ 0x5A for b in body[mid : mid + 4096]) + body[mid + 4096 :]
    srv = CuttingServer(body, len(body) // 2 if case == "cut" else len(body))
    target = Path("/tmp") / f"target-{case}-{os.getpid()}"
    try:
        res = _run_live(
            live_root,
            install_functions(None)
            + FAIL
            + f"mkdir -p /run {target}; stream_root {srv.url} {target}; echo streamed",
            timeout=60,
        )
    finally:
        srv.close()
        shutil.rmtree(live_root / str(target).lstrip("/"), ignore_errors=True)
    out = res.stdout
    if case == "whole":
        assert res.returncode == 0 and out.strip().endswith("streamed"), out + res.stderr
        return
    assert res.returncode == 1, out + res.stderr
    (failed,) = [line for line in out.splitlines() if line.startswith("FAILED: ")]
    assert failed.startswith(f"FAILED: writing the root filesystem from {srv.url}: "), failed
    if case == "cut":
        # tar may well be content with what it got (the stream cut between two files): the exit
        # statuses of curl and zstd are what tell (dash has no pipefail).
        assert "curl: (18) transfer closed with " in failed and " bytes remaining to read" in failed, failed
        assert failed.index("curl: (18)") < failed.index("zstd: "), failed  # the cause first
    else:
        assert "zstd: /*stdin*\\ : Decoding error (36) : " in failed, failed
        assert "tar: " in failed, failed


def test_the_medium_carries_the_images_size(tmp_path: Path) -> None:
    """``install.sh`` in the medium knows what the suite's image needs (its manifest); without a
    manifest (an archive that cannot be measured) it checks nothing."""
    import gzip

    from karios.provisioner.media.cpio import read_initrd
    from tests.fixtures.installs import initrd_with_overlay

    suite = tmp_path / "images" / "bookworm"
    suite.mkdir(parents=True)
    (suite / "vmlinuz").write_bytes(b"kernel")
    (suite / "live.img").write_bytes(gzip.compress(b""))
    (suite / "root.tar.zst").write_bytes(b"not zstd")
    cfg = SimpleNamespace(cache_dir=tmp_path, images_dir=tmp_path / "images", mirror_host="", mirror_dir="")
    ctx = HostContext(
        job_id="job-m",
        token="t",
        callback_base="http://10.0.2.100:8080/controlnode",
        hostname="m",
        bmc_ip="10.0.0.5",
        os_username="karios",
        password_hash="x",
        image_url="http://10.0.2.101:8081/images/bookworm/root.tar.zst",
    )

    def run_sh() -> str:
        medium = ImageMethod(cfg).medium(ctx)
        return read_initrd(initrd_with_overlay(medium, tmp_path / "initrd").read_bytes())[
            "karios/run.sh"
        ].decode()

    assert "ROOT_NEEDS=''" in run_sh()
    (suite / "root.json").write_text('{"installed_bytes": 838860800}')
    script = run_sh()
    assert f"ROOT_NEEDS={root_needs(800 * MIB)}" in script and "INSTALLED_BYTES=838860800" in script
    # the size is checked before a byte is written
    assert script.index("check_space $DISKS") < script.index("sfdisk -q --wipe always")
