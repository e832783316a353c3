"""Adoption with the NetBox write-back (issue 27 items 2-3), the provisioner's side: the discovered
server's hardware as a record the inventory writes (interfaces named and typed as the adoption's
NetBox device says, one item per disk and GPU), and the inventory's failure becoming the answer's
reason, never the adoption's. The real path: ``tests/integration/inventory/test_netbox_writeback.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from karios.common.bus.subjects import Subjects
from karios.common.contracts.discovery import DiscoveryReport
from karios.common.contracts.netbox_writeback import NetboxWriteBack, WriteBackDevice
from karios.common.errors import ServiceUnavailable
from karios.inventory.writeback import DeviceState, plan_writeback
from karios.provisioner.inspect.discovery import discovered_server, hardware_of, netbox_device
from karios.provisioner.inspect.discovery_service import DiscoveryService

MAC = "b8:ce:f6:01:02:03"
AT = "2026-12-05T01:00:00Z"
REPORT = {
    "boot_mac": MAC,
    "dmi": {"sys_vendor": "Dell Inc.", "product_name": "PowerEdge R750", "product_serial": "7XK1MN3"},
    "disks": [
        {"name": "nvme0n1", "size_bytes": 1_600_321_314_816, "model": "Dell Ent NVMe P5600 MU U.2 1.6TB",
         "serial": "PHAB123400AB1P6AGN", "rotational": False, "transport": "nvme"},
        {"name": "sda", "size_bytes": 480_103_981_056, "model": "MZ7L3480HCHQAD3", "serial": "S6M1NE0T123456",
         "rotational": False, "transport": "sata"},
        {"name": "sdb", "size_bytes": 2_400_476_553_216, "model": "ST2400MM0129", "serial": "WBN1ABCD",
         "rotational": True, "transport": "sas"},
    ],
    "nics": [
        {"name": "ens1f0np0", "mac": MAC, "link": "up", "speed_mbps": 25000},
        {"name": "ens1f1np1", "mac": "b8:ce:f6:01:02:04", "link": "down"},
        {"name": "eno8303", "mac": "c4:cb:e1:aa:bb:01", "link": "up", "speed_mbps": 1000},
        {"name": "usb0", "mac": "c4:cb:e1:aa:bb:ff", "physical": False},
    ],
    "pci": [
        {"address": "0000:03:00.0", "vendor_id": "1a03", "device_id": "2000", "class_code": "030000"},
        {"address": "0000:ca:00.0", "vendor_id": "10de", "device_id": "20b5", "class_code": "030200"},
    ],
}  # fmt: skip


def server():
    return discovered_server("id-1", MAC, DiscoveryReport.model_validate(REPORT), first_seen=AT, last_seen=AT)


def test_the_discovered_hardware_is_written_as_the_adoption_device_says():
    srv = server()
    rec = hardware_of(srv)
    assert (rec.bmc_ip, rec.inspected_at, rec.driver, rec.system.serial) == ("", AT, "in-band", "7XK1MN3")
    plan = plan_writeback(rec, DeviceState(id=1, name="r750-01"))
    device = netbox_device(srv, "r750-01")
    assert [(i.name, i.type, i.mac) for i in plan.interfaces] == [
        (i.name, i.type, i.mac_address) for i in device.interfaces
    ]
    assert [(i.kind, i.name, i.serial) for i in plan.items] == [
        ("disk", "nvme0n1", "PHAB123400AB1P6AGN"),
        ("disk", "sda", "S6M1NE0T123456"),
        ("disk", "sdb", "WBN1ABCD"),
        ("gpu", "0000:ca:00.0", ""),  # in band a GPU has no serial: matched by its PCI address
    ]
    assert plan.device_serial == "7XK1MN3"


@dataclass
class FakeBus:
    answer: Any
    subjects: Subjects = field(default_factory=Subjects)
    asked: list[Any] = field(default_factory=list)

    async def request(
        self, subject: str, query: Any, *, timeout: float | None = None, reply: Any = None
    ) -> Any:
        self.asked.append((subject, query, timeout))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_the_inventory_writes_the_device_or_its_failure_is_the_reason():
    srv = server()
    device = netbox_device(srv, "r750-01")
    ok = NetboxWriteBack(written=True, device_id=42, device_name="r750-01", device_created=True)
    bus = FakeBus(ok)
    svc = DiscoveryService(bus, store=None, tokens=None, callback_base="")  # type: ignore[arg-type]
    assert await svc.write_netbox(srv, device, "admin") == ok
    ((subject, query, timeout),) = bus.asked
    assert subject.endswith(".req.inventory.write_back_device") and timeout == 20.0
    assert isinstance(query, WriteBackDevice) and (query.source, query.requested_by) == ("id-1", "admin")
    assert query.device == device and len(query.hardware.drives) == 3

    svc.bus = FakeBus(ServiceUnavailable("no service answers karios.req.inventory.write_back_device"))  # type: ignore[assignment]
    failed = await svc.write_netbox(srv, device, "admin")
    assert failed.written is False and failed.device_id is None
    assert failed.reason == (
        "the inventory could not write it: no service answers karios.req.inventory.write_back_device"
    )
