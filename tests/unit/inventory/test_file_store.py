"""The YAML inventory: the packaged demo data, lookups, pxe_enabled write-back, static IPs."""

from __future__ import annotations

import pytest
import yaml

from karios.common.errors import Conflict, ValidationFailed
from karios.inventory.file_store import FileStore, StaticPool, allocate_from_pool


@pytest.fixture
def demo() -> FileStore:
    return FileStore.from_path(None)


async def test_demo_data_has_servers_with_bmcs_nics_disks_and_gpus(demo):
    assert len(demo.devices) >= 3
    for dev in demo.devices:
        hw = await demo.bmc_hardware(dev.oob_ip)
        assert hw is not None and hw.device_name == dev.name
        assert hw.disks and hw.nics
        assert sum(n.is_bmc for n in hw.nics) == 1
    assert any(d.gpus for d in demo.devices)


async def test_host_by_mac_and_name(demo):
    host = await demo.host_by_mac("d0:8e:79:00:01:01")
    assert host is not None and host.name == "node-01" and host.platform == "almalinux-9"
    assert host.primary_ipv4 == "10.10.0.11/24" and host.oob_ip == "10.20.0.11"
    assert (await demo.host_by_name("node-01")) == host
    assert await demo.host_by_mac("00:00:00:00:00:00") is None
    assert await demo.host_by_name("nope") is None


async def test_pxe_enabled_unset_counts_as_true_and_false_is_kept(demo):
    assert (await demo.host_by_name("node-01")).pxe_enabled is True
    assert (await demo.host_by_name("node-03")).pxe_enabled is False


async def test_bmc_hardware_marks_the_bmc_nic_and_lists_disks_and_gpus(demo):
    hw = await demo.bmc_hardware("10.20.0.11")
    assert [d.name for d in hw.disks] == ["nvme0", "nvme1"]
    assert hw.disks[0].size_gb == 3840 and hw.disks[0].pci_address == "0000:41:00.0"
    assert [g.model for g in hw.gpus] == ["L40S"]
    bmc = [n for n in hw.nics if n.is_bmc]
    assert [n.name for n in bmc] == ["idrac"] and bmc[0].mgmt_only
    assert await demo.bmc_hardware("10.20.0.99") is None


async def test_pxe_write_is_written_back_to_an_operator_file(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "devices": [
                    {"name": "a", "interfaces": [{"name": "eth0", "macs": ["AA-BB-CC-DD-EE-01"]}]},
                ]
            }
        )
    )
    store = FileStore.from_path(path)
    host = await store.set_pxe_enabled("a", False)
    assert host is not None and host.pxe_enabled is False
    again = FileStore.from_path(path)
    assert (await again.host_by_mac("aa:bb:cc:dd:ee:01")).pxe_enabled is False
    assert await store.set_pxe_enabled("missing", True) is None


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (
            {"devices": [{"name": "a", "interfaces": [{"name": "e", "macs": ["nope"]}]}]},
            "devices.0.interfaces.0.macs",
        ),
        ({"devices": [{"name": "a", "oob_ip": "300.1.1.1"}]}, "devices.0.oob_ip"),
        ({"devices": [{"name": "a"}, {"name": "a"}]}, "devices"),
        ({"devices": [{"nme": "a"}]}, "devices.0.name"),
    ],
)
def test_a_bad_inventory_file_is_refused_naming_the_field(tmp_path, doc, field):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValidationFailed) as err:
        FileStore.from_path(path)
    assert err.value.field is not None and err.value.field.startswith(field)


def test_a_missing_inventory_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValidationFailed, match="cannot read"):
        FileStore.from_path(tmp_path / "absent.yaml")


async def test_static_ips_come_from_the_pool_once_per_device(demo):
    first = await demo.allocate_ip("node-03")  # the demo node without a primary IPv4
    assert first.address == "10.10.0.100/24" and first.gateway == "10.10.0.1" and first.created
    again = await demo.allocate_ip("node-03")
    assert again.address == first.address and not again.created
    existing = await demo.allocate_ip("node-01")
    assert existing.address == "10.10.0.11/24" and not existing.created
    assert await demo.allocate_ip("nope") is None


def test_pool_skips_used_addresses_and_the_gateway_and_reports_exhaustion():
    pool = StaticPool(cidr="192.0.2.0/29", start="192.0.2.1", gateway="192.0.2.1")
    assert allocate_from_pool(pool, {"192.0.2.2"}) == "192.0.2.3/29"
    with pytest.raises(Conflict, match="no free address"):
        allocate_from_pool(pool, {f"192.0.2.{i}" for i in range(1, 7)})
    with pytest.raises(ValidationFailed, match="no static IP pool"):
        allocate_from_pool(None, set())


def test_registry_table_holds_every_field_of_the_register_contract():
    """One definition: the registrable fields come from ``RegisterNode``; the table stores them all."""
    from karios.common.contracts.inventory import RegisterNode
    from karios.inventory.models import BmcInfo
    from karios.inventory.registry import _UPDATABLE

    assert set(RegisterNode.model_fields) <= set(BmcInfo.model_fields)
    assert "bmc_password_enc" in _UPDATABLE and "bmc_ip" not in _UPDATABLE


def test_a_file_device_is_the_host_contract_plus_file_only_fields():
    from karios.common.contracts.inventory import Host
    from karios.inventory.file_store import FileDevice

    assert set(Host.model_fields) <= set(FileDevice.model_fields)
    dev = FileDevice.model_validate(
        {
            "name": "srv-1",
            "platform": "debian-12",
            "interfaces": [{"name": "eno1", "macs": ["AA-BB-CC-00-11-22"]}],
        }
    )
    host = dev.host()
    assert type(host) is Host
    assert host.interfaces[0].macs == ["aa:bb:cc:00:11:22"]
    assert host.pxe_enabled is True and "pxe_enabled" not in host.custom_fields
