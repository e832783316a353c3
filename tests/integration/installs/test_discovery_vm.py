"""Discovery of unknown servers (issue 27 item 3) booted for real: a qemu VM (TCG) whose MAC no
host owns PXE-boots with its NIC's iPXE ROM, chains bootapi's ``/ipxe/<mac>`` (discovery on), loads
the live environment and the discovery overlay from the provisioner, reports its virtio and NVMe
disks and its NIC to the gateway, and powers itself off; the discovered server is recorded on the
real NATS and PostgreSQL."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.bootapi.app import create_app as bootapi_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.bootapi_hosts import EmptyHosts
from tests.lab.vm import MIB, VM, Disk

# On the second VM chain (tests/conftest.py): it evens out the two chains' lengths.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.timeout(600),
    pytest.mark.vm(chain="debian-installer"),
]
GW = "10.0.2.100"  # the host, as the guest reaches it (tests/lab/vm.py: guestfwd)
MAC = "52:54:00:de:0d:01"


@dataclass
class PxeVM(VM):
    """The VM booting from its NIC: qemu's DHCP names ``bootfile`` (an http URL iPXE chains)."""

    bootfile: str = ""

    def argv(self) -> list[str]:
        a = super().argv()
        i = a.index("-netdev")
        a[i + 1] += f",bootfile={self.bootfile}"
        return [*a, "-boot", "n"]


def port(url: str) -> int:
    return urlsplit(url).port or 80


async def test_an_unknown_mac_pxe_boots_into_discovery_and_is_recorded(
    settings, serve, live_images, tmp_path: Path
) -> None:
    gw = await serve(gateway_app(settings))
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=live_images.images_dir,
        callback_url=f"http://{GW}:{port(gw.url)}",
    )
    prov = await serve(provisioner_app(settings, cfg))
    boot = await serve(
        bootapi_app(
            settings,
            boot_settings(
                discovery_enabled=True,
                discovery_images_url=f"http://{GW}:{port(prov.url)}",
                discovery_kernel_args="console=ttyS0,115200n8",
            ),
            host_source=EmptyHosts(),
        )
    )
    vm = PxeVM(
        tmp_path,
        name="discover",
        mac=MAC,
        memory=1024,
        disks=[
            Disk(tmp_path / "a.img", 1 << 30),
            Disk(tmp_path / "b.img", 512 * MIB, bus="nvme", serial="DISC0001"),
        ],
        guestfwd={f"{GW}:{port(u)}": port(u) for u in (gw.url, prov.url, boot.url)},
        bootfile=f"http://{GW}:{port(boot.url)}/ipxe/{MAC.replace(':', '-')}",
        no_reboot=True,
    )
    t0 = time.monotonic()
    vm.start()
    try:
        rc = await vm.wait_exit(timeout=400)  # the live environment powers the machine off
    finally:
        vm.stop()
    elapsed = time.monotonic() - t0
    assert rc == 0, vm.tail()
    serial = vm.serial()
    assert f"karios: discovery of an unknown machine (boot MAC {MAC})" in serial, vm.tail()
    assert "karios: hardware reported: " in serial, vm.tail()
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=30) as client:
        (server,) = (await client.get("/controlnode/discovered")).json()
    assert server["boot_mac"] == MAC and server["status"] == "discovered"
    assert server["system"]["manufacturer"] == "QEMU" and server["system"]["model"].startswith("Standard PC")
    assert [(d["name"], d["size_bytes"], d["protocol"]) for d in server["drives"]] == [
        ("nvme0n1", 512 * MIB, "NVMe"),
        ("vda", 1 << 30, "virtio"),
    ]
    assert server["drives"][0]["serial"] == "DISC0001"
    assert [(n["mac"], n["link_status"]) for n in server["nics"]] == [(MAC, "LinkUp")]
    assert any(p["vendor_id"] == "1af4" for p in server["pcie_devices"])  # the virtio devices
    print(f"\ndiscovery VM: PXE to power-off in {elapsed:.0f} s")
