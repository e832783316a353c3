"""The wipe's secure-erase ladder (``wipe.sh.j2``, policy ``secure``): which rung for which device.

The decision (``erase_rungs``) is driven by fake ``nvme``, ``hdparm``, ``sg_opcodes`` and
``sg_sanitize`` on ``PATH`` answering as the real tools do: NVMe Identify Controller and the
sanitize log in the binary layout of the NVMe base specification (``nvme id-ctrl -b``,
``nvme sanitize-log -b``), ``hdparm -I`` text in hdparm's format (its ``Security:`` section), and
REPORT SUPPORTED OPERATION CODES raw (``sg_opcodes --raw``). These are assembled from the tools'
output formats and the specifications, not captured from physical drives: the ATA and SCSI rungs
are verified here only; qemu's NVMe (Format NVM) is exercised for real in
``tests/integration/installs/test_wipe_direct.py``.

The rungs then run on a loop device (root): a fake tool that erases (zeros or random data), one
that says it did and did not (the pre-erase markers catch it), one that fails — each named in the
result, never silently, the next rung tried, down to the verified overwrite of both ends. Every
test runs with the live environment's awk (mawk), busybox awk, and inside the built live
environment (its own sh, mawk, od, dd, cmp; skipped without root and a built image).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.apps import REQUIRE
from tests.fixtures.installs import LIVE_PATH, in_live, wipe_functions

MIB = 1 << 20
ENVS = ("mawk", "busybox", "live")

# -- the fake tools ----------------------------------------------------------------------------

# effect NAME DEV: what the fake does to the device when asked to erase it ($FAKE/NAME.effect):
# zero | random (the whole device) | nothing (says it did) | fail:MESSAGE (exit 1)
_EFFECT = r"""
echo "${0##*/} $*" >> "$FAKE/calls.log"
for last; do :; done
effect() {
  e=$(cat "$FAKE/$1.effect" 2>/dev/null || echo nothing)
  case "$e" in
    zero) dd if=/dev/zero of="$2" bs=1M oflag=direct status=none 2>/dev/null; true ;;
    random) dd if=/dev/urandom of="$2" bs=1M oflag=direct status=none 2>/dev/null; true ;;
    nothing) ;;
    fail:*) echo "${e#fail:}" >&2; exit 1 ;;
  esac
}
"""

FAKES = {
    "nvme": r"""
case "$1" in
  id-ctrl)
    [ -e "$FAKE/id-ctrl.bin" ] || { echo "identify controller: Inappropriate ioctl for device" >&2; exit 1; }
    cat "$FAKE/id-ctrl.bin" ;;
  id-ns) cat "$FAKE/id-ns.bin" ;;
  sanitize)
    case "$*" in *--sanact=1*) exit 0 ;; esac
    effect sanitize "$2"
    echo 0 > "$FAKE/sanlog.n" ;;
  sanitize-log)
    n=$(($(cat "$FAKE/sanlog.n") + 1)); echo "$n" > "$FAKE/sanlog.n"
    if [ -e "$FAKE/sanlog.$n.bin" ]; then cat "$FAKE/sanlog.$n.bin"; else cat "$FAKE/sanlog.last.bin"; fi ;;
  format) effect format "$2" ;;
  *) echo "nvme: unexpected $*" >&2; exit 1 ;;
esac
""",
    "hdparm": r"""
case "$*" in
  "-I "*) cat "$FAKE/hdparm-I.txt" ;;
  *--security-set-pass*) ;;
  *--security-erase-enhanced*) effect ata-enhanced "$last" ;;
  *--security-erase*) effect ata "$last" ;;
  *--security-disable*) ;;
  *) echo "hdparm: unexpected $*" >&2; exit 1 ;;
esac
""",
    "sg_opcodes": r"""
if [ -e "$FAKE/rsoc.fail" ]; then cat "$FAKE/rsoc.fail" >&2; exit 99; fi
for a; do case "$a" in --opcode=0x48,*) sa=${a#--opcode=0x48,} ;; esac; done
cat "$FAKE/rsoc-$sa.bin"
""",
    "sg_sanitize": r"""
case "$*" in
  *--crypto*) effect scsi-crypto "$last" ;;
  *--block*) effect scsi-block "$last" ;;
  *--overwrite*) effect scsi-overwrite "$last" ;;
