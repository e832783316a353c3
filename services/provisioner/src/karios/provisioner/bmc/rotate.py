"""BMC credential rotation (issue 27 item 8): a new random password for the account Karios uses.

Steps, each undone if a later one fails:

1. refuse (409) while a job uses the BMC, or when its credentials come from settings
   (``KARIOS_PROVISIONER_BMC_ENDPOINTS`` — a rotation stored in the registry would be shadowed);
   404 when the registry does not know the BMC (where would the new password be kept?);
2. log in with the current password, find the account (``AccountService/Accounts``, the member
   whose ``UserName`` is ours), ``PATCH {"Password": new}``;
3. log in again with the new password only (a fresh driver: session, else basic auth) and read
   the System — a firmware that answers 2xx and ignores the property fails here;
4. store it encrypted (SecretBox, context ``bmc:<ip>``) in the registry (``req.inventory.register_node``,
   where BMC credentials are kept today);
5. announce ``karios.evt.provision.bmc.credentials_rotated.<ip>`` (never the password).

A failure after step 2 puts the old password back (PATCH through whichever login still works) and
answers 502 ``BMC_ROTATION_FAILED`` with ``details.rolled_back``. The password exists in memory
only, never in a log, an event or an answer.
"""

from __future__ import annotations

import asyncio
import secrets
import string
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from karios.common.bus.runtime import Bus
from karios.common.contracts.hardware import (
    BmcCredentialsRotated,
    BmcCredentialsRotation,
    BmcRotationFailed,
    BmcRotationRefused,
    RotateBmcCredentials,
)
from karios.common.contracts.inventory import BmcAccess, BmcAccessQuery, RegisterNode, RegisterNodeResult
from karios.common.crypto import SecretBox
from karios.common.db import Database
from karios.common.errors import KariosError, NotFound
from karios.common.telemetry import get_logger
from karios.provisioner.bmc import BmcAccessor
from karios.provisioner.drivers import BmcEndpoint, RedfishDriver, driver_for
from karios.provisioner.drivers.redfish import ROOT
from karios.provisioner.jobs.repository import running_job_on

log = get_logger(__name__)
PASSWORD_LENGTH = 16  # iDRAC ≤ 20 (older firmware), XCC ≤ 32, Supermicro ≤ 19: 16 fits all
_SYMBOLS = "-_"  # accepted by every BMC's policy seen; quotes/spaces/colons are not


def new_password(length: int = PASSWORD_LENGTH) -> str:
    """Random, with an upper-case letter, a lower-case letter, a digit and a symbol (BMC policies
    such as iDRAC's and XCC's require every class)."""
    classes = (string.ascii_uppercase, string.ascii_lowercase, string.digits, _SYMBOLS)
    alphabet = "".join(classes)
    while True:
        pw = "".join(secrets.choice(alphabet) for _ in range(length))
        if all(any(c in cls for c in pw) for cls in classes) and pw[0] not in _SYMBOLS:
            return pw


def scrub(text: str, *secret: str) -> str:
    """``text`` with every given secret masked (a BMC may echo a rejected value in its error)."""
    for value in secret:
        if value:
            text = text.replace(value, "***")
    return text


async def find_account(drv: RedfishDriver, username: str) -> str:
    root = await drv.service_root()
    svc_uri = (root.get("AccountService") or {}).get("@odata.id") or f"{ROOT}/AccountService"
    svc = await drv.get(svc_uri)
    accounts_uri = (svc.get("Accounts") or {}).get("@odata.id") or f"{svc_uri.rstrip('/')}/Accounts"
    accounts = await drv.get(accounts_uri)
    for member in accounts.get("Members") or []:
        uri = member.get("@odata.id", "")
        if uri and (await drv.get(uri)).get("UserName") == username:
            return str(uri).rstrip("/")
    raise BmcRotationRefused(
        f"BMC {drv.ep.bmc_ip}: AccountService lists no account named {username!r}", field="bmc_ip"
    )


