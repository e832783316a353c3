"""Provision requests validated once (karios.common.provisioning): every bad field named, the
spec normalised for the worker; the vendor list is the drivers' list; install-method choice."""

from __future__ import annotations

import pytest

from karios.common.contracts.provision import ProvisionSpec
from karios.common.errors import Conflict, ValidationFailed
from karios.common.provisioning import (
    MAX_LOG_LINE,
    MAX_LOG_LINES,
    MAX_MESSAGE,
    VENDORS,
    bound_log,
    bound_message,
    gpu_kernel_args,
    refuse_second_job,
    validate_provision,
    validate_unprovision,
)
from karios.provisioner.app import image_file
from karios.provisioner.drivers import DRIVERS
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, stage_of
from karios.provisioner.install.preseed import PreseedMethod, PreseedWipeMethod
from karios.provisioner.install.registry import method_for


def spec(**kw) -> ProvisionSpec:
    return ProvisionSpec(**{"bmc_ip": "10.0.0.5", "vendor": "dell", "hostname": "node1", **kw})


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"vendor": "foo"}, "vendor"),
        ({"hostname": "Srv_X"}, "hostname"),
        ({"hostname": "-a"}, "hostname"),
        ({"os_username": "Root User"}, "os_username"),
        ({"selected_nic": "eth0 ; reboot"}, "selected_nic"),
        ({"selected_disks": ["sda", "../sdb"]}, "selected_disks"),
        ({"selected_disks": ["sda", "/dev/sda"], "pool_type": "mirror"}, "selected_disks"),
        ({"selected_disks": ["sda"], "pool_type": "mirror"}, "selected_disks"),
        ({"pool_type": "raid7"}, "pool_type"),
        ({"debian_version": "9"}, "debian_version"),
        ({"arch": "arm64"}, "arch"),
        ({"install_method": "pxe"}, "install_method"),
        ({"mirror": "bad host/debian"}, "mirror"),
        ({"mirror": "deb.example.org/$(reboot)"}, "mirror"),
        ({"http_proxy": "ftp://proxy:21"}, "http_proxy"),
        ({"gpu_passthrough": ["zz"]}, "gpu_passthrough"),
        ({"gpu_passthrough": {"iommu": "arm"}}, "gpu_passthrough"),
        ({"ssh_authorized_keys": ["not a key"]}, "ssh_authorized_keys"),
        ({"ssh_authorized_keys": ["ssh-ed25519 AAAA\nssh-rsa BBBB"]}, "ssh_authorized_keys"),
        ({"ssh_authorized_keys": ['command="reboot" ssh-ed25519 AAAAC3Nz']}, "ssh_authorized_keys"),
        ({"ssh_authorized_keys": ["ssh-ed25519 AAAAC3Nz"] * 17}, "ssh_authorized_keys"),
    ],
)
def test_every_invalid_field_is_named(fields, field):
    with pytest.raises(ValidationFailed) as e:
        validate_provision(spec(**fields))
    assert e.value.field == field and field in e.value.message


def test_valid_spec_is_normalised_for_the_worker():
    got = validate_provision(
        spec(
            vendor="DELL",
            selected_disks=["sda", "/dev/nvme0n1"],
            pool_type="Mirror",
            debian_version="bookworm",
            mirror="http://10.0.0.1:3142/debian/",
            http_proxy="http://10.0.0.1:3142",
            install_method="image",
        )
    )
    assert (got.vendor, got.pool_type, got.debian_version) == ("dell", "mirror", "12")
    assert got.selected_disks == ["/dev/sda", "/dev/nvme0n1"]
    assert got.mirror == "10.0.0.1:3142/debian" and got.http_proxy == "http://10.0.0.1:3142"
    assert validate_provision(spec(mirror="deb.debian.org")).mirror == "deb.debian.org/debian"
    assert validate_provision(spec()).install_method is None  # the provisioner's default applies
    assert validate_unprovision(spec(vendor="HPE")).vendor == "hpe"
    with pytest.raises(ValidationFailed):
        validate_unprovision(spec(vendor="acme"))


