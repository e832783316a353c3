"""Generic Redfish virtual-media driver on httpx (the adapter; errors translated here, once).

Mount = discover (follow links) → eject what is inserted → insert (read back unless the BMC's
answer already confirms it) → one-time boot override to CD (UEFI), read back → reset (On or
ForceRestart) → poll power state with a deadline.

One driver is one session: what discovery found (service root, system URI, the system's links)
is kept for the driver's lifetime, so every step after the first costs only its own request(s).
A job's driver lives for seconds (probe, medium, mount, reset), so nothing cached goes stale.

First contact (before any credential is sent): an unauthenticated GET of the service root, the
TLS check of :mod:`.tls` (pin on first use, refuse a changed certificate), then the login.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import stamina

from karios.common.errors import KariosError, PermanentFailure, UpstreamError
from karios.common.telemetry import get_logger
from karios.common.telemetry_http import expected_statuses
from karios.provisioner.drivers.quirks import Quirks
from karios.provisioner.drivers.tls import (
    BmcCertificateChanged,
    CertificateCheck,
    PinStore,
    TlsMode,
    changed_message,
)

log = get_logger(__name__)
ROOT = "/redfish/v1"


@dataclass
class BmcEndpoint:
    bmc_ip: str
    base_url: str  # e.g. https://10.0.0.5
    username: str = ""
    password: str = ""  # plaintext only in memory of the provisioner; never logged
    tls: TlsMode = TlsMode.tofu  # see drivers/tls.py; http:// endpoints are always plain
    ca_bundle: str = ""  # PEM file of the CAs that sign BMC certificates (tls=ca; "" = system store)
    pins: PinStore | None = field(default=None, repr=False)  # tofu: where fingerprints are pinned
    system_id: str = ""  # pick this member of Systems (default: the first)
    timeout: float = 10.0
    retries: int = 3
    backoff: float = 0.5
    power_deadline: float = 60.0
    # A probe's limits for reaching the BMC at all (None: timeout and retries). A BMC that
    # accepted the connection and answers slowly is alive: it gets the full limits.
    connect_timeout: float | None = None
    connect_retries: int | None = None

    def __repr__(self) -> str:  # keeps the password out of tracebacks and logs
        return f"BmcEndpoint(bmc_ip={self.bmc_ip!r}, base_url={self.base_url!r}, username={self.username!r})"


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    err = body.get("error", {}) if isinstance(body, dict) else {}
    infos = err.get("@Message.ExtendedInfo") or []
    if infos and isinstance(infos, list) and isinstance(infos[0], dict):
        first = infos[0]
        return f"{first.get('MessageId', '')}: {first.get('Message', '')}".strip(": ")
    return str(err.get("message") or body)[:200]


def _empty(image: Any) -> bool:
    return image in (None, "", "null")


class RedfishDriver:
    vendor: ClassVar[str] = "generic"
    quirks: ClassVar[Quirks] = Quirks()

    def __init__(self, ep: BmcEndpoint, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.ep = ep
        mode = TlsMode.plain if ep.base_url.lower().startswith("http:") else ep.tls
        self.cert = CertificateCheck(ep.bmc_ip, mode, ep.ca_bundle)
        self.client = httpx.AsyncClient(
            base_url=ep.base_url,
            verify=self.cert.ssl_context(),
            timeout=httpx.Timeout(ep.timeout, connect=ep.connect_timeout or ep.timeout),
            transport=transport,
            follow_redirects=True,
            headers={"Accept": "application/json"},
        )
        self._session_tried = False
        self._relogin_tried = False
        self.calls: list[tuple[str, str]] = []
        self.last_status = 0  # HTTP status of the last answer (200/204: done; 202: a task)
        self.last_location = ""  # Location header of the last answer (an action's task monitor)
        self.last_method = ""
        # Discovery, kept for this driver's (one job step's) lifetime: see the module docstring.
        self._root: dict[str, Any] | None = None
        self._sys_uri = ""
        self._system: dict[str, Any] | None = None
        self._fresh_system: dict[str, Any] | None = None  # read after our last write to it

    def relax(self) -> None:
        """Drop a probe's short limits for reaching the BMC (the same driver goes on to mount)."""
        self.ep.connect_timeout = self.ep.connect_retries = None
        self.client.timeout = httpx.Timeout(self.ep.timeout)

    async def close(self) -> None:
        if "X-Auth-Token" in self.client.headers and self._session_uri:
            with contextlib.suppress(httpx.HTTPError):
                await self.client.delete(self._session_uri)
        await self.client.aclose()

    async def __aenter__(self) -> RedfishDriver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- HTTP ---------------------------------------------------------------------------
    _session_uri: str = ""

    def _path(self, uri: str) -> str:
        if self.quirks.strip_trailing_slash and uri.endswith("/") and uri != "/":
            uri = uri.rstrip("/")
        return uri

    async def _first_contact(self) -> None:
        """Service root without credentials, the certificate checked (pinned on first use), then
        the login: a BMC with a changed or untrusted certificate never sees a credential."""
        self._session_tried = True
        if self.cert.mode == TlsMode.tofu and self.ep.pins is not None:
            self.cert.expected = await self.ep.pins.get(self.ep.bmc_ip)
        try:
            root = await self.request("GET", ROOT)
            # The service root is public (DSP0266) and the same document after the login: kept
            # when it has the links we follow, so discovery does not read it twice.
            if "Systems" in root:
                self._root = root
        except (_ClientError, PermanentFailure) as exc:
            if self.cert.error() is not None:
                raise
            log.debug("service root refused without credentials", bmc_ip=self.ep.bmc_ip, error=str(exc))
        if self.cert.mode == TlsMode.tofu and self.cert.expected is None and self.cert.seen:
            if self.ep.pins is None:
                raise PermanentFailure(f"BMC {self.ep.bmc_ip}: no store to pin its TLS certificate in")
            pinned = await self.ep.pins.record(self.ep.bmc_ip, self.cert.seen)
            self.cert.expected = pinned
            if pinned != self.cert.seen:  # another replica pinned another certificate meanwhile
                raise BmcCertificateChanged(changed_message(self.ep.bmc_ip, self.cert.seen, pinned))
            log.info("BMC TLS certificate pinned on first contact", bmc_ip=self.ep.bmc_ip, sha256=pinned)
        await self._login()

    async def _login(self) -> None:
        """Session auth (X-Auth-Token), falling back to basic auth when the BMC has no sessions."""
        if not self.ep.username:
            return
        try:
            # A BMC without sessions answers 4xx/5xx here: the fallback below, not an error.
            with expected_statuses(400, 401, 403, 404, 405, 501):
                r = await self.client.post(
                    f"{ROOT}/SessionService/Sessions",
                    json={"UserName": self.ep.username, "Password": self.ep.password},
                )
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code in (200, 201) and r.headers.get("X-Auth-Token"):
            self.client.headers["X-Auth-Token"] = r.headers["X-Auth-Token"]
            self._session_uri = r.headers.get("Location", "")
        else:
            self.client.auth = httpx.BasicAuth(self.ep.username, self.ep.password)

    async def request(self, method: str, uri: str, json: Any = None) -> dict[str, Any]:
        if not self._session_tried:
            await self._first_contact()
        uri = self._path(uri)
        unreached = sent = 0

        def transient(exc: Exception) -> bool:
            nonlocal unreached
            if not isinstance(exc, _TransientBMCError):
                return False
            if exc.unreached and self.ep.connect_retries is not None:
                unreached += 1
                return unreached <= self.ep.connect_retries
            return True

        try:
            # Transient failures (timeouts, connection errors, 5xx, 429, 409 where the vendor
            # quirk says so) are retried with exponential backoff; a 4xx is final at once.
            async for attempt in stamina.retry_context(
                on=transient,
                attempts=self.ep.retries + 1,
                timeout=None,
                wait_initial=self.ep.backoff,
                wait_max=30.0,
                wait_jitter=0.0,
            ):
                with attempt:
                    sent += 1
                    return await self._request_once(method, uri, json)
        except _TransientBMCError as exc:
            where = f"BMC {self.ep.bmc_ip} {method} {uri}"
            raise UpstreamError(f"{where} failed after {sent} tries: {exc}") from None
        raise AssertionError("unreachable: stamina either returns or raises")

    async def _send(self, method: str, uri: str, json: Any) -> httpx.Response:
        self.calls.append((method, uri))
        try:
            return await self.client.request(method, uri, json=json)
        except httpx.ConnectTimeout:
            limit = self.ep.connect_timeout or self.ep.timeout
            raise _TransientBMCError(f"no connection within {limit}s", unreached=True) from None
        except httpx.TimeoutException:
            raise _TransientBMCError(f"no answer within {self.ep.timeout}s") from None
        except httpx.HTTPError as exc:
            refused = self.cert.error()  # a refused certificate is final, never retried
            if refused is not None:
                raise refused from None
            unreached = isinstance(exc, httpx.ConnectError)
            raise _TransientBMCError(type(exc).__name__, unreached=unreached) from None

    async def _request_once(self, method: str, uri: str, json: Any) -> dict[str, Any]:
        r = await self._send(method, uri, json)
        if r.status_code == 401 and "X-Auth-Token" in self.client.headers and not self._relogin_tried:
            # Our session ended (a BMC's idle timeout, a BMC reboot): log in again, once.
            self._relogin_tried = True
            del self.client.headers["X-Auth-Token"]
            self._session_uri = ""
            await self._login()
            r = await self._send(method, uri, json)
        self.last_status, self.last_method = r.status_code, method
        self.last_location = r.headers.get("Location", "")
        if r.status_code < 400:
            if not r.content:
                return {}
            try:
                body = r.json()
            except ValueError:
                return {}
            return body if isinstance(body, dict) else {}
        last = f"HTTP {r.status_code} {_error_text(r)}"
        busy = r.status_code == 409 and self.quirks.retry_on_409
        if r.status_code >= 500 or r.status_code == 429 or busy:
            raise _TransientBMCError(last)
        if r.status_code in (401, 403):
            raise PermanentFailure(f"BMC {self.ep.bmc_ip} refused the credentials ({r.status_code})")
        raise _ClientError(r.status_code, f"BMC {self.ep.bmc_ip} {method} {uri}: {last}")

    async def get(self, uri: str) -> dict[str, Any]:
        return await self.request("GET", uri)

    # -- discovery ----------------------------------------------------------------------
    async def service_root(self) -> dict[str, Any]:
        if not self._session_tried:
            await self._first_contact()  # may keep the root it read without credentials
        if self._root is None:
            self._root = await self.get(ROOT)
        return self._root

    async def system_uri(self) -> str:
        if not self._sys_uri:
            self._sys_uri = await self._find_system()
        return self._sys_uri

    async def system(self, sys_uri: str) -> dict[str, Any]:
        """The system's document as first read by this driver (links, Boot capabilities)."""
        if self._system is None:
            self._system = await self.get(sys_uri)
        return self._system

    async def _find_system(self) -> str:
        root = await self.service_root()
        systems = await self.get(root.get("Systems", {}).get("@odata.id", f"{ROOT}/Systems"))
        members = [m["@odata.id"] for m in systems.get("Members", [])]
        if not members:
            raise UpstreamError(f"BMC {self.ep.bmc_ip} lists no systems")
        if self.ep.system_id:
            for m in members:
                if self._path(m).rsplit("/", 1)[-1] == self.ep.system_id:
                    return self._path(m)
            raise PermanentFailure(f"BMC {self.ep.bmc_ip} has no system {self.ep.system_id}")
        return self._path(members[0])

    async def manager_uris(self, system: dict[str, Any]) -> list[str]:
        linked = [m["@odata.id"] for m in system.get("Links", {}).get("ManagedBy", []) if "@odata.id" in m]
        if linked:
            return linked
        root = await self.service_root()
        mgrs = await self.get(root.get("Managers", {}).get("@odata.id", f"{ROOT}/Managers"))
        return [m["@odata.id"] for m in mgrs.get("Members", [])]

    async def virtual_media_collections(self, sys_uri: str) -> list[str]:
        """VirtualMedia collections in the order this firmware wants them tried (links only)."""
        return [u async for u in self._vm_collections(sys_uri)]

    async def _vm_collections(self, sys_uri: str) -> AsyncIterator[str]:
        """The same order, lazily: the Managers are read only if the collections before them
        had no CD slot (``vm_prefer="system"``), or first (``"manager"``)."""
        system = await self.system(sys_uri)
        from_system = [system["VirtualMedia"]["@odata.id"]] if "VirtualMedia" in system else []

        async def from_managers() -> AsyncIterator[str]:
            for m in await self.manager_uris(system):
                mgr = await self.get(m)
                if "VirtualMedia" in mgr:
                    yield mgr["VirtualMedia"]["@odata.id"]

        async def ordered() -> AsyncIterator[str]:
            if self.quirks.vm_prefer == "system":
                for u in from_system:
                    yield u
            async for u in from_managers():
                yield u
            if self.quirks.vm_prefer != "system":
                for u in from_system:
                    yield u

        seen: set[str] = set()
        async for u in ordered():
            if self._path(u) not in seen:
                seen.add(self._path(u))
                yield self._path(u)

    def is_cd_slot(self, slot: dict[str, Any]) -> bool:
        return any(t in ("CD", "DVD") for t in slot.get("MediaTypes") or [])

    async def cd_slot(self, sys_uri: str) -> tuple[str, dict[str, Any]]:
        async for coll_uri in self._vm_collections(sys_uri):
            try:
                coll = await self.get(coll_uri)
            except _ClientError as exc:
                if exc.status == 404:
                    continue
                raise
            members = sorted(m["@odata.id"] for m in coll.get("Members", []))
            for m in members:
                slot = await self.get(m)
                if self.is_cd_slot(slot):
                    return self._path(m), slot
        raise UpstreamError(f"BMC {self.ep.bmc_ip} exposes no CD/DVD virtual media slot")

    # -- virtual media ------------------------------------------------------------------
    @staticmethod
    def action_target(slot: dict[str, Any], name: str) -> str:
        act = (slot.get("Actions") or {}).get(f"#VirtualMedia.{name}")
        return act.get("target", "") if isinstance(act, dict) else ""

    def inserted(self, slot: dict[str, Any]) -> bool:
        return bool(slot.get("Inserted")) or not _empty(slot.get("Image"))

    async def eject(self, slot_uri: str, slot: dict[str, Any]) -> None:
        if not self.inserted(slot):
            return  # nothing to eject; some firmware errors on eject-when-empty
        target = self.action_target(slot, "EjectMedia")
        if target:
            await self.request("POST", target, {})
        else:
            await self.request("PATCH", slot_uri, {"Image": None, "Inserted": False})

    async def insert_params(self, slot: dict[str, Any], image: str) -> dict[str, Any]:
        params: dict[str, Any] = {"Image": image, "Inserted": True, "WriteProtected": True}
        if image.startswith("https:"):
            params["TransferProtocolType"] = "HTTPS"
        elif image.startswith("http:"):
            params["TransferProtocolType"] = "HTTP"
        info_uri = ((slot.get("Actions") or {}).get("#VirtualMedia.InsertMedia") or {}).get(
            "@Redfish.ActionInfo"
        )
        if info_uri:
            try:
                info = await self.get(info_uri)
                allowed = {p.get("Name") for p in info.get("Parameters", [])}
                params = {k: v for k, v in params.items() if k in allowed or k == "Image"}
            except _ClientError:
                pass
        return {k: v for k, v in params.items() if k not in self.quirks.insert_omit}

    async def insert(self, slot_uri: str, slot: dict[str, Any], image: str) -> None:
        target = self.action_target(slot, "InsertMedia")
        if target:
            await self.request("POST", target, await self.insert_params(slot, image))
        else:
            await self.request("PATCH", slot_uri, {"Image": image, "Inserted": True})

    def insert_confirmed(self) -> bool:
        """The BMC's answer to the insert is the proof: an action (POST) answered 200 or 204 has
        completed (Redfish: a 202 is a task still running). A PATCH can answer 2xx and still
        ignore a property, so it is read back, and so is a firmware with ``read_back_insert``."""
        if self.quirks.read_back_insert:
            return False
        return self.last_method == "POST" and self.last_status in (200, 204)

    async def mount(self, image: str) -> str:
        """Insert ``image`` into the CD slot (read back unless the answer confirms it). Returns
        the slot URI."""
        sys_uri = await self.system_uri()
        slot_uri, slot = await self.cd_slot(sys_uri)
        await self.eject(slot_uri, slot)
        if self.inserted(slot):
            slot = await self.get(slot_uri)
        await self.insert(slot_uri, slot, image)
        if self.insert_confirmed():
            return slot_uri
        back = await self.get(slot_uri)
        if back.get("Image") != image and not str(back.get("Image") or "").endswith(image.rsplit("/", 1)[-1]):
            raise UpstreamError(
                f"BMC {self.ep.bmc_ip} reports Image={back.get('Image')!r} after inserting the medium"
            )
        if back.get("Inserted") is False:
            raise UpstreamError(f"BMC {self.ep.bmc_ip} reports Inserted=false after inserting the medium")
        return slot_uri

    async def unmount(self) -> None:
        sys_uri = await self.system_uri()
        slot_uri, slot = await self.cd_slot(sys_uri)
        await self.eject(slot_uri, slot)

    # -- boot and power -----------------------------------------------------------------
    def boot_body(self, system: dict[str, Any]) -> dict[str, Any]:
        boot = system.get("Boot", {})
        body: dict[str, Any] = {
            "BootSourceOverrideTarget": "Cd",
            "BootSourceOverrideEnabled": self.quirks.boot_enabled,
        }
        modes = boot.get("BootSourceOverrideMode@Redfish.AllowableValues")
        if "BootSourceOverrideMode" in boot and (not modes or "UEFI" in modes):
            body["BootSourceOverrideMode"] = "UEFI"
        return {"Boot": body}

    async def set_boot_cd_once(self) -> str:
        """Boot from the CD once; returns the ``BootSourceOverrideEnabled`` the BMC reads back
        (a BMC answering ``Continuous`` when ``Once`` was sent ignores one-time overrides)."""
        sys_uri = await self.system_uri()
        system = await self.system(sys_uri)  # Boot capabilities: the discovery read has them
        answer = await self.request("PATCH", sys_uri, self.boot_body(system))
        # Read back (kept: a firmware may store "Continuous" for "Once", or ignore the target),
        # unless the PATCH answered with the system itself (its Boot and its power state).
        whole = "Boot" in answer and "PowerState" in answer
        self._fresh_system = answer if whole else await self.get(sys_uri)
        back = self._fresh_system.get("Boot", {})
        if back.get("BootSourceOverrideTarget") != "Cd":
            got = back.get("BootSourceOverrideTarget")
            raise UpstreamError(f"BMC {self.ep.bmc_ip} reports boot target {got!r} after setting Cd")
        return str(back.get("BootSourceOverrideEnabled") or "")

    async def clear_boot_override(self) -> None:
        sys_uri = await self.system_uri()
        self._fresh_system = None
        await self.request(
            "PATCH",
            sys_uri,
            {"Boot": {"BootSourceOverrideTarget": "None", "BootSourceOverrideEnabled": "Disabled"}},
        )

    async def reset_into_media(self) -> str:
        sys_uri = await self.system_uri()
        # Power state and the Reset action: the boot override's read-back is a moment old.
        system, self._fresh_system = self._fresh_system or await self.get(sys_uri), None
        reset = (system.get("Actions") or {}).get("#ComputerSystem.Reset") or {}
        target = reset.get("target") or f"{sys_uri}/Actions/ComputerSystem.Reset"
        allowed = reset.get("ResetType@Redfish.AllowableValues")
        kind = "ForceRestart" if system.get("PowerState") == "On" else "On"
        if allowed and kind not in allowed:
            kind = "PowerCycle" if kind == "ForceRestart" and "PowerCycle" in allowed else "ForceOn"
        await self.request("POST", target, {"ResetType": kind})
        return kind

    async def wait_power_on(self) -> None:
        sys_uri = await self.system_uri()
        deadline = time.monotonic() + self.ep.power_deadline
        while True:
            if (await self.get(sys_uri)).get("PowerState") == "On":
                return
            if time.monotonic() > deadline:
                raise UpstreamError(
                    f"BMC {self.ep.bmc_ip}: power did not come on within {self.ep.power_deadline}s"
                )
            await asyncio.sleep(0.5)


class _TransientBMCError(Exception):
    """A BMC answer worth retrying (never leaves this module: becomes UpstreamError).

    ``unreached``: no connection was made (a probe gives up on those sooner).
    """

    def __init__(self, message: str, *, unreached: bool = False) -> None:
        super().__init__(message)
        self.unreached = unreached


class _ClientError(KariosError):
    """A 4xx from the BMC (not retried)."""

    code = "BMC_REJECTED"
    http_status = 502

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
