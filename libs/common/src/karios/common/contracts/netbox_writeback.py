"""Contracts of the NetBox write-back (issue 27 item 2): what Karios read of a server's hardware,
written into NetBox by the inventory service (the only service that talks to NetBox), behind
``KARIOS_INVENTORY_WRITEBACK`` (off by default).

- After an out-of-band inspection the provisioner stores the hardware record and publishes
  ``karios.evt.inventory.hardware.inspected.<bmc ip>``; with write-back on, the inventory consumes
  that event (a durable pull consumer, ``inventory-writeback``), reads the record
  (``q.provision.hardware``) and writes it to the device whose out-of-band IP is the BMC's.
- Adopting a discovered server, the provisioner asks ``req.inventory.write_back_device``
  (:class:`WriteBackDevice`): the device is created in status ``planned`` (or found again by name /
  serial) and the reported hardware written to it; the answer is :class:`NetboxWriteBack`.

What is written: interfaces with their MAC addresses (NetBox ≥ 4.2 MAC objects), inventory items
for disks and GPUs (one per serial: updated, never duplicated), one journal entry per inspection or
adoption naming what changed. Nothing an operator created is deleted or overwritten.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from karios.common.contracts.base import Query
from karios.common.contracts.discovery import NetboxDevice
from karios.common.contracts.hardware import HardwareRecord
from karios.common.limits import Name

#: NetBox interface type by link speed (Mb/s); copper for 1G and below, the usual optics above.
NETBOX_INTERFACE_TYPES = {
    100: "100base-tx",
    1000: "1000base-t",
    2500: "2.5gbase-t",
    10000: "10gbase-x-sfpp",
    25000: "25gbase-x-sfp28",
    40000: "40gbase-x-qsfpp",
    50000: "50gbase-x-sfp56",
    100000: "100gbase-x-qsfp28",
    200000: "200gbase-x-qsfp56",
    400000: "400gbase-x-qsfpdd",
}


def netbox_interface_type(speed_mbps: int | None) -> str:
    """The NetBox interface type of a NIC of this speed (``other`` when unknown)."""
    return NETBOX_INTERFACE_TYPES.get(speed_mbps or 0, "other")


class WriteBackDevice(Query):
    """Create the NetBox device of an adopted server (status ``planned``) unless it exists (same
    name, or the same serial), then write the hardware to it. With write-back off (or a YAML
    inventory) nothing is written and the answer says why (``written`` false)."""

    TYPE = "karios.inventory.write_back_device.v1"

    device: NetboxDevice
    hardware: HardwareRecord = Field(description="What to write: interfaces/MACs, disks, GPUs")
    source: Name = Field(description="Where it comes from, for the journal: the discovered server's id")
    requested_by: Name = ""


class NetboxWriteBack(BaseModel):
    """What the write-back did to one NetBox device."""

    written: bool = Field(description="false: nothing was written (``reason`` says why)")
    reason: str = Field("", description="Why nothing was written ('' when written)")
    device_id: int | None = None
    device_name: str = ""
    device_created: bool = Field(False, description="The device was created now (status planned)")
    changes: list[str] = Field(default_factory=list, description="What was created or updated")
    journal_entry_id: int | None = Field(None, description="The journal entry written (None: none new)")