@dataclass
class CredentialRotation:
    bus: Bus
    db: Database
    box: SecretBox
    bmcs: BmcAccessor
    driver_factory: Any = None
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def _driver(self, cls: type[RedfishDriver], ep: BmcEndpoint) -> RedfishDriver:
        return self.driver_factory(cls, ep) if self.driver_factory else cls(ep)  # type: ignore[no-any-return]

    async def _registry(self, ip: str) -> BmcAccess:
        try:
            return await self.bus.request(  # type: ignore[no-any-return]
                self.bus.subjects.query("inventory", "bmc_access"), BmcAccessQuery(bmc_ip=ip), reply=BmcAccess
            )
        except NotFound:
            raise NotFound(
                f"bmc_ip: BMC {ip} is not in the registry (POST /controlnode/register first): "
                "there is nowhere to keep a rotated password",
                field="bmc_ip",
            ) from None

    async def _refuse_running_job(self, ip: str) -> None:
        running = await running_job_on(self.db, ip)
        if running is not None:
            raise BmcRotationRefused(
                f"bmc_ip: job {running} uses BMC {ip}; rotate its credentials when it has ended",
                field="bmc_ip",
                details={"job_id": running},
            )

    async def rotate(self, q: RotateBmcCredentials) -> BmcCredentialsRotation:
        lock = self._locks.setdefault(q.bmc_ip, asyncio.Lock())
        async with lock:
            return await self._rotate(q)

    async def _rotate(self, q: RotateBmcCredentials) -> BmcCredentialsRotation:
        ip = q.bmc_ip
        if self.bmcs.cfg.bmc_endpoints.get(ip, {}).get("username"):
            raise BmcRotationRefused(
                f"bmc_ip: the credentials of BMC {ip} are set in KARIOS_PROVISIONER_BMC_ENDPOINTS; "
                "a rotated password in the registry would never be used — change it there",
                field="bmc_ip",
            )
        access = await self._registry(ip)
        await self._refuse_running_job(ip)
        from karios.provisioner.inspect.service import target  # the same endpoint resolution

        ep = await self.bmcs.endpoint(target(ip, access.vendor))
        if not ep.username:
            raise BmcRotationRefused(f"bmc_ip: no BMC username known for {ip}", field="bmc_ip")
        cls = driver_for(access.vendor) if access.vendor else RedfishDriver
        old, new = ep.password, new_password()
        async with self._driver(cls, ep) as drv:
            account = await find_account(drv, ep.username)
            try:
                await drv.request("PATCH", account, {"Password": new})
            except KariosError as exc:
                raise BmcRotationFailed(
                    f"BMC {ip} refused the new password ({scrub(str(exc), new, old)[:200]}); nothing changed",
                    details={"rolled_back": True, "step": "patch"},
                ) from None
        try:
            verified_by = await self._check_login(cls, replace(ep, password=new))
        except KariosError as exc:
            back = await self._roll_back(cls, ep, account, old, new)
            raise BmcRotationFailed(
                f"BMC {ip}: login with the new password failed ({scrub(str(exc), new, old)[:160]}); "
                + ("the old password was put back" if back else "the old password could NOT be put back"),
                details={"rolled_back": back, "step": "verify"},
            ) from None
        try:
            await self.bus.request(
                self.bus.subjects.request("inventory", "register_node"),
                RegisterNode(
                    bmc_ip=ip,
                    bmc_username=ep.username,
                    bmc_password_enc=self.box.encrypt(new, context=f"bmc:{ip}"),
                    is_control_node=False,
                ),
                reply=RegisterNodeResult,
            )
        except KariosError as exc:
            back = await self._roll_back(cls, ep, account, old, new)
            raise BmcRotationFailed(
                f"BMC {ip}: the new password could not be stored ({exc.code}); "
                + ("the old password was put back" if back else "the old password could NOT be put back"),
                details={"rolled_back": back, "step": "store"},
            ) from None
        done = BmcCredentialsRotation(
            bmc_ip=ip,
            username=ep.username,
            account_uri=account,
            rotated_at=datetime.now(UTC).isoformat(),
            verified_by=verified_by,
            stored_in="registry",
        )
        await self.bus.publish_event(
            BmcCredentialsRotated(
                bmc_ip=ip,
                username=done.username,
                rotated_at=done.rotated_at,
                verified_by=verified_by,
                requested_by=q.requested_by,
            ),
            self.bus.subjects.evt("provision", "bmc.credentials_rotated", ip),
            entity=ip,
        )
        log.info("BMC password rotated", bmc_ip=ip, username=done.username, verified_by=verified_by)
        return done

    async def _check_login(self, cls: type[RedfishDriver], ep: BmcEndpoint) -> str:
        """Log in with ``ep``'s password alone and read the System (authenticated)."""
        async with self._driver(cls, replace(ep, retries=0)) as drv:
            await drv.get(await drv.system_uri())
            return "session" if "X-Auth-Token" in drv.client.headers else "basic"

    async def _roll_back(
        self, cls: type[RedfishDriver], ep: BmcEndpoint, account: str, old: str, new: str
    ) -> bool:
        """Put ``old`` back, logged in with whichever password the BMC takes now; True when a
        login with ``old`` works afterwards."""
        for current in (new, old):
            try:
                async with self._driver(cls, replace(ep, password=current, retries=0)) as drv:
                    await drv.request("PATCH", account, {"Password": old})
                await self._check_login(cls, replace(ep, password=old))
            except KariosError as exc:
                log.warning(
                    "BMC password rollback attempt failed",
                    bmc_ip=ep.bmc_ip,
                    error=scrub(str(exc), old, new)[:200],
                )
                continue
            log.warning("BMC password rotation rolled back", bmc_ip=ep.bmc_ip)
            return True
        log.error(
            "BMC password rotation could not be rolled back: the BMC needs an operator", bmc_ip=ep.bmc_ip
        )
        return False


def wire_rotation(bus: Bus, rot: CredentialRotation) -> None:
    bus.query_responder(
        bus.subjects.request("provision", "rotate_bmc_credentials"),
        RotateBmcCredentials,
        rot.rotate,
        max_workers=4,  # seconds per BMC: one rotation must not hold the others
    )
