"""pool_backend (issue 25 item 3): the seed's pool types build an OpenZFS pool by default on
Karios's own image (several disks), md RAID when asked; zfs is refused, naming the field, where
nothing would build or boot it (pure rules of karios.common.provisioning)."""

from __future__ import annotations

import pytest

from karios.common.contracts.provision import ProvisionSpec
from karios.common.errors import ValidationFailed
from karios.common.provisioning import (
    DISK_OVERHEAD,
    GIB,
    ZFS_DISK_OVERHEAD,
    check_disk_space,
    pool_capacity,
    resolve_pool_backend,
    validate_provision,
)


@pytest.mark.parametrize(
    ("requested", "pool", "method", "archive", "want"),
    [
        (None, "raidz1", "image", False, "zfs"),
        (None, "mirror", None, False, "zfs"),  # the deployment's default method is the image's
        (None, "stripe", "image", False, "zfs"),
        (None, "single", "image", False, "md"),  # one disk: plain ext4 unless zfs is asked
        (None, "raidz2", "preseed", False, "md"),  # the Debian installer makes md RAID
        (None, "mirror", "image", True, "md"),  # a catalog root archive
        ("zfs", "single", "image", False, "zfs"),
        ("md", "raidz1", "image", False, "md"),
        ("ZFS", "mirror", "image", False, "zfs"),
    ],
)
def test_the_backend_a_job_uses(requested, pool, method, archive, want):
    assert resolve_pool_backend(requested, pool, method, catalog_archive=archive) == want


@pytest.mark.parametrize(
    ("requested", "method", "archive", "words"),
    [
        ("zfs", "preseed", False, "built by the image method"),
        ("zfs", "image", True, "catalog root archive"),
        ("btrfs", "image", False, "is not one of zfs, md"),
    ],
)
def test_zfs_where_nothing_builds_it_is_a_422_naming_pool_backend(requested, method, archive, words):
    with pytest.raises(ValidationFailed) as err:
        resolve_pool_backend(requested, "mirror", method, catalog_archive=archive)
    assert err.value.field == "pool_backend" and words in err.value.message


def _spec(**kw: object) -> ProvisionSpec:
    return ProvisionSpec(bmc_ip="10.0.0.5", vendor="generic", **kw)  # type: ignore[arg-type]


def test_validate_provision_checks_and_normalises_pool_backend():
    assert validate_provision(_spec(pool_backend="MD")).pool_backend == "md"
    assert validate_provision(_spec()).pool_backend is None  # resolved with the job's method
    for bad, method in (("lvm", None), ("zfs", "preseed")):
        with pytest.raises(ValidationFailed) as err:
            validate_provision(_spec(pool_backend=bad, install_method=method))
        assert err.value.field == "pool_backend"


def test_zfs_disks_give_their_boot_partition_too():
    """Each disk gives 512 MiB more with ZFS (its /boot member); the same vdev arithmetic."""
    disks = [4 * GIB] * 3
    assert pool_capacity("raidz1", disks, ZFS_DISK_OVERHEAD) == 2 * (4 * GIB - ZFS_DISK_OVERHEAD)
    assert pool_capacity("raidz1", disks) == 2 * (4 * GIB - DISK_OVERHEAD)
    sizes = {"vda": 2 * GIB, "vdb": 2 * GIB}
    check_disk_space("mirror", ["vda", "vdb"], sizes, GIB, "md")  # 1.5 GiB needed, 1.75 GiB there
    with pytest.raises(ValidationFailed) as err:
        check_disk_space("mirror", ["vda", "vdb"], sizes, GIB, "zfs")  # 1.25 GiB there
    assert err.value.field == "selected_disks"
    assert "a ZFS mirror of vda, vdb" in err.value.message and "770 MiB" in err.value.message
    assert err.value.details["pool_backend"] == "zfs"