esac
""",
}


def id_ctrl(*, oacs: int = 0, sanicap: int = 0, fna: int = 0) -> bytes:
    """Identify Controller (4096 bytes): OACS at 256, SANICAP at 328, FNA at 524 (little endian)."""
    data = bytearray(4096)
    data[256:258] = struct.pack("<H", oacs)
    data[328:332] = struct.pack("<I", sanicap)
    data[524] = fna
    return bytes(data)


def sanitize_log(sstat: int, sprog: int = 0) -> bytes:
    """Sanitize Status log page (512 bytes): SPROG at 0, SSTAT at 2."""
    return struct.pack("<HH", sprog, sstat) + bytes(508)


def rsoc(support: int) -> bytes:
    """REPORT SUPPORTED OPERATION CODES, one command: byte 1 bits 0-2 SUPPORT, CDB size, usage."""
    return bytes([0, support, 0, 10]) + bytes([0x48, 0x1F]) + bytes(8)


def _hdparm(security: str) -> str:
    """``hdparm -I`` of a SATA SSD with the given ``Security:`` section (hdparm's layout: each
    state is "<tab>[not]<tab><name>")."""
    return (
        "\n/dev/sda:\n\nATA device, with non-removable media\n"
        "\tModel Number:       Samsung SSD 860 EVO 500GB\n"
        "\tSerial Number:      S3Z1NB0K123456A\n"
        "\tFirmware Revision:  RVT03B6Q\n"
        "Standards:\n\tUsed: unknown (minor revision code 0x005e) \n\tSupported: 11 8 7 6 5 \n"
        "Commands/features:\n\tEnabled\tSupported:\n\t   *\tSMART feature set\n"
        "\t    \tSecurity Mode feature set\n\t   *\tWrite cache\n"
        "Security: \n\tMaster password revision code = 65534\n"
        + security
        + "Logical Unit WWN Device Identifier: 5002538e40a0b1c2\n\tNAA\t\t: 5\n"
        "Checksum: correct\n"
    )


def _sec(
    *,
    enabled: bool = False,
    locked: bool = False,
    frozen: bool = False,
    expired: bool = False,
    enhanced: bool = True,
) -> str:
    def state(on: bool, name: str) -> str:
        return f"\t{'' if on else 'not'}\t{name}\n"

    return (
        state(True, "supported")
        + state(enabled, "enabled")
        + state(locked, "locked")
        + state(frozen, "frozen")
        + state(expired, "expired: security count")
        + state(enhanced, "supported: enhanced erase")
        + "\t2min for SECURITY ERASE UNIT. 8min for ENHANCED SECURITY ERASE UNIT.\n"
    )


# hdparm -I where the identify ioctl is refused, and what it prints for a virtio disk (the header only)
HDPARM_REFUSED = "\n/dev/sdb:\n HDIO_DRIVE_CMD(identify) failed: Inappropriate ioctl for device\n"
HDPARM_VIRTIO = "\n/dev/vda:\n"
RSOC_FAILED = (
    "Report supported operation codes: pass-through os error: Inappropriate ioctl for device\n"
    "Report supported operation codes: Inappropriate ioctl for device\n"
)


def _need(what: str) -> None:
    if REQUIRE:
        pytest.fail(what)
    pytest.skip(what)


@dataclass
class Shell:
    """Where the wipe's functions run: ``fake`` is the directory of the fake tools and their
    answers (first on PATH; ``inside`` is its path as the script sees it)."""

    fake: Path
    inside: str
    root: Path | None = None  # the unpacked live environment, or None: the host's tools

    def answer(self, name: str, data: bytes | str) -> None:
        (self.fake / name).write_bytes(data.encode() if isinstance(data, str) else data)

    def calls(self) -> list[str]:
        log = self.fake / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        body = wipe_functions() + script
        base = {"FAKE": self.inside, "WIPE_TMP": f"{self.inside}/tmp", "ERASE_POLL": "1", "ERASE_BEAT": "2"}
        if self.root is None:
            argv = ["sh", "-c", body, "sh", *args]
            path = f"{self.inside}:{os.environ['PATH']}"
        else:
            argv = in_live(self.root, body, *args, mounts=("dev", "proc", "sys"))
            path = f"{self.inside}:{LIVE_PATH}"
        return subprocess.run(
            argv, env={"PATH": path, **base, **env}, capture_output=True, text=True, timeout=300
        )


@pytest.fixture(params=ENVS)
def shell(request: pytest.FixtureRequest, tmp_path: Path) -> Shell:
    env = request.param
    if env == "live":
        root: Path = request.getfixturevalue("live_root")
        fake = Path(tempfile.mkdtemp(prefix="ladder-", dir=root / "tmp"))
        request.addfinalizer(lambda: shutil.rmtree(fake, ignore_errors=True))
        sh = Shell(fake, "/" + str(fake.relative_to(root)), root)
    else:
        exe = shutil.which(env)
        if exe is None:
            _need(f"{env} is not installed (tests/lab/setup.sh installs it)")
        fake = tmp_path / "fake"
        fake.mkdir()
        (fake / "awk").symlink_to(exe)
        sh = Shell(fake, str(fake))
    (sh.fake / "tmp").mkdir()
    for name, body in FAKES.items():
        (sh.fake / name).write_text("#!/bin/sh\n" + _EFFECT + body)
        (sh.fake / name).chmod(0o755)
    return sh


def rungs(sh: Shell, disk: str, prelude: str = "") -> list[str]:
    res = sh.run(prelude + 'DISKS="$1"; erase_rungs "$1"', disk)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.splitlines()


# -- the decision: which rung for which capability ----------------------------------------------

LAST = "+ overwrite-ends zeros over the first and last GiB"


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        pytest.param(
            {"oacs": 0x17, "sanicap": 0x3, "fna": 0x4},
            [
                "+ nvme-sanitize-crypto sanitize, crypto erase (SANICAP 0x3)",
                "+ nvme-sanitize-block sanitize, block erase (SANICAP 0x3)",
                "+ nvme-format-crypto format, secure erase SES=2 crypto erase (FNA 0x4)",
                "+ nvme-format-user format, secure erase SES=1 user data erase (OACS 0x17)",
            ],
            id="everything",
        ),
        pytest.param(
            {"oacs": 0x6, "sanicap": 0x2},
            [
                "- nvme-sanitize-crypto: not supported (SANICAP 0x2)",
                "+ nvme-sanitize-block sanitize, block erase (SANICAP 0x2)",
                "- nvme-format-crypto: not supported (FNA 0x0)",
                "+ nvme-format-user format, secure erase SES=1 user data erase (OACS 0x6)",
            ],
            id="block-erase-only",
        ),
        pytest.param(
            {"oacs": 0x10A},  # qemu's: namespace management, format, doorbell buffer config
            [
                "- nvme-sanitize-crypto: not supported (SANICAP 0x0)",
                "- nvme-sanitize-block: not supported (SANICAP 0x0)",
                "- nvme-format-crypto: not supported (FNA 0x0)",
                "+ nvme-format-user format, secure erase SES=1 user data erase (OACS 0x10a)",
            ],
            id="format-only",
        ),
        pytest.param(
            {"oacs": 0x1, "sanicap": 0x80000000},  # no Format NVM; only the NODMMAS bits
            [
                "- nvme-sanitize-crypto: not supported (SANICAP 0x80000000)",
                "- nvme-sanitize-block: not supported (SANICAP 0x80000000)",
                "- nvme-format: Format NVM not supported (OACS 0x1)",
            ],
            id="no-format",
        ),
    ],
)
def test_nvme_rungs_follow_the_identify_data(shell: Shell, caps: dict[str, int], expected: list[str]) -> None:
    shell.answer("id-ctrl.bin", id_ctrl(**caps))
    assert rungs(shell, "/dev/nvme0n1") == [*expected, LAST]
    assert shell.calls() == ["nvme id-ctrl /dev/nvme0 -b"]


def test_nvme_rungs_spare_namespaces_not_being_wiped(shell: Shell) -> None:
    """Sanitize erases the whole subsystem: not with nvme0n2 kept. A format whose FNA says it
    applies to every namespace neither; one that applies to the namespace alone still runs."""
    others = "other_namespaces() { echo nvme0n2; }\n"
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, sanicap=0x3, fna=0x5))
    assert rungs(shell, "/dev/nvme0n1", others) == [
        "- nvme-sanitize: would erase nvme0n2 too (not being wiped)",
        "- nvme-format: applies to every namespace (FNA 0x5), nvme0n2 not being wiped",
        LAST,
    ]
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, sanicap=0x3, fna=0x4))
    assert rungs(shell, "/dev/nvme0n1", others)[1:3] == [
        "+ nvme-format-crypto format, secure erase SES=2 crypto erase (FNA 0x4)",
        "+ nvme-format-user format, secure erase SES=1 user data erase (OACS 0x2)",
    ]


def test_nvme_identify_failing_falls_to_the_overwrite(shell: Shell) -> None:
    assert rungs(shell, "/dev/nvme1n1") == [
        "- nvme: identify controller /dev/nvme1 failed: identify controller: Inappropriate ioctl for device",
        LAST,
    ]


SCSI_NONE = [
    "- scsi-sanitize-crypto: not supported (SANITIZE service action 3: SUPPORT 1)",
    "- scsi-sanitize-block: not supported (SANITIZE service action 2: SUPPORT 1)",
    "- scsi-sanitize-overwrite: not supported (SANITIZE service action 1: SUPPORT 1)",
]


@pytest.mark.parametrize(
    ("security", "expected"),
    [
        pytest.param(
            _sec(),
            [
                "+ ata-security-erase-enhanced SECURITY ERASE UNIT, enhanced (drive estimates 8min)",
                "+ ata-security-erase SECURITY ERASE UNIT (drive estimates 2min)",
            ],
            id="not-frozen",
        ),
        pytest.param(
            _sec(enhanced=False),
            [
                "- ata-security-erase-enhanced: not supported (hdparm -I: not supported: enhanced erase)",
                "+ ata-security-erase SECURITY ERASE UNIT (drive estimates 2min)",
            ],
            id="no-enhanced",
        ),
        pytest.param(
            _sec(frozen=True),
            [
                "- ata-security-erase: frozen (the firmware froze security at boot; a suspend/resume "
                "or re-plug unfreezes it)"
            ],
            id="frozen",
        ),
        pytest.param(
            _sec(enabled=True, locked=True),
            ["- ata-security-erase: a password is already set (security enabled, locked)"],
            id="password-set",
        ),
        pytest.param(
            _sec(expired=True),
            ["- ata-security-erase: the password attempt counter expired (needs a power cycle)"],
            id="expired",
        ),
    ],
)
def test_ata_rungs_follow_hdparm(shell: Shell, security: str, expected: list[str]) -> None:
    shell.answer("hdparm-I.txt", _hdparm(security))
    for sa in (1, 2, 3):
        shell.answer(f"rsoc-{sa}.bin", rsoc(1))
    assert rungs(shell, "/dev/sda") == [*expected, *SCSI_NONE, LAST]
    assert shell.calls()[0] == "hdparm -I /dev/sda"


def test_scsi_rungs_follow_report_supported_operation_codes(shell: Shell) -> None:
    shell.answer("hdparm-I.txt", HDPARM_REFUSED)
    for sa, support in ((3, 3), (2, 1), (1, 5)):  # 3: per the standard, 5: vendor specific
        shell.answer(f"rsoc-{sa}.bin", rsoc(support))
    assert rungs(shell, "/dev/sdb") == [
        "- ata-security-erase: no ATA security feature set (hdparm -I: HDIO_DRIVE_CMD(identify) failed: "
        "Inappropriate ioctl for device)",
        "+ scsi-sanitize-crypto SANITIZE, crypto (service action 3)",
        "- scsi-sanitize-block: not supported (SANITIZE service action 2: SUPPORT 1)",
        "+ scsi-sanitize-overwrite SANITIZE, overwrite with zeros (service action 1)",
        LAST,
    ]
    assert "sg_opcodes -n --raw --opcode=0x48,3 /dev/sdb" in shell.calls()


def test_a_virtio_disk_has_only_the_overwrite(shell: Shell) -> None:
    shell.answer("hdparm-I.txt", HDPARM_VIRTIO)
    shell.answer("rsoc.fail", RSOC_FAILED)
    assert rungs(shell, "/dev/vda") == [
        "- ata-security-erase: no ATA security feature set (hdparm -I: no Security section)",
        "- scsi-sanitize: REPORT SUPPORTED OPERATION CODES failed: Report supported operation codes: "
        "Inappropriate ioctl for device",
        LAST,
    ]


def test_missing_tools_are_named(shell: Shell) -> None:
    """An image without nvme-cli, hdparm or sg3-utils: said so, the overwrite still there."""
    (shell.fake / "empty").mkdir()
    bare = 'PATH="$FAKE/empty"\n'  # the functions need no tool to find out
    assert rungs(shell, "/dev/nvme0n1", bare) == ["- nvme: nvme-cli missing in the live environment", LAST]
    assert rungs(shell, "/dev/sda", bare) == [
        "- ata-security-erase: hdparm missing in the live environment",
        "- scsi-sanitize: sg3-utils missing in the live environment",
        LAST,
    ]


def test_beating_waits_for_its_command_only(shell: Shell) -> None:
    """The live environment's script has other background jobs (the log's ``tail -f``): a long
    erase's heartbeat returns the command's status when it ends, reporting progress meanwhile."""
    script = "\n".join(
        [
            "sleep 120 > /dev/null 2>&1 & tail=$!",
            'beating erase sh -c "sleep 3; exit 7"',
            'echo "rc=$?"; kill $tail',
        ]
    )
    t0 = time.monotonic()
    res = shell.run(script, ERASE_BEAT="1")
    assert time.monotonic() - t0 < 60  # not the 120 s of the other job
    assert res.stdout.splitlines()[-1] == "rc=7", res.stdout + res.stderr
    assert "wipe: erase: running for 0 min" in res.stdout


# -- the ladder on a loop device: run, verify, fall through ------------------------------------


@contextlib.contextmanager
def loop_device(image: Path) -> Iterator[str]:
    dev = subprocess.run(
        ["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A 64 MiB loop device full of data (0xAA): nothing on it reads back as zeros by chance."""
    if os.geteuid() != 0:
        _need("the ladder on loop devices needs root")
    if not Path("/dev/loop-control").exists() or shutil.which("losetup") is None:
        _need("no loop devices here (/dev/loop-control, losetup)")
    image = tmp_path / "disk.img"
    image.write_bytes(b"\xaa" * (64 * MIB))
    with loop_device(image) as dev:
        yield image, dev


