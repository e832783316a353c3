"""``selected_disks`` against the inventory, at the gateway before the 202 (real NATS, PostgreSQL,
file inventory): a disk the inventory does not list for the server is a 422 naming the field and
the unknown names; a server whose disks the inventory does not know is accepted as before."""

from __future__ import annotations

import httpx
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs

WITH_DISKS, DISKLESS = "10.96.0.1", "10.96.0.2"  # used by no other test


def _body(ip: str, disks: list[str], pool_type: str = "single") -> dict:
    return {"bmc_IP": ip, "vendor": "dell", "hostname": "d1", "selected_disks": disks, "pool_type": pool_type}


async def test_selected_disks_must_be_in_the_inventory(settings, serve, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    inventory = tmp_path / "inventory.yaml"
    devices = [
        {
            "id": 1,
            "name": "with-disks",
            "oob_ip": WITH_DISKS,
            "disks": [{"name": "sda"}, {"name": "nvme0n1"}],
        },
        {"id": 2, "name": "diskless", "oob_ip": DISKLESS},
    ]
    inventory.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    gw = await serve(gateway_app(settings))
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            for disks, pool, unknown in (
                (["sdz"], "single", ["sdz"]),
                (["sda", "/dev/sdz"], "mirror", ["sdz"]),
                (["sdb", "sdc"], "mirror", ["sdb", "sdc"]),
            ):
                r = await c.post(
                    "/controlnode/provision/dell", json=_body(WITH_DISKS, disks, pool), headers=ADMIN
                )
                assert r.status_code == 422, r.text
                err = r.json()
                assert err["field"] == "selected_disks", err
                assert err["details"]["unknown"] == unknown, err
                assert all(name in err["message"] for name in unknown), err
                assert err["details"]["inventory"] == ["nvme0n1", "sda"], err
            # Nothing was queued by the refusals (a job would make this a 409), and both spellings
            # of a listed disk are accepted.
            r = await c.post(
                "/controlnode/provision/dell",
                json=_body(WITH_DISKS, ["/dev/sda", "nvme0n1"], "mirror"),
                headers=ADMIN,
            )
            assert r.status_code == 202, r.text
            # The inventory knows no disks of this server: nothing to check against, accepted.
            r = await c.post("/controlnode/provision/dell", json=_body(DISKLESS, ["sdz"]), headers=ADMIN)
            assert r.status_code == 202, r.text
    finally:
        await retire_leftover_jobs(settings.database_url)  # no provisioner here: the jobs stay queued
