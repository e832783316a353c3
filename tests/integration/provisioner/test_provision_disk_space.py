"""The image against the selected disks' sizes, at the gateway before the 202 (real NATS,
PostgreSQL, file inventory with disk sizes, the provisioner answering ``q.provision.image`` from
its image's manifest): an image that does not fit the pool the disks make is a 422 naming
``selected_disks`` with the needed and available sizes; enough room, a disk of unknown size, or a
method without an image (preseed) is accepted."""

from __future__ import annotations

import json

import httpx
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.common.provisioning import DISK_OVERHEAD, MIB, ZFS_DISK_OVERHEAD, root_needs
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs

SMALL, BIG, UNSIZED, PRESEED = "10.96.1.1", "10.96.1.2", "10.96.1.3", "10.96.1.4"  # used by no other test
INSTALLED = 1600 * MIB  # the image's installed size in its manifest: the root needs 2.2 GiB


def _device(n: int, ip: str, disks: list[dict]) -> dict:
    return {"id": n, "name": f"space-{n}", "oob_ip": ip, "disks": disks}


def _body(ip: str, disks: list[str], pool_type: str, **kw: object) -> dict:
    return {
        "bmc_IP": ip,
        "vendor": "dell",
        "hostname": "s1",
        "selected_disks": disks,
        "pool_type": pool_type,
        **kw,
    }


async def test_an_image_larger_than_the_selected_disks_is_a_422(settings, serve, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    one_gb = [{"name": n, "size_gb": 1.0} for n in ("sda", "sdb", "sdc", "sdd")]
    devices = [
        _device(1, SMALL, [*one_gb, {"name": "nvme0n1", "size_gb": 4}]),
        _device(2, BIG, [{"name": "sda", "size_gb": 4}, {"name": "sdb", "size_gb": 4}]),
        _device(3, UNSIZED, [{"name": "sda", "size_gb": 1}, {"name": "sdb"}]),
        _device(4, PRESEED, [{"name": "sda", "size_gb": 1}]),
    ]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    suite = tmp_path / "images" / "bookworm"
    suite.mkdir(parents=True)
    (suite / "root.json").write_text(json.dumps({"installed_bytes": INSTALLED, "entries": 1}))
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=tmp_path / "images",
        install_method="image",
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=2,
    )
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    await serve(provisioner_app(settings, cfg))
    gw = await serve(gateway_app(settings))
    need = root_needs(INSTALLED)
    usable_1gb = 10**9 - DISK_OVERHEAD
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            for disks, pool, available, text in (
                (["sda"], "single", usable_1gb, "disk sda is 0.9 GiB; the image needs 2.5 GiB"),
                (["sda", "nvme0n1"], "mirror", usable_1gb, "mirror of sda, nvme0n1 gives 0.7 GiB"),
                (["sda", "sdb"], "stripe", 2 * usable_1gb, "stripe of sda, sdb gives 1.4 GiB"),
                (["sda", "sdb", "sdc"], "raidz1", 2 * usable_1gb, "raidz1 of sda, sdb, sdc gives 1.4 GiB"),
                (["sda", "sdb", "sdc", "nvme0n1"], "raidz2", 2 * usable_1gb, "(n-2) x the smallest disk"),
            ):
                body = _body(SMALL, disks, pool, pool_backend="md")
                r = await c.post("/controlnode/provision/dell", json=body, headers=ADMIN)
                assert r.status_code == 422, r.text
                err = r.json()
                assert err["field"] == "selected_disks", err
                assert (
                    text in err["message"]
                    and f"the image needs {2.2 if pool != 'single' else 2.5} GiB" in err["message"]
                ), err
                assert err["details"]["needed_bytes"] == need, err
                assert err["details"]["available_bytes"] == available, err
                assert err["details"]["installed_bytes"] == INSTALLED, err
            # ZFS (the default for a pool): each disk gives its /boot partition too.
            r = await c.post(
                "/controlnode/provision/dell",
                json=_body(SMALL, ["sda", "sdb", "sdc"], "raidz1"),
                headers=ADMIN,
            )
            assert r.status_code == 422, r.text
            err = r.json()
            assert "a ZFS raidz1 of sda, sdb, sdc gives 0.4 GiB" in err["message"], err
            assert "each disk less 770 MiB" in err["message"], err
            assert err["details"]["available_bytes"] == 2 * (10**9 - ZFS_DISK_OVERHEAD), err
            assert err["details"]["pool_backend"] == "zfs", err
            # A stripe over all five disks has room (4 × 0.2 + 3.0 GiB as ZFS): accepted.
            r = await c.post(
                "/controlnode/provision/dell",
                json=_body(SMALL, ["sda", "sdb", "sdc", "sdd", "nvme0n1"], "stripe"),
                headers=ADMIN,
            )
            assert r.status_code == 202, r.text
            r = await c.post(
                "/controlnode/provision/dell", json=_body(BIG, ["sda", "sdb"], "mirror"), headers=ADMIN
            )
            assert r.status_code == 202, r.text
            # One selected disk's size unknown: nothing to check against.
            r = await c.post(
                "/controlnode/provision/dell", json=_body(UNSIZED, ["sda", "sdb"], "mirror"), headers=ADMIN
            )
            assert r.status_code == 202, r.text
            # The preseed method has no image whose size is known: accepted on a 1 GB disk.
            r = await c.post(
                "/controlnode/provision/dell",
                json=_body(PRESEED, ["sda"], "single", install_method="preseed"),
                headers=ADMIN,
            )
            assert r.status_code == 202, r.text
    finally:
        await retire_leftover_jobs(settings.database_url)