NVME_ON_LOOP = "disk_bus() { echo nvme; }\nother_namespaces() { :; }\n"
ERASE = 'DISKS="$1"; secure_erase "$1"; rc=$?; echo "ERASE=$ERASE"; exit $rc'


def _erase(sh: Shell, dev: str, prelude: str = "") -> tuple[int, str, str]:
    res = sh.run(prelude + ERASE, dev)
    print(res.stdout, res.stderr)
    lines = res.stdout.splitlines()
    assert lines and lines[-1].startswith("ERASE="), res.stdout + res.stderr
    return res.returncode, lines[-1].removeprefix("ERASE="), res.stdout


def _image_is(image: Path, byte: int | None) -> bool:
    """Every byte is ``byte`` (None: neither all zeros nor the original 0xAA anywhere sampled)."""
    data = image.read_bytes()
    if byte is not None:
        return data == bytes([byte]) * len(data)
    return data.count(b"\xaa" * 4096) == 0


def test_lying_and_failing_rungs_fall_through_to_the_verified_overwrite(
    shell: Shell, disk: tuple[Path, str]
) -> None:
    """The sanitize starts and the controller reports it failed (then "exit failure mode" is
    sent); the format says it erased and did not (the markers are still there): both named,
    the overwrite of both ends (the whole 64 MiB disk) runs and reads back as zeros."""
    image, dev = disk
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, sanicap=0x1))
    shell.answer("sanlog.1.bin", sanitize_log(0x2, 0x4000))
    shell.answer("sanlog.last.bin", sanitize_log(0x3))
    shell.answer("format.effect", "nothing")
    rc, erase, out = _erase(shell, dev, NVME_ON_LOOP)
    assert rc == 0, out
    assert erase == (
        "method: overwrite-ends (zeros over the first and last GiB), verified: all 64 MiB read back as "
        "zeros (not used: nvme-sanitize-block: not supported (SANICAP 0x1) / nvme-format-crypto: not "
        "supported (FNA 0x0) / nvme-sanitize-crypto: FAILED (the controller reports the sanitize failed "
        "(SSTAT 0x3)) / nvme-format-user: ran, verify FAILED (marker still at 9, unreadable at 0 of 9 "
        "offsets))"
    )
    assert [c.split()[1] for c in shell.calls()] == [
        "id-ctrl",
        "sanitize",
        "sanitize-log",
        "sanitize-log",
        "sanitize",
        "format",
    ]
    assert f"nvme sanitize {dev} --sanact=4 --ause" in shell.calls()
    assert f"nvme sanitize {dev} --sanact=1" in shell.calls()  # exit failure mode
    assert f"nvme format {dev} --ses=1 --force --timeout=10800000" in shell.calls()
    assert _image_is(image, 0)


