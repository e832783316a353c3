"""A provision naming a catalog image (issue 25 item 2): the rules the gateway applies before the
202 (``validate_provision``, ``check_catalog_image``), each a 422 naming its field."""

from __future__ import annotations

import pytest

from karios.common.contracts.images import SEED_NEEDS_BYTES, ImageView
from karios.common.contracts.provision import ProvisionSpec
from karios.common.errors import ValidationFailed
from karios.common.provisioning import check_catalog_image, validate_provision

GB = 10**9


def view(**kw: object) -> ImageView:
    base: dict = dict(
        name="cloud",
        state="ready",
        source_url="http://h/cloud.qcow2",
        format="qcow2",
        checksum_algo="sha256",
        checksum="a" * 64,
        whole_disk=True,
        served_format="raw.zst",
        path="catalog/cloud.raw.zst",
        disk_bytes=2 * GB,
        created_at="2026-12-05T00:00:00+00:00",
        updated_at="2026-12-05T00:00:00+00:00",
    )
    base.update(kw)
    return ImageView(**base)


def spec(**kw: object) -> ProvisionSpec:
    return validate_provision(
        ProvisionSpec(**{"bmc_ip": "10.0.0.9", "vendor": "dell", "image": "cloud", **kw})
    )


def field_of(fn, *a) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationFailed) as exc:
        fn(*a)
    return exc.value.field or "", exc.value.message


def test_an_image_means_the_image_method_and_never_the_debian_installer() -> None:
    assert spec().install_method == "image"
    assert spec(install_method="image").install_method == "image"
    f, msg = field_of(lambda: spec(install_method="preseed"))
    assert f == "install_method" and "image method" in msg
    f, msg = field_of(lambda: spec(image="../etc/passwd"))
    assert f == "image" and "catalog image name" in msg
    assert validate_provision(ProvisionSpec(bmc_ip="10.0.0.9", vendor="dell")).install_method is None


def test_unknown_or_unready_images_are_refused() -> None:
    f, msg = field_of(check_catalog_image, spec(), None, {})
    assert f == "image" and "no image named 'cloud' in the catalog" in msg
    f, msg = field_of(check_catalog_image, spec(), view(state="failed", message="checksum: mismatch"), {})
    assert f == "image" and msg == "image: cloud is failed, not ready: checksum: mismatch"
    f, msg = field_of(check_catalog_image, spec(), view(state="registering"), {})
    assert f == "image" and "registering" in msg


def test_a_whole_disk_image_goes_to_one_disk_that_holds_it_and_its_seed() -> None:
    f, msg = field_of(
        check_catalog_image, spec(pool_type="mirror", selected_disks=["sda", "sdb"]), view(), {}
    )
    assert f == "pool_type" and "whole-disk image" in msg
    # two disks for "single" is the pool rule's own 422 (validate_provision), before the image's
    f, _ = field_of(lambda: spec(pool_type="single", selected_disks=["sda", "sdb"]))
    assert f == "selected_disks"
    small = {"sda": 2 * GB + SEED_NEEDS_BYTES - 1}
    f, msg = field_of(check_catalog_image, spec(selected_disks=["sda"]), view(), small)
    assert f == "selected_disks" and msg.startswith(
        "selected_disks: disk sda is 1.9 GiB; image cloud is a 1.9 GiB disk"
    )
    check_catalog_image(spec(selected_disks=["sda"]), view(), {"sda": 2 * GB + SEED_NEEDS_BYTES})
    check_catalog_image(spec(selected_disks=["sda"]), view(), {"sda": None})  # unknown: the live env checks
    check_catalog_image(spec(), view(), {})  # no disk named: the first disk, checked by the live env


def test_a_whole_disk_image_keeps_its_own_kernel_arguments() -> None:
    f, msg = field_of(check_catalog_image, spec(gpu_passthrough=True), view(), {})
    assert f == "gpu_passthrough" and "its own boot loader" in msg
    archive = view(format="tar.zst", served_format="tar.zst", whole_disk=False, disk_bytes=0)
    check_catalog_image(spec(gpu_passthrough=True), archive, {})  # a root archive gets Karios's GRUB


def test_a_root_archive_keeps_every_pool_type() -> None:
    archive = view(format="tar.zst", served_format="tar.zst", whole_disk=False, disk_bytes=0)
    check_catalog_image(spec(pool_type="raidz2", selected_disks=["a", "b", "c", "d"]), archive, {})


def test_a_catalog_image_is_not_put_on_zfs():
    """pool_backend zfs needs Karios's own image (its initramfs imports the pool)."""
    archive = view(whole_disk=False, format="tar.zst", served_format="tar.zst", disk_bytes=0)
    mirror = {"selected_disks": ["sda", "sdb"], "pool_type": "mirror"}
    assert field_of(check_catalog_image, spec(**mirror, pool_backend="zfs"), archive, {})[0] == "pool_backend"
    check_catalog_image(spec(**mirror), archive, {})  # the default for a root archive: md
    one = {"selected_disks": ["sda"], "pool_backend": "zfs"}
    assert field_of(check_catalog_image, spec(**one), view(), {})[0] == "pool_backend"  # whole disk
