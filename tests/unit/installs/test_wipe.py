"""The wipe's own functions (``wipe.sh.j2``) on real block devices: loop devices over sparse files
holding GPT, btrfs, ext4 and an LVM label, wiped with the live environment's awk (mawk), with
busybox awk, and inside the built live environment (``live``); once with a discard that zeroes (a
loop device punches holes) and once with a discard that is accepted but changes nothing
(``blkdiscard`` replaced by a no-op on ``PATH``: what an SSD or a RAID controller may do).
Afterwards nothing may be found: no btrfs superblock copy (``btrfs inspect-internal dump-super -s
1``), no ext4 backup superblock, no signature for ``wipefs``/``blkid``.

Needs root, ``losetup``/``sfdisk``/``partx``, ``mkfs.btrfs`` (btrfs-progs) and ``mkfs.ext4``
(``tests/lab/setup.sh`` installs them); skips without (fails under ``CI=true``). The rendered
script's main part is never run here: it powers the machine off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.apps import REQUIRE
from tests.fixtures.installs import LIVE_PATH, in_live, wipe_functions

MIB = 1 << 20
AWKS = ("mawk", "busybox")
TOOLS = ("losetup", "sfdisk", "partx", "blkid", "wipefs", "mkfs.btrfs", "btrfs", "mkfs.ext4", "dumpe2fs")


def _need(what: str) -> None:
    if REQUIRE:
        pytest.fail(what)
    pytest.skip(what)


def awk_bin(tmp_path: Path, name: str) -> Path:
    """A directory whose ``awk`` is the implementation named (busybox dispatches on the name)."""
    exe = shutil.which(name)
    if exe is None:
        _need(f"{name} is not installed (tests/lab/setup.sh installs it)")
    bindir = tmp_path / f"bin-{name}"
    bindir.mkdir(exist_ok=True)
    (bindir / "awk").symlink_to(exe)
    return bindir


# -- where signatures live: the same list under every awk, checked against an independent count --


def expected_regions(size: int, base: int = 0) -> set[tuple[int, int]]:
    out: dict[int, int] = {0: MIB, size - MIB: MIB, 64 * MIB: 65536, 256 * 1024 * MIB: 65536}
    for bs in (1024, 2048, 4096):
        group = 8 * bs * bs
        groups = {1} | {p**k for p in (3, 5, 7) for k in range(1, 40) if p**k * group < size}
        out.update({g * group: 4096 for g in groups})
    return {(base + o, min(n, size - o)) for o, n in out.items() if o < size}


@pytest.mark.parametrize("awk", AWKS)
@pytest.mark.parametrize(
    ("size", "base"), [(400 * MIB, 0), (300 * 1024 * MIB, 1 * MIB), (8 * 1024**4 - 4096, 2048 * 512)]
)
def test_signature_regions_under_the_live_awks(tmp_path: Path, awk: str, size: int, base: int) -> None:
    bindir = awk_bin(tmp_path, awk)
    out = subprocess.run(
        ["sh", "-c", wipe_functions() + f"sig_regions {size} {base}"],
        env={"PATH": f"{bindir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = [tuple(int(x) for x in line.split()) for line in out.splitlines()]
    assert len(got) == len(set(got))
    assert set(got) == expected_regions(size, base)
    offsets = {o - base for o, _ in got}
    # btrfs mirrors, the ZFS labels' and GPT backup's last MiB, ext4 (4 KiB blocks) group 3
    assert {64 * MIB, size - MIB, 3 * 128 * MIB} <= offsets
    assert (256 * 1024 * MIB in offsets) == (size > 256 * 1024 * MIB)


# -- the wipe on loop devices ------------------------------------------------------------------


def _run(*argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120, **kw)  # type: ignore[call-overload]


@contextlib.contextmanager
def loop(image: Path, offset: int = 0, size: int = 0, partscan: bool = False) -> Iterator[str]:
    args = ["losetup", "-f", "--show"]
    if partscan:
        args.append("-P")
    if offset:
        args += ["-o", str(offset)]
    if size:
        args += ["--sizelimit", str(size)]
    dev = _run(*args, str(image)).stdout.strip()
    try:
        yield dev
    finally:
        _run("losetup", "-d", dev, check=False)


@pytest.fixture
def root_tools() -> None:
    if os.geteuid() != 0:
        _need("wiping loop devices needs root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        _need(f"missing {', '.join(missing)} (apt-get install util-linux fdisk btrfs-progs e2fsprogs)")
    if not Path("/dev/loop-control").exists():
        _need("no loop devices here (/dev/loop-control)")


# The disk: GPT; p1 btrfs (its first mirror 64 MiB in), p2 ext4 with 1 KiB blocks (backup
# superblocks every 8 MiB group of 1, 3, 5, 7, 9 …), p3 ext4 with 4 KiB blocks (backups at 128,
# 384 … MiB), p4 an LVM physical volume when pvcreate is here.
PARTS = [(1 * MIB, 300 * MIB), (301 * MIB, 200 * MIB), (501 * MIB, 700 * MIB), (1201 * MIB, 40 * MIB)]
DISK = 1300 * MIB


def _ext4_backups(block: int, size: int) -> list[int]:
    group = 8 * block * block
    first = 1 if block == 1024 else 0
    gs = sorted({1} | {p**k for p in (3, 5, 7) for k in range(1, 20) if p**k * group < size})
    return [g * 8 * block + first for g in gs if g * group < size]  # in blocks


def _findings(image: Path) -> list[str]:
    """Everything still recognisable on the disk image and at each former partition's place."""
    found = []
    probe = _run("blkid", "-p", "-o", "export", str(image), check=False)
    if probe.returncode != 2:
        found.append(f"disk: blkid {probe.stdout.strip()!r}")
    for i, (start, size) in enumerate(PARTS, 1):
        with loop(image, start, size) as dev:
            for n in (0, 1):
                res = _run("btrfs", "inspect-internal", "dump-super", "-s", str(n), dev, check=False)
                if "_BHRfS_M [match]" in res.stdout:  # a copy past the device's end prints nothing
                    found.append(f"p{i}: btrfs superblock copy {n}")
            for block in (1024, 4096):
                for sb in _ext4_backups(block, size):
                    res = _run(
                        "dumpe2fs",
                        "-h",
                        "-o",
                        f"superblock={sb}",
                        "-o",
                        f"blocksize={block}",
                        dev,
                        check=False,
                    )
                    if res.returncode == 0:
                        found.append(f"p{i}: ext4 superblock at block {sb} ({block}-byte blocks)")
            listed = _run("wipefs", "--noheadings", dev, check=False).stdout.strip()
            if listed:
                found.append(f"p{i}: wipefs {listed!r}")
            probe = _run("blkid", "-p", "-o", "export", dev, check=False)
            if probe.returncode != 2:
                found.append(f"p{i}: blkid {probe.stdout.strip()!r}")
    return found