def test_nvme_sanitize_polled_to_completion_is_verified(shell: Shell, disk: tuple[Path, str]) -> None:
    """Block erase: in progress twice (progress reported), then completed; the markers are gone."""
    image, dev = disk
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, sanicap=0x2))
    shell.answer("sanitize.effect", "zero")
    shell.answer("sanlog.1.bin", sanitize_log(0x2, 0x4000))
    shell.answer("sanlog.2.bin", sanitize_log(0x2, 0x8000))
    shell.answer("sanlog.last.bin", sanitize_log(0x101, 0xFFFF))
    rc, erase, out = _erase(shell, dev, NVME_ON_LOOP)
    assert rc == 0, out
    assert erase == (
        "method: nvme-sanitize-block (sanitize, block erase (SANICAP 0x2)), verified: the pre-erase marker "
        "is gone at all 9 sampled offsets (9 read back as zeros) (not used: nvme-sanitize-crypto: not "
        "supported (SANICAP 0x2) / nvme-format-crypto: not supported (FNA 0x0))"
    )
    assert "nvme sanitize: 50% after 0 min" in out
    assert not any(c.startswith("nvme format") for c in shell.calls())
    assert _image_is(image, 0)


def test_crypto_erase_is_verified_by_the_markers_not_by_zeros(shell: Shell, disk: tuple[Path, str]) -> None:
    """A crypto erase leaves what reads as random data: verified because the markers are gone."""
    image, dev = disk
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, fna=0x4))
    shell.answer("format.effect", "random")
    rc, erase, out = _erase(shell, dev, NVME_ON_LOOP)
    assert rc == 0, out
    assert erase.startswith(
        "method: nvme-format-crypto (format, secure erase SES=2 crypto erase (FNA 0x4)), verified: the "
        "pre-erase marker is gone at all 9 sampled offsets (0 read back as zeros)"
    ), erase
    assert f"nvme format {dev} --ses=2 --force --timeout=10800000" in shell.calls()
    assert _image_is(image, None)


