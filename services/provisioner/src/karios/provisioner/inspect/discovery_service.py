"""Discovery use cases (issue 27 item 3): the overlay of a discovery boot, a report recorded (and
announced), the discovered servers listed, one adopted. Bus wiring: ``req.provision.record_discovery``,
``q.provision.discovered``, ``req.provision.adopt_discovered``.

The provisioner keeps the hardware records, the discovered servers beside them. NetBox is the
inventory service's: adoption asks it to write the device (``req.inventory.write_back_device``).
With its write-back on (``KARIOS_INVENTORY_WRITEBACK``) the device is created in status ``planned``
with the reported interfaces, disks and GPUs (``netbox_written`` true, ``netbox_device_id``);
otherwise — write-back off, a YAML inventory, NetBox refusing or away — the answer is the device to
create and the steps left to the operator (``netbox_written`` false, ``netbox_reason`` why).
Adopting again asks again: a failed write is retried, a written one found again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from karios.common.bus.runtime import Bus
from karios.common.contracts.discovery import (
    AdoptDiscovered,
    Adoption,
    DiscoveredList,
    DiscoveredQuery,
    DiscoveredServer,
    DiscoveredServerNotFound,
    DiscoveryRecorded,
    NetboxDevice,
    RecordDiscovery,
    ServerAdopted,
    ServerDiscovered,
)
from karios.common.contracts.netbox_writeback import NetboxWriteBack, WriteBackDevice
from karios.common.discovery_token import DiscoveryTokens
from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.provisioner.inspect.discovery import default_hostname, hardware_of, netbox_device, next_steps
from karios.provisioner.inspect.discovery_store import DiscoveryStore
from karios.provisioner.install.live.discovery import discovery_overlay_image, report_url

log = get_logger(__name__)
NETBOX_WAIT = 20.0  # seconds the inventory has to write the device (a dozen NetBox calls); gateway: 30


@dataclass
class DiscoveryService:
    bus: Bus
    store: DiscoveryStore
    tokens: DiscoveryTokens
    callback_base: str  # the gateway's /controlnode as targets reach it
    nameservers: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.time

    def overlay(self, token: str) -> bytes:
        """The discovery boot's overlay for a valid token (401 otherwise): its script posts to the
        gateway with this token; its network comes up on the MAC the token was issued for."""
        mac = self.tokens.verify(token, now=self.clock())
        return discovery_overlay_image(report_url(self.callback_base), token, mac, self.nameservers)

    async def record(self, q: RecordDiscovery) -> DiscoveryRecorded:
        now = datetime.fromtimestamp(self.clock(), UTC)
        rec = await self.store.record(str(uuid.uuid4()), q.boot_mac, q.report, now)
        server = rec.server
        if rec.changed:
            await self.bus.publish_event(
                ServerDiscovered.of(server, created=rec.created),
                self.bus.subjects.evt("inventory", "server.discovered", server.boot_mac),
                entity=server.boot_mac,
            )
        log.info(
            "server discovered" if rec.created else "discovered server reported again",
            id=server.id,
            boot_mac=server.boot_mac,
            serial=server.serial,
            changed=rec.changed,
            drives=len(server.drives),
            nics=len(server.nics),
            source_ip=q.source_ip,
        )
        return DiscoveryRecorded(id=server.id, status=server.status, created=rec.created, changed=rec.changed)

    async def discovered(self, q: DiscoveredQuery) -> DiscoveredList:
        if q.id:
            server = await self.store.get(q.id)
            if server is None:
                raise DiscoveredServerNotFound(f"id: no discovered server {q.id}", field="id")
            return DiscoveredList(servers=[server])
        return DiscoveredList(servers=await self.store.list(q.status, offset=q.offset, limit=q.limit))

    async def adopt(self, q: AdoptDiscovered) -> Adoption:
        current = await self.store.get(q.id)
        if current is None:
            raise DiscoveredServerNotFound(f"id: no discovered server {q.id}", field="id")
        hostname = q.hostname or current.hostname or default_hostname(current)
        adopted = await self.store.adopt(
            q.id, hostname, q.requested_by, datetime.fromtimestamp(self.clock(), UTC)
        )
        if adopted is None:
            raise DiscoveredServerNotFound(f"id: no discovered server {q.id}", field="id")
        server, first = adopted
        device = netbox_device(server, server.hostname)
        written = await self.write_netbox(server, device, q.requested_by)
        if first:
            await self.bus.publish_event(
                ServerAdopted(
                    id=server.id,
                    boot_mac=server.boot_mac,
                    serial=server.serial,
                    hostname=server.hostname,
                    adopted_by=server.adopted_by,
                    netbox_written=written.written,
                ),
                self.bus.subjects.evt("inventory", "server.adopted", server.boot_mac),
                entity=server.boot_mac,
            )
            log.info("discovered server adopted", id=server.id, hostname=server.hostname, by=q.requested_by)
        return Adoption(
            server=server,
            netbox_device=device,
            netbox_written=written.written,
            netbox_device_id=written.device_id if written.written else None,
            netbox_reason=written.reason,
            next_steps=next_steps(server, device, written=written.written),
        )

    async def write_netbox(self, server: DiscoveredServer, device: NetboxDevice, by: str) -> NetboxWriteBack:
        """The inventory writes the device (or says why not); its failure is the answer's reason,
        never the adoption's: the server is adopted, adopting again tries the write again."""
        try:
            written: NetboxWriteBack = await self.bus.request(
                self.bus.subjects.request("inventory", "write_back_device"),
                WriteBackDevice(
                    device=device, hardware=hardware_of(server), source=server.id, requested_by=by
                ),
                timeout=NETBOX_WAIT,
                reply=NetboxWriteBack,
            )
        except KariosError as err:
            log.warning(
                "adopted server not written to NetBox", id=server.id, code=err.code, error=err.message
            )
            return NetboxWriteBack(written=False, reason=f"the inventory could not write it: {err.message}")
        if written.written:
            log.info("adopted server written to NetBox", id=server.id, device_id=written.device_id)
        return written


def wire_discovery(bus: Bus, svc: DiscoveryService) -> None:
    bus.query_responder(
        bus.subjects.request("provision", "record_discovery"), RecordDiscovery, svc.record, max_workers=8
    )
    bus.query_responder(bus.subjects.query("provision", "discovered"), DiscoveredQuery, svc.discovered)
    bus.query_responder(bus.subjects.request("provision", "adopt_discovered"), AdoptDiscovered, svc.adopt)
