"""Preseed rendering: golden files, RAID mapping, GPU arguments, debconf and shell syntax checks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from karios.common.errors import ValidationFailed
from karios.provisioner import preseed
from karios.provisioner.preseed import HostContext, gpu_kernel_args, raid_layout, render_media_files

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
HASH = preseed.hash_password("adminadmin", salt="karios12")


def ctx(**kw) -> HostContext:
    base = dict(
        job_id="job-1",
        token="tok-abc",
        callback_base="http://10.0.0.1:8080/controlnode",
        hostname="node1",
        bmc_ip="10.0.0.5",
        os_username="debian",
        password_hash=HASH,
    )
    base.update(kw)
    return HostContext(**base)


CASES = {
    "single": ctx(),
    "mirror_static_gpu": ctx(
        disks=["/dev/sda", "/dev/sdb"],
        md_level=1,
        nic="enp1s0",
        static={
            "address": "10.0.0.50",
            "netmask": "255.255.255.0",
            "gateway": "10.0.0.1",
            "nameservers": "10.0.0.1",
        },
        kernel_args=gpu_kernel_args({"device_ids": ["10DE:2204"]}),
    ),
    "raidz2_root": ctx(disks=[f"/dev/sd{c}" for c in "abcd"], md_level=6, root_password_hash=HASH),
    "wipe": ctx(job_type="unprovision", disks=["/dev/sda", "/dev/nvme0n1"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rendered_files_match_golden(name):
    files = render_media_files(CASES[name])
    for path, text in files.items():
        golden = GOLDEN / f"{name}__{path.replace('/', '_')}"
        if UPDATE or not golden.exists():
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden} differs (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.skipif(not shutil.which("debconf-set-selections"), reason="debconf not installed")
@pytest.mark.parametrize("name", list(CASES))
def test_preseed_passes_debconf_checkonly_without_warnings(name, tmp_path):
    f = tmp_path / "preseed.cfg"
    f.write_text(render_media_files(CASES[name])["preseed.cfg"])
    res = subprocess.run(["debconf-set-selections", "--checkonly", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "warning" not in (res.stdout + res.stderr).lower(), res.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_shell_in_scripts_and_commands_parses(name, tmp_path):
    files = render_media_files(CASES[name])
    scripts = [t for p, t in files.items() if p.endswith(".sh")]
    for line in files["preseed.cfg"].splitlines():
        if "_command string " in line:
            scripts.append(line.split("_command string ", 1)[1])
    for i, text in enumerate(scripts):
        f = tmp_path / f"s{i}.sh"
        f.write_text(text)
        res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert res.returncode == 0, (text, res.stderr)


def test_secrets_in_the_medium_are_hashed_and_the_token_is_per_job():
    files = render_media_files(ctx())
    assert "adminadmin" not in "".join(files.values())
    assert "passwd/user-password-crypted password $6$" in files["preseed.cfg"]
    assert "TOKEN='tok-abc'" in files["karios/cb.sh"]
    assert "/job/$JOB/step" in files["karios/cb.sh"] and "/job/$JOB/complete" in files["karios/cb.sh"]
    assert "/firstboot" in files["karios/karios-firstboot.sh"]
    assert "early_command string sh /karios/cb.sh step" in files["preseed.cfg"]
    assert "late_command string" in files["preseed.cfg"] and "cb.sh complete" in files["preseed.cfg"]


@pytest.mark.parametrize(
    ("pool", "n", "level"),
    [
        ("single", 1, None),
        ("stripe", 2, 0),
        ("mirror", 2, 1),
        ("raidz1", 3, 5),
        ("raidz2", 4, 6),
        ("mirror", 3, 1),
    ],
)
def test_pool_type_maps_to_md_level(pool, n, level):
    lvl, disks = raid_layout(pool, [f"sd{c}" for c in "abcdef"[:n]])
    assert lvl.md_level == level and disks[0] == "/dev/sda"


@pytest.mark.parametrize(
    ("pool", "disks", "field"),
    [
        ("single", ["sda", "sdb"], "selected_disks"),
        ("mirror", ["sda"], "selected_disks"),
        ("raidz1", ["sda", "sdb"], "selected_disks"),
        ("raidz2", ["sda", "sdb", "sdc"], "selected_disks"),
        ("raid10", ["sda", "sdb"], "pool_type"),
        ("mirror", ["sda", "sda"], "selected_disks"),
        ("single", ["sda; rm -rf /"], "selected_disks"),
    ],
)
def test_impossible_layouts_are_422_naming_the_field(pool, disks, field):
    with pytest.raises(ValidationFailed) as e:
        raid_layout(pool, disks)
    assert e.value.field == field and e.value.http_status == 422


def test_nvme_partitions_get_the_p_separator():
    files = render_media_files(ctx(disks=["/dev/nvme0n1", "/dev/nvme1n1"], md_level=1))
    assert "ext4 / /dev/nvme0n1p2#/dev/nvme1n1p2 ." in files["preseed.cfg"]


def test_gpu_passthrough_forms():
    assert gpu_kernel_args(None) == [] and gpu_kernel_args(False) == []
    assert gpu_kernel_args({"enabled": False, "device_ids": ["10de:2204"]}) == []
    assert gpu_kernel_args(True) == ["intel_iommu=on", "amd_iommu=on", "iommu=pt"]
    assert gpu_kernel_args({"iommu": "amd", "ids": ["10de:2204", "10de:1aef"]}) == [
        "amd_iommu=on",
        "iommu=pt",
        "vfio-pci.ids=10de:2204,10de:1aef",
    ]
    with pytest.raises(ValidationFailed) as e:
        gpu_kernel_args(["nvidia"])
    assert e.value.field == "gpu_passthrough"