def test_format_applying_to_every_namespace_keeps_the_lba_format(
    shell: Shell, disk: tuple[Path, str]
) -> None:
    image, dev = disk
    shell.answer("id-ctrl.bin", id_ctrl(oacs=0x2, fna=0x1))
    ns = bytearray(4096)
    ns[26] = 0x21  # FLBAS: format 1, upper bits 01 → LBA format 17
    shell.answer("id-ns.bin", bytes(ns))
    shell.answer("format.effect", "zero")
    rc, erase, out = _erase(shell, dev, NVME_ON_LOOP)
    assert rc == 0 and erase.startswith("method: nvme-format-user "), out
    assert f"nvme format {dev} --namespace-id=0xffffffff --lbaf=17 --ses=1 --force --timeout=10800000" in (
        shell.calls()
    )
    assert _image_is(image, 0)


def test_ata_enhanced_erase_failing_removes_the_password_then_the_normal_erase(
    shell: Shell, disk: tuple[Path, str]
) -> None:
    image, dev = disk
    shell.answer("hdparm-I.txt", _hdparm(_sec()))
    shell.answer("rsoc.fail", RSOC_FAILED)
    shell.answer("ata-enhanced.effect", "fail:SECURITY_ERASE: Input/output error")
    shell.answer("ata.effect", "zero")
    rc, erase, out = _erase(shell, dev)
    assert rc == 0, out
    assert erase.startswith(
        "method: ata-security-erase (SECURITY ERASE UNIT (drive estimates 2min)), verified: the pre-erase "
        "marker is gone at all 9 sampled offsets (9 read back as zeros) (not used: scsi-sanitize: REPORT "
        "SUPPORTED OPERATION CODES failed: "
    ), erase
    assert erase.endswith(" / ata-security-erase-enhanced: FAILED (SECURITY_ERASE: Input/output error))"), (
        erase
    )
    hd = [c for c in shell.calls() if c.startswith("hdparm --")]
    assert hd == [
        f"hdparm --user-master u --security-set-pass karios-wipe {dev}",
        f"hdparm --user-master u --security-erase-enhanced karios-wipe {dev}",
        f"hdparm --user-master u --security-disable karios-wipe {dev}",
        f"hdparm --user-master u --security-set-pass karios-wipe {dev}",
        f"hdparm --user-master u --security-erase karios-wipe {dev}",
    ]
    assert _image_is(image, 0)


