"""A job's BMC: credentials (request → per-BMC setting → inventory → default), the driver, and
the two things every job does with it besides mounting: check it answers before building, and
leave it clean (medium ejected, boot override cleared) when the job ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import (
    BmcAccess,
    BmcAccessQuery,
    BmcEndpointHint,
    BmcHardware,
    BmcHardwareQuery,
)
from karios.common.contracts.provision import StartProvision
from karios.common.crypto import SecretBox
from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.drivers import BmcEndpoint, RedfishDriver, driver_for
from karios.provisioner.drivers.tls import PinStore, tls_mode

log = get_logger(__name__)


@dataclass
class BmcAccessor:
    bus: Bus
    box: SecretBox
    cfg: ProvisionerConfig
    pins: PinStore | None = None  # BMC TLS pins (trust on first use); the service passes TlsPins

    async def credentials(self, cmd: StartProvision) -> tuple[str, str]:
        ip = cmd.spec.bmc_ip
        over = self.cfg.bmc_endpoints.get(ip, {})
        user, password = over.get("username", ""), over.get("password", "")
        if cmd.bmc_username and cmd.bmc_password_enc:
            return cmd.bmc_username, self.box.decrypt(cmd.bmc_password_enc, context=f"bmc:{ip}")
        if not user:
            with contextlib.suppress(KariosError):
                creds = await self.bus.request(
                    self.bus.subjects.query("inventory", "bmc_access"),
                    BmcAccessQuery(bmc_ip=ip),
                    timeout=2.0,
                    reply=BmcAccess,
                )
                if creds.username and creds.password_enc:
                    user = creds.username
                    password = self.box.decrypt(creds.password_enc, context=f"bmc:{ip}")
        if not user:
            user, password = self.cfg.bmc_default_user, self.cfg.bmc_default_password
        return user, password

    async def inventory_hint(self, ip: str) -> BmcEndpointHint:
        """Scheme, port and Redfish system of the BMC from its inventory record (none: defaults)."""
        try:
            hw = await self.bus.request(
                self.bus.subjects.query("inventory", "bmc_hardware"),
                BmcHardwareQuery(bmc_ip=ip),
                timeout=2.0,
                reply=BmcHardware,
            )
        except KariosError as exc:
            log.info("no inventory endpoint hint for the BMC", bmc_ip=ip, reason=exc.code)
            return BmcEndpointHint()
        return hw.endpoint

    async def endpoint(self, cmd: StartProvision, *, probe: bool = False) -> BmcEndpoint:
        """The BMC's endpoint; ``probe``: reaching the BMC gets a short timeout and at most one
        retry (an address with no BMC fails in seconds); a BMC that answers slowly is alive and
        gets the full limits (a loaded BMC is not a failed job)."""
        ip = cmd.spec.bmc_ip
        over = self.cfg.bmc_endpoints.get(ip, {})
        user, password = await self.credentials(cmd)
        timeout, retries = self.cfg.bmc_timeout, self.cfg.bmc_retries
        connect_timeout = connect_retries = None
        if probe:
            connect_timeout, connect_retries = min(timeout, self.cfg.bmc_probe_timeout), min(retries, 1)
        hint = BmcEndpointHint() if over.get("url") else await self.inventory_hint(ip)
        base_url = over.get("url") or hint.url(ip, self.cfg.bmc_scheme)
        return BmcEndpoint(
            bmc_ip=ip,
            base_url=base_url,
            username=user,
            password=password,
            tls=tls_mode(base_url, over, self.cfg.bmc_ca_bundle),
            ca_bundle=self.cfg.bmc_ca_bundle,
            pins=self.pins,
            system_id=over.get("system_id") or hint.system_id,
            timeout=timeout,
            retries=retries,
            connect_timeout=connect_timeout,
            connect_retries=connect_retries,
            backoff=self.cfg.bmc_backoff,
            power_deadline=self.cfg.power_deadline,
        )


def serial_console_for(cfg: ProvisionerConfig, vendor: str) -> str:
    """The serial console of a vendor's servers (SOL is often ttyS1), else the deployment default."""
    return cfg.serial_consoles.get((vendor or "generic").lower(), cfg.serial_console)


async def probe(drv: RedfishDriver) -> None:
    """The BMC answers and accepts the credentials: service root, then its system (authenticated).

    The driver stays open (its session and what it found go on to the mount); the caller closes it.
    """
    await drv.system_uri()


async def leave_clean(drv: RedfishDriver, job_id: str) -> None:
    """Eject the virtual medium and clear the boot override (each attempted; errors logged)."""
    async with drv:
        for step in (drv.unmount, drv.clear_boot_override):
            try:
                await step()
            except Exception as exc:
                log.warning(
                    "BMC cleanup step failed", job_id=job_id, step=step.__name__, error=str(exc)[:300]
                )


def driver_of(factory: Any, cmd: StartProvision, ep: BmcEndpoint) -> RedfishDriver:
    cls = driver_for(cmd.spec.vendor)
    return factory(cls, ep) if factory else cls(ep)  # type: ignore[no-any-return]
