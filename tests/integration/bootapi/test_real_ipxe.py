"""A real iPXE client: qemu's virtio NIC ROM boots against bootapi inside a private network namespace.

Needs root (``unshare -n``) and the Debian packages ``qemu-system-x86`` + ``ipxe``
(``apt-get install -y --no-install-recommends qemu-system-x86 ipxe``); skips with the reason
otherwise. ~25 s (two TCG boots).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KNOWN, UNKNOWN = "52:54:00:aa:00:11", "52:54:00:de:ad:01"
ROOT = Path(__file__).resolve().parents[3]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare -n"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)"
    if (
        not Path("/usr/lib/ipxe/qemu/efi-virtio.rom").exists()
        and not Path("/usr/share/qemu/efi-virtio.rom").exists()
    ):
        return "no iPXE NIC ROM (apt-get install ipxe)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not installed"
    return None


pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
    pytest.mark.vm(chain="debian-installer"),  # the second VM chain: evens the chains out (tests/conftest.py)
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ipxe") / "lab.json"
    proc = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            "-m",
            "tests.integration.bootapi.ipxe_lab",
            str(out),
            KNOWN,
            UNKNOWN,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 and out.exists(), f"lab run failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_known_mac_ipxe_runs_the_installer_script(lab):
    assert f"/ipxe/{KNOWN}" in lab["seen"]
    # iPXE executed the script: it echoed, then fetched the kernel and initrd the script names.
    assert "/marker/vmlinuz" in lab["seen"] and "/marker/initrd.img" in lab["seen"]
    serial = lab["boots"][KNOWN]["serial"]
    assert "Karios: installing almalinux-9 on node-a1.lab.example" in serial


def test_unknown_mac_gets_a_fallback_script_ipxe_can_run(lab):
    assert f"/ipxe/{UNKNOWN}" in lab["seen"]
    serial = lab["boots"][UNKNOWN]["serial"]
    assert f"Karios: no installer for {UNKNOWN}, booting the local disk" in serial
    assert "Booting from SAN device 0x80" in serial  # sanboot ran (no disk in this VM)...
    assert "Karios: local disk not bootable" in serial  # ...and the script went on past its failure
    assert not any(p.startswith("/marker/") for p in lab["seen"][lab["seen"].index(f"/ipxe/{UNKNOWN}") :])