def test_scsi_sanitize_then_nothing_verified_fails_the_disk_when_even_the_overwrite_fails(
    shell: Shell, disk: tuple[Path, str]
) -> None:
    """SCSI crypto sanitize verified; then a read-only device: every rung fails, the disk fails."""
    image, dev = disk
    shell.answer("hdparm-I.txt", HDPARM_VIRTIO)
    for sa, support in ((3, 3), (2, 1), (1, 1)):
        shell.answer(f"rsoc-{sa}.bin", rsoc(support))
    shell.answer("scsi-crypto.effect", "random")
    rc, erase, out = _erase(shell, dev)
    assert rc == 0 and erase.startswith("method: scsi-sanitize-crypto (SANITIZE, crypto (service action 3))")
    assert f"sg_sanitize --quick --crypto {dev}" in shell.calls()
    assert _image_is(image, None)

    subprocess.run(["blockdev", "--setro", dev], check=True)
    try:
        rc, erase, out = _erase(shell, dev)
    finally:
        subprocess.run(["blockdev", "--setrw", dev], check=True)
    assert rc != 0, out
    assert erase.startswith("NO verified erase ("), erase
    assert "the pre-erase markers did not read back, an erase could not be verified" in erase
    assert "scsi-sanitize-crypto: not tried (no markers to verify it by)" in erase
    assert "overwrite-ends: FAILED (" in erase