def _make_disk(image: Path, dev: str) -> bool:
    """Partition and fill the disk; True when an LVM label was written too."""
    table = "label: gpt\n" + "".join(f"start={s // 512}, size={n // 512}, type=L\n" for s, n in PARTS)
    _run("sfdisk", "-q", dev, input=table)
    _run("partx", "-u", dev, check=False)
    _run("partx", "-a", dev, check=False)
    parts = [f"{dev}p{i}" for i in range(1, len(PARTS) + 1)]
    assert all(Path(p).exists() for p in parts), _run("lsblk", dev, check=False).stdout
    _run("mkfs.btrfs", "-q", "-f", parts[0])
    _run("mkfs.ext4", "-q", "-F", "-b", "1024", parts[1])
    _run("mkfs.ext4", "-q", "-F", "-b", "4096", parts[2])
    lvm = shutil.which("pvcreate") is not None
    if lvm:
        cfg = "devices{obtain_device_list_from_udev=0 use_devicesfile=0}"
        lvm = _run("pvcreate", "-ff", "-y", "--config", cfg, parts[3], check=False).returncode == 0
    return lvm


@pytest.mark.parametrize("awk", [*AWKS, "live"])
@pytest.mark.parametrize("discard", ["zeroing", "not-zeroing"])
def test_wipe_leaves_nothing_readable(
    root_tools: None, request: pytest.FixtureRequest, tmp_path: Path, awk: str, discard: str
) -> None:
    """``awk``: the host's tools with that awk, or ``live``: inside the built live environment
    (its own sh, mawk, coreutils and util-linux; /dev, /proc and /sys bound in as /init has them)."""
    if awk == "live":
        root: Path = request.getfixturevalue("live_root")
        shim = Path(tempfile.mkdtemp(prefix="wipe-", dir=root / "tmp"))
        request.addfinalizer(lambda: shutil.rmtree(shim, ignore_errors=True))
        bindir, inside = shim, "/" + str(shim.relative_to(root))
    else:
        bindir = awk_bin(tmp_path, awk)
        inside = str(bindir)
    if discard == "not-zeroing":  # accepted, nothing changes: the data stays readable
        (bindir / "blkdiscard").write_text("#!/bin/sh\nexit 0\n")
        (bindir / "blkdiscard").chmod(0o755)
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(DISK)
    with loop(image, partscan=True) as dev:
        lvm = _make_disk(image, dev)
        before = _findings(image)
        # The test can fail: everything is there before the wipe.
        assert (
            "p1: btrfs superblock copy 1" in before
            and "p3: ext4 superblock at block 98304 (4096-byte blocks)" in before
        )
        assert "p2: ext4 superblock at block 8193 (1024-byte blocks)" in before
        assert any(f.startswith("disk: blkid") and "gpt" in f for f in before), before
        assert lvm is any("LVM2_member" in f for f in before), before
        script = wipe_functions() + 'DISKS="$1"; wipe_disk "$1"'
        if awk == "live":
            argv = in_live(root, script, dev, mounts=("dev", "proc", "sys"))
            env = {"PATH": f"{inside}:{LIVE_PATH}", "WIPE_TMP": inside}
        else:
            argv = ["sh", "-c", script, "sh", dev]
            env = {"PATH": f"{inside}:{os.environ['PATH']}", "WIPE_TMP": str(tmp_path)}
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    msg = res.stdout.strip().splitlines()[-1]
    assert msg.startswith("wiped 1.3 GiB: "), msg
    if discard == "zeroing":
        assert "discard zeroed the " in msg, msg
    else:
        assert "discard did NOT zero (" in msg and "discard zeroed" not in msg, msg
    assert "read back as zeros, blkid finds nothing" in msg, msg
    assert _findings(image) == []
