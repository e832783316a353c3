"""Firmware update use cases: start (refuse or record, answer at once), run, read.

A run, each step recorded on the update and announced (``firmware.progress``):

1. ``verifying``: the image's sha256 — a registered image from its file, a URL by reading it
   through (the BMC is never given an image whose checksum does not match);
2. the BMC: its UpdateService, the versions before (FirmwareInventory, else the targets' own
   versions), the plan (``core.plan_update``: SimpleUpdate / multipart push, apply time);
3. ``transferring`` → ``running``: the action sent, the returned Task (Location header, else the
   Task in the answer) polled every ``poll_interval`` until it ends, or ``timeout_s``;
4. the versions read back → per-component results; ``succeeded`` / ``failed`` / ``timed_out``.

Refused with 409 while a provision job (any state but an end state) or another update uses the
BMC. An update whose provisioner died is failed by the next start (``abandon_stale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from karios.common.bus.runtime import Bus
from karios.common.contracts.firmware import (
    FIRMWARE_TERMINAL,
    FirmwareBeforeInstallFailed,
    FirmwareUpdateNotFound,
    FirmwareUpdateProgress,
    FirmwareUpdateQuery,
    FirmwareUpdateRefused,
    FirmwareUpdateView,
    StartFirmwareUpdate,
)
from karios.common.contracts.inventory import BmcAccess, BmcAccessQuery
from karios.common.db import Database
from karios.common.errors import KariosError, ValidationFailed
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.provisioner.bmc import BmcAccessor
from karios.provisioner.drivers import RedfishDriver, driver_for
from karios.provisioner.firmware import bmc as redfish
from karios.provisioner.firmware.core import (
    MAX_MESSAGES,
    UpdateNotPossible,
    component_results,
    plan_update,
    read_task,
    task_percent,
    verdict,
)
from karios.provisioner.firmware.store import FirmwareStore
from karios.provisioner.inspect.service import target
from karios.provisioner.jobs.repository import running_job_on

log = get_logger(__name__)
STALE_AFTER = timedelta(minutes=5)  # an active update nobody touched for this long lost its replica
CHUNK = 1 << 20
MAX_IMAGE_BYTES = 4 << 30  # a download larger than any firmware image is refused, not stored


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class FirmwareUpdates:
    bus: Bus
    db: Database
    bmcs: BmcAccessor
    store: FirmwareStore
    image_base_url: str  # where BMCs fetch /images/ from (the provisioner's media URL)
    resolve_image: Callable[[str], Path | None]  # a registered image's file, or None
    driver_factory: Any = None
    poll_interval: float = 2.0
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # -- start ------------------------------------------------------------------------------
    async def start(self, q: StartFirmwareUpdate) -> FirmwareUpdateView:
        image_url = self._image_url(q)
        held = q.when == "before_next_install"
        async with self._lock:  # one check-then-insert at a time on this replica
            await self.store.abandon_stale(STALE_AFTER)
            if not held:  # a held update waits for the next provision job: nothing to refuse
                await self._refuse_busy(q.bmc_ip)
            now = _now()
            view = FirmwareUpdateView(
                id=str(uuid.uuid4()),
                bmc_ip=q.bmc_ip,
                state="held" if held else "queued",
                image_url=image_url,
                image=q.image,
                sha256=q.sha256,
                targets=list(q.targets),
                apply_time=q.apply_time,
                timeout_s=q.timeout_s,
                when=q.when,
                requested_by=q.requested_by,
                created_at=now,
                updated_at=now,
            )
            await self.store.insert(view)
        if not held:
            task = asyncio.create_task(self._run(view))
            self._tasks[view.id] = task
            task.add_done_callback(lambda _t: self._tasks.pop(view.id, None))
        log.info(
            "firmware update recorded",
            bmc_ip=q.bmc_ip,
            update_id=view.id,
            state=view.state,
            by=q.requested_by,
        )
        return view

    async def before_install(self, bmc_ip: str, job_id: str) -> int:
        """The policy "firmware before the install, in the same maintenance window": run the BMC's
        held updates, oldest first, for provision job ``job_id`` (its worker calls this after the
        BMC check, before the medium). Raises :class:`FirmwareBeforeInstallFailed` (the job fails,
        nothing installed) unless each succeeded. Returns how many ran."""
        held = await self.store.held(bmc_ip)
        for view in held:
            view.provision_job_id = job_id
            await self._move(view, f"run for provision job {job_id}, before its install", state="queued")
            await self._run(view)
            if view.state != "succeeded":
                raise FirmwareBeforeInstallFailed(
                    f"firmware update {view.id} (held for this install) ended {view.state}: {view.error}"[
                        :500
                    ],
                    details={"update_id": view.id},
                )
        return len(held)

    def _image_url(self, q: StartFirmwareUpdate) -> str:
        if bool(q.image) == bool(q.image_url):
            raise ValidationFailed("image_url: give exactly one of image_url and image", field="image_url")
        if q.image:
            if self.resolve_image(q.image) is None:
                raise ValidationFailed(
                    f"image: no image {q.image!r} under the images directory", field="image"
                )
            return f"{self.image_base_url.rstrip('/')}/images/{q.image}"
        parts = urlsplit(q.image_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValidationFailed("image_url: an http:// or https:// URL", field="image_url")
        return q.image_url

    async def _refuse_busy(self, ip: str) -> None:
        running = await running_job_on(self.db, ip)
        if running is not None:
            raise FirmwareUpdateRefused(
                f"bmc_ip: provision job {running} uses BMC {ip}; update its firmware when the job has ended",
                field="bmc_ip",
                details={"job_id": running, "reason": "provision_job"},
            )
        active = await self.store.active(ip)
        if active is not None:
            raise FirmwareUpdateRefused(
                f"bmc_ip: firmware update {active} of BMC {ip} has not ended",
                field="bmc_ip",
                details={"update_id": active, "reason": "firmware_update"},
            )

    # -- read -------------------------------------------------------------------------------
    async def get(self, q: FirmwareUpdateQuery) -> FirmwareUpdateView:
        view = await self.store.get(q.update_id)
        if view is not None and view.state not in (*FIRMWARE_TERMINAL, "held"):
            age = datetime.now(UTC) - datetime.fromisoformat(view.updated_at)
            if age > STALE_AFTER and await self.store.abandon_stale(STALE_AFTER):
                view = await self.store.get(q.update_id)  # its replica died: failed, saying so
        if view is None or (q.bmc_ip and view.bmc_ip != q.bmc_ip):
            raise FirmwareUpdateNotFound(f"update_id: no firmware update {q.update_id}", field="update_id")
        return view

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks.values())

    # -- run --------------------------------------------------------------------------------
    async def _move(self, view: FirmwareUpdateView, message: str = "", **changes: Any) -> None:
        for key, value in changes.items():
            setattr(view, key, value)
        if message:
            view.messages = [*view.messages, message][-MAX_MESSAGES:]
        view.updated_at = _now()
        if view.state in FIRMWARE_TERMINAL:
            view.finished_at = view.updated_at
        await self.store.save(view)
        await self.bus.publish_event(
            FirmwareUpdateProgress(
                job_id=view.id,
                bmc_ip=view.bmc_ip,
                state=view.state,
                percent=view.percent,
                task_state=view.task_state,
                message=message or view.error,
                components=view.components if view.state in FIRMWARE_TERMINAL else [],
            ),
            self.bus.subjects.evt("provision", "firmware.progress", view.bmc_ip),
            entity=view.bmc_ip,
        )

    async def _run(self, view: FirmwareUpdateView) -> None:
        scratch: list[Path] = []  # a downloaded image, removed whatever the outcome
        try:
            await self._execute(view, scratch)
        except (KariosError, UpdateNotPossible) as exc:
            await self._move(view, state="failed", error=str(exc)[:500])
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the database or the bus may be stopping too
                await asyncio.shield(
                    self._move(view, state="failed", error="the provisioner stopped during the update")
                )
            raise
        except Exception as exc:  # a bug must still end the update, never leave it active
            log.exception("firmware update crashed", update_id=view.id)
            await self._move(view, state="failed", error=f"internal error: {type(exc).__name__}")
        finally:
            for path in scratch:
                path.unlink(missing_ok=True)
        log.info("firmware update ended", update_id=view.id, bmc_ip=view.bmc_ip, state=view.state)

    async def _execute(self, view: FirmwareUpdateView, scratch: list[Path]) -> None:
        await self._move(view, f"checking the image's sha256 ({view.image_url})", state="verifying")
        registered = self.resolve_image(view.image) if view.image else None
        local = registered
        if local is None:
            local = await self._download(view.image_url)
            scratch.append(local)
        digest = await asyncio.to_thread(_sha256_of, local)
        if digest != view.sha256:
            raise UpdateNotPossible(
                f"sha256: the image hashes to {digest}, not {view.sha256}; the BMC was not given it"
            )

        vendor = await self._vendor(view.bmc_ip)
        ep = await self.bmcs.endpoint(target(view.bmc_ip, vendor))
        cls = driver_for(vendor) if vendor else RedfishDriver
        drv: RedfishDriver = self.driver_factory(cls, ep) if self.driver_factory else cls(ep)
        async with drv:
            service = await redfish.update_service(drv)
            plan = plan_update(
                service,
                drv.quirks,
                image_url=view.image_url,
                targets=view.targets,
                apply_time=view.apply_time,
            )
            before = await redfish.read_versions(drv, service, view.targets)
            await self._move(
                view,
                f"sending the image by {plan.method} to {plan.target}",
                state="transferring",
                method=plan.method,
            )
            status, task_uri, answer = await redfish.send(
                drv, plan, local if plan.method == "multipart_push" else None
            )
            await self._move(
                view,
                f"the BMC answered HTTP {status}" + (f"; task {task_uri}" if task_uri else ""),
                state="running",
                task_uri=task_uri,
            )
            ok, timed_out = await self._follow(drv, view, task_uri, status, answer, view.timeout_s)
            after = await redfish.read_versions(drv, service, view.targets)
        pending = plan.apply_time_sent == "OnReset"
        view.components = component_results(before, after, view.targets, pending_reset=pending)
        if timed_out:
            await self._move(
                view, state="timed_out", error=f"the BMC's task did not end within {view.timeout_s}s"
            )
        elif not ok:
            await self._move(view, state="failed", error=f"the BMC's task ended in {view.task_state}")
        else:
            warning = verdict(view.components, view.targets, pending_reset=pending)
            await self._move(view, warning, state="succeeded", percent=100)

    async def _follow(
        self,
        drv: RedfishDriver,
        view: FirmwareUpdateView,
        task_uri: str,
        status: int,
        answer: dict[str, Any],
        timeout_s: int,
    ) -> tuple[bool, bool]:
        """Poll the task until it ends: (ok, timed out). No task (a 200/204 without one): done."""
        if not task_uri:
            reading = read_task(status, answer)
            await self._move(view, *reading.messages[-1:], task_state=reading.state)
            return reading.ok, False
        deadline = time.monotonic() + timeout_s
        seen: set[str] = set()  # a BMC may keep its messages, or replace them, between two reads
        task_resource = ""
        while True:
            code, body = await redfish.poll(drv, task_uri)
            if code == 410 and task_resource and task_resource != task_uri:
                task_uri = task_resource  # the monitor is gone; the Task resource stays
                continue
            reading = read_task(200 if code == 410 else code, body)
            task_resource = task_resource or str(body.get("@odata.id") or "")
            new = [m for m in dict.fromkeys(reading.messages) if m not in seen]
            seen.update(new)
            pct = task_percent(reading, view.percent)
            if new or reading.state != view.task_state or pct != view.percent:
                view.messages = [*view.messages, *new[:-1]][-MAX_MESSAGES:]  # each kept; the last announced
                await self._move(view, new[-1] if new else "", task_state=reading.state, percent=pct)
            else:
                view.updated_at = _now()
                await self.store.save(view)  # the heartbeat that keeps abandon_stale away
            if reading.done:
                return reading.ok, False
            if time.monotonic() > deadline:
                return False, True
            await asyncio.sleep(self.poll_interval)

    async def _download(self, url: str) -> Path:
        """The image at ``url`` into a temporary file (hashed, and pushed by a multipart update)."""
        return await asyncio.to_thread(_download, url)

    async def _vendor(self, ip: str) -> str:
        """The registry's vendor of the BMC ('' unknown: the generic driver)."""
        with contextlib.suppress(KariosError):
            access = await self.bus.request(
                self.bus.subjects.query("inventory", "bmc_access"),
                BmcAccessQuery(bmc_ip=ip),
                timeout=2.0,
                reply=BmcAccess,
            )
            return access.vendor.strip().lower()
        return ""


def _download(url: str) -> Path:
    fd, name = tempfile.mkstemp(prefix="karios-fw-")
    path = Path(name)
    try:
        with (
            open(fd, "wb", closefd=True) as fh,
            httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True) as client,
            client.stream("GET", url) as r,
        ):
            if r.status_code >= 400:
                raise UpdateNotPossible(f"image_url: fetching the image answered HTTP {r.status_code}")
            got = 0
            for chunk in r.iter_bytes(CHUNK):
                got += len(chunk)
                if got > MAX_IMAGE_BYTES:
                    raise UpdateNotPossible(
                        f"image_url: the image is larger than {MAX_IMAGE_BYTES >> 30} GiB"
                    )
                fh.write(chunk)
    except httpx.HTTPError as exc:
        path.unlink(missing_ok=True)
        raise UpdateNotPossible(f"image_url: the image could not be fetched ({type(exc).__name__})") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def wire_firmware(bus: Bus, svc: FirmwareUpdates) -> None:
    bus.query_responder(
        bus.subjects.request("provision", "start_firmware_update"), StartFirmwareUpdate, svc.start
    )
    bus.query_responder(bus.subjects.query("provision", "firmware_update"), FirmwareUpdateQuery, svc.get)