def test_secure_wipe_disk_reports_the_method_before_the_signature_steps(
    shell: Shell, disk: tuple[Path, str]
) -> None:
    """The whole per-disk step with WIPE_POLICY=secure on a disk with no device erase: the
    overwrite of both ends, then the fast steps; the message carries both verifications."""
    image, dev = disk
    shell.answer("hdparm-I.txt", HDPARM_VIRTIO)
    shell.answer("rsoc.fail", RSOC_FAILED)
    res = shell.run('DISKS="$1"; wipe_disk "$1"', dev, WIPE_POLICY="secure")
    assert res.returncode == 0, res.stdout + res.stderr
    msg = res.stdout.strip().splitlines()[-1]
    assert msg.startswith(
        "wiped 64 MiB: method: overwrite-ends (zeros over the first and last GiB), verified: all 64 MiB "
        "read back as zeros (not used: ata-security-erase: no ATA security feature set"
    ), msg
    assert msg.endswith("read back as zeros, blkid finds nothing"), msg
    assert len(msg.encode()) < 1024  # MAX_MESSAGE: the gateway keeps it whole
    assert _image_is(image, 0)
    asked = len(shell.calls())
    fast = shell.run('DISKS="$1"; wipe_disk "$1"', dev)  # the default policy: no ladder
    assert fast.returncode == 0
    assert fast.stdout.strip().splitlines()[-1].startswith("wiped 64 MiB: 0 signature(s) cleared; ")
    assert len(shell.calls()) == asked