def test_the_vendor_list_is_the_drivers_list():
    assert set(VENDORS) == set(DRIVERS)


def test_gpu_arguments():
    assert gpu_kernel_args(None) == [] and gpu_kernel_args({"enabled": False}) == []
    assert gpu_kernel_args(True) == ["intel_iommu=on", "amd_iommu=on", "iommu=pt"]
    assert gpu_kernel_args({"device_ids": ["10DE:2204"], "iommu": "amd"}) == [
        "amd_iommu=on",
        "iommu=pt",
        "vfio-pci.ids=10de:2204",
    ]


def test_one_running_job_per_bmc():
    refuse_second_job("10.0.0.5", None)
    with pytest.raises(Conflict) as e:
        refuse_second_job("10.0.0.5", "job-7")
    assert e.value.details == {"job_id": "job-7"} and "job-7" in e.value.message


def test_installer_reports_are_bounded():
    assert len(bound_message("é" * 2000).encode()) <= MAX_MESSAGE
    assert bound_message(None) == ""
    lines = bound_log([f"{i} " + "x" * 1000 for i in range(200)])
    assert len(lines) == MAX_LOG_LINES and lines[-1].startswith("199 ")
    assert all(len(line) == MAX_LOG_LINE for line in lines)


def test_install_method_choice():
    methods = {"preseed": PreseedMethod(), "wipe": PreseedWipeMethod()}
    assert method_for(methods, "unprovision", "image", "image") == "wipe"
    assert method_for(methods, "provision", "preseed", "image") == "preseed"
    assert method_for(methods, "provision", None, "image") == "preseed"  # image not installed here
    assert method_for({**methods, "image": PreseedMethod()}, "provision", None, "image") == "image"
    assert method_for(methods, "provision", "image", "preseed") == "image"  # the job fails, named


def test_stages_of_a_report():
    assert stage_of(INSTALL_STAGES, "partitioning").percent == 60
    assert stage_of(WIPE_STAGES, "wipe:/dev/vda").label == "Wiping disks"
    assert stage_of(INSTALL_STAGES, "nonsense") is None


def test_images_are_served_only_from_under_images_dir(tmp_path):
    (tmp_path / "bookworm").mkdir()
    (tmp_path / "bookworm" / "root.tar.zst").write_bytes(b"x")
    (tmp_path / "secret").write_text("s")
    (tmp_path / "bookworm" / "link").symlink_to(tmp_path.parent)
    assert image_file(tmp_path, "bookworm/root.tar.zst") == (tmp_path / "bookworm" / "root.tar.zst").resolve()
    for bad in (
        "../secret",
        "bookworm/../secret",
        ".hidden",
        "bookworm/link/x",
        "",
        "/etc/passwd",
        "bookworm",
    ):
        assert image_file(tmp_path, bad) is None, bad
    assert image_file(None, "bookworm/root.tar.zst") is None


def test_a_bmc_that_reads_back_continuous_is_a_quirk_with_evidence():
    from karios.provisioner.drivers import BmcEndpoint, RedfishDriver, driver_for
    from karios.provisioner.jobs.worker import quirk_note

    drv = RedfishDriver(BmcEndpoint(bmc_ip="10.0.0.5", base_url="http://127.0.0.1:9"))
    note = quirk_note(drv, "Continuous")
    assert "BMC quirk" in note and "'Continuous'" in note and "cleared" in note
    assert quirk_note(drv, "Once") == "" and quirk_note(drv, None) == ""  # None: a wrapped driver
    lenovo = driver_for("lenovo")(BmcEndpoint(bmc_ip="10.0.0.6", base_url="http://127.0.0.1:9"))
    assert quirk_note(lenovo, "Once") == ""


def test_ssh_keys_are_kept_trimmed_one_per_item():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps ops@example"
    out = validate_provision(spec(ssh_authorized_keys=[f"  {key} "]))
    assert out.ssh_authorized_keys == [key]
