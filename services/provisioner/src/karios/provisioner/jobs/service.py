"""The job service: one use case per method, each a few lines over the repository, the BMC
accessor, the install methods and the media builder.

Worker phase (queued → building_media → mounting → booting, :mod:`worker`) is owned through a
lease in the job row, not by the start command: the command is acked once the row exists, and
the replica that holds the lease (``owner``; ``job_leases``, renewed by a heartbeat) does the
work. A replica that dies stops renewing; any replica's claim sweep (``SELECT … FOR UPDATE SKIP
LOCKED``) then takes the job and resumes it from its recorded state: the medium is rebuilt
(same token, kept encrypted in the row), eject/insert and the boot override are repeated
(idempotent), and the power reset is sent only by the replica whose ``mounting → booting``
transition committed under the row lock with its ownership checked — the state machine allows
that move once per job, so a machine is reset at most once per job. Installer reports are in
:mod:`callbacks`. Every job that ends (any terminal state) loses its medium, and a job that got
as far as the BMC leaves it clean (medium ejected, boot override cleared).
See docs/provisioning.md "Restarts and replicas".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import stamina
from opentelemetry import trace

from karios.common.bus.envelope import correlation_scope, current_correlation
from karios.common.bus.runtime import Bus
from karios.common.contracts.images import ImageView
from karios.common.contracts.provision import (
    Admission,
    CallbackRequestV2,
    CancelJob,
    ImageInfo,
    ImageQuery,
    JobProgress,
    JobRequestQuery,
    JobRequestView,
    JobView,
    ProvisionSpec,
    QueueEntry,
    StartProvision,
    job_token_hash,
)
from karios.common.crypto import SecretBox
from karios.common.db import Database
from karios.common.errors import (
    Conflict,
    KariosError,
    NotFound,
    PermanentFailure,
    ServiceUnavailable,
    ValidationFailed,
)
from karios.common.provisioning import refuse_second_job, resolve_pool_backend
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import current_traceparent, get_logger
from karios.common.telemetry_http import trace_http_client
from karios.common.telemetry_tracing import bmc_span_attributes, job_binding, job_span
from karios.provisioner import metrics
from karios.provisioner.bmc import BmcAccessor, driver_of, leave_clean, serial_console_for
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.drivers import RedfishDriver
from karios.provisioner.install import InstallMethod
from karios.provisioner.install.registry import install_methods, method_for
from karios.provisioner.jobs import admitter, callbacks, upkeep, worker
from karios.provisioner.jobs.hostctx import host_context
from karios.provisioner.jobs.repository import JobCancelled, JobRepository, LeaseLost, now
from karios.provisioner.media import MediaBuilder
from karios.provisioner.media.access import MediaAccess
from karios.provisioner.media.signing import MediaUrlSigner
from karios.provisioner.models import Job
from karios.provisioner.statemachine import INFO, WORKER_STATES, State, end_log_level, is_terminal

log = get_logger(__name__)


def _log_end(job: Job, previous: State, level: str) -> None:
    """One line per job end (completed / failed / cancelled / stuck) with its reason."""
    created = job.created_at
    took = (now() - created).total_seconds() if created is not None else None
    getattr(log, level)(
        "job ended",
        job_id=job.id,
        bmc_ip=job.bmc_ip,
        outcome=job.state,
        reason=job.message[:500],
        job_type=job.job_type,
        vendor=job.vendor,
        previous=previous.value,
        duration_s=round(took, 1) if took is not None else None,
    )


TRACER = "karios.provisioner"
# States in which the BMC may hold our medium and boot override: a job ending there cleans it.
AT_THE_BMC = frozenset({State.mounting, State.booting, State.installing, State.first_boot, State.stuck})

__all__ = ["JobService", "LeaseLost", "replica_id", "token_hash"]


def token_hash(token: str) -> str:
    """The job token as stored (and as the gateway sends it on the bus): its SHA-256."""
    return job_token_hash(token)


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class JobService:
    bus: Bus
    db: Database
    box: SecretBox
    cfg: ProvisionerConfig
    media: MediaBuilder
    driver_factory: Any = None  # (vendor class, endpoint) -> RedfishDriver; tests may wrap it
    methods: dict[str, InstallMethod] = field(default_factory=dict)  # default: install_methods(cfg)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    mounts: int = 0  # successful mounts (observed by tests)
    replica: str = field(default_factory=replica_id)  # this worker's lease owner name
    release_on_stop: bool = True  # hand leases back at a graceful stop (tests emulate a crash)
    # gate + reset of a job, shielded from cancellation: a stop lets a started reset finish
    resetting: dict[str, asyncio.Task[str]] = field(default_factory=dict)
    cleanups: set[asyncio.Task[None]] = field(default_factory=set)  # BMC cleanups in flight
    firmware: Any = None  # held firmware updates run before the install (app.py: FirmwareUpdates)
    catalog: Any = None  # the OS image catalog's store (app.py: ImageStore): a request's `image`

    def __post_init__(self) -> None:
        self.methods = self.methods or install_methods(self.cfg)
        self.repo = JobRepository(self.db, self.cfg, self.replica)
        self.bmcs = BmcAccessor(self.bus, self.box, self.cfg)
        self.build_sem = asyncio.Semaphore(self.cfg.build_concurrency)
        self.bmc_sem = asyncio.Semaphore(self.cfg.bmc_concurrency)
        self.subnet_sems: dict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(self.cfg.bmc_per_subnet)
        )
        self.admitter = admitter.Admitter(self)  # admission control: see admission.py
        # GET /media/<job>.iso: a signed, expiring URL of a job that still consumes its medium
        self.media_access = MediaAccess(MediaUrlSigner.from_box(self.box), self.repo.state_of)
        self._prepared: set[tuple[str, str]] = set()
        self._prepare_lock = asyncio.Lock()

    # -- shared steps: load, move (+ event, + end of job), checks ---------------------------
    async def load(self, job_id: str) -> Job:
        return await self.repo.load(job_id)

    async def emit(
        self, job: Job, message: str = "", percent: int | None = None, fact: str | None = None
    ) -> None:
        info = INFO[State(job.state)]
        ev = JobProgress(
            job_id=job.id,
            bmc_ip=job.bmc_ip,
            job_type=job.job_type,
            parent_id=job.parent_id,
            state=job.state,
            status=info.status,
            stage=info.stage,
            percent=job.percent if percent is None else percent,
            message=message or job.message,
            node_ip=job.os_ip,
            resource_name=job.hostname,
            attempt=max(1, job.attempts or 1),
            log_tail=list(job.log_tail or []),
        )
        subject = self.bus.subjects.evt("provision", fact or f"job.{job.state}", job.id)
        # The transition is committed: its event must follow, across a bus outage too (the gateway's
        # job view is built from it). One Nats-Msg-Id for every try: JetStream drops a repeat.
        msg_id = str(uuid.uuid4())
        async for attempt in stamina.retry_context(
            on=ServiceUnavailable, attempts=None, timeout=None, wait_max=2.0
        ):
            with attempt:
                await self.bus.publish_event(ev, subject, entity=job.id, msg_id=msg_id)

    async def move(
        self,
        job_id: str,
        target: State,
        message: str = "",
        *,
        percent: int | None = None,
        fact: str | None = None,
        owned: bool = False,
        guard: Callable[[Job], None] | None = None,
        **values: Any,
    ) -> Job:
        """Apply one transition of the table (409 if forbidden), emit its event, and end the job
        (medium removed, BMC left clean) when the new state is terminal.

        ``owned``: a worker step; only the lease owner may make it (:class:`LeaseLost` otherwise).
        ``guard``: checks the row under its lock before the move (raises to refuse it).
        """
        moved = await self.repo.move(
            job_id, target, message, percent=percent, owned=owned, values=values, guard=guard
        )
        j = moved.job
        metrics.job_moved(j.job_type, j.vendor, j.state, moved.previous, j.created_at)
        if (level := end_log_level(j.state, moved.previous)) is not None:
            _log_end(j, moved.previous, level)
        await self.emit(moved.job, fact=fact)
        if moved.previous in WORKER_STATES and j.state not in WORKER_STATES:
            self.admitter.poke()  # an admission slot is free
        if is_terminal(moved.job.state):
            self.media_access.forget(job_id)
            self.media.remove(job_id)
            if moved.previous in AT_THE_BMC:
                self._track(self.cleanup_bmc(moved.job), f"cleanup-{job_id}")
        return moved.job

    async def check(self, job_id: str) -> Job:
        return self.verify(await self.load(job_id))

    def media_url(self, job_id: str) -> str:
        """The signed URL of the job's medium the BMC is given: it expires at the stage deadline
        (the medium is read while booting; the job is ``stuck`` past that deadline anyway)."""
        return self.media_access.url(self.cfg.media_url, job_id, self.cfg.stage_deadline)

    def verify(self, job: Job) -> Job:
        """A worker may go on with ``job`` (as just read): not cancelled, and ours."""
        if job.state == State.cancelled:
            raise JobCancelled(job.id)
        if job.owner != self.replica and not is_terminal(job.state):
            raise LeaseLost(f"job {job.id} is owned by {job.owner or 'nobody'}")
        return job

    async def is_cancelled(self, job_id: str) -> bool:
        try:
            return (await self.load(job_id)).state == State.cancelled
        except KariosError:
            return False

    async def fail(self, job_id: str, message: str) -> None:
        try:
            await self.move(job_id, State.failed, message, owned=True)
        except LeaseLost:
            return  # the job is another replica's now: its medium may be the one in use
        except (Conflict, NotFound, JobCancelled):
            self.media.remove(job_id)  # ended meanwhile (e.g. cancelled while we were building)

    async def job_token(self, job: Job) -> str:
        """The installer token the medium embeds; the same on every (re)build of the medium."""
        if job.token_enc:
            return self.box.decrypt(job.token_enc, context=f"job-token:{job.id}")
        # A row from before tokens were kept: mint a new one (no medium has been booted yet).
        token = secrets.token_urlsafe(24)
        enc = self.box.encrypt(token, context=f"job-token:{job.id}")
        await self.repo.set_token(job.id, token_hash(token), enc)
        return token

    def spawn(self, job_id: str) -> None:
        """Work the job here, unless a task of this replica already does (the start command and a
        claim sweep can both hand it over, e.g. when the start's event waited out a bus outage)."""
        running = self.tasks.get(job_id)
        if running is not None and not running.done():
            return
        self.tasks[job_id] = asyncio.create_task(self._run_traced(job_id), name=f"job-{job_id}")

    async def _run_traced(self, job_id: str) -> None:
        """The worker phase as one span of the job's trace (its logs carry job_id and bmc_ip)."""
        job = await self._job_or_none(job_id)
        tp = job.spec.get("traceparent") if job is not None else None
        cid = job.spec.get("correlationid") if job is not None else None
        with (
            correlation_scope(cid),
            job_span(TRACER, "provision.job.run", tp, bind=job_binding(job_id, job)),
        ):
            await worker.run(self, job_id, job)  # the row just read: the worker checks it

    # -- use case: start ----------------------------------------------------------------
    async def handle_start(self, cmd: StartProvision) -> None:
        """Record the job (a redelivered command is a no-op) and start working it under our lease.

        The command is acked when this returns: from then on the row is the job's durable
        record and the lease decides who works it (a crash → another replica resumes it).
        """
        token = secrets.token_urlsafe(24)
        method = method_for(self.methods, cmd.job_type, cmd.spec.install_method, self.cfg.install_method)
        row = {
            "id": cmd.job_id,
            "job_type": cmd.job_type,
            "parent_id": cmd.parent_id,
            "bmc_ip": cmd.spec.bmc_ip,
            "vendor": cmd.spec.vendor,
            "hostname": cmd.spec.hostname,
            "state": State.queued.value,
            "message": "Queued",
            "percent": 0,
            "token_hash": token_hash(token),
            "token_enc": self.box.encrypt(token, context=f"job-token:{cmd.job_id}"),
            "owner": self.replica,
            "attempts": 1,
            "os_ip": "",
            "method": method,
            "spec": {
                **cmd.model_dump(mode="json"),
                "traceparent": current_traceparent(),
                "correlationid": current_correlation(),  # the user action, for a resumed job too
            },
            "created_at": now(),
            "updated_at": now(),
        }
        created, other = await self.repo.insert(row)
        if not created:
            log.info("duplicate start command ignored", job_id=cmd.job_id)
            return
        await self.emit(Job(**row))  # the row as inserted: its event needs no read back
        metrics.job_moved(cmd.job_type, cmd.spec.vendor, "queued", "", None)
        try:
            refuse_second_job(cmd.spec.bmc_ip, other)
        except Conflict as exc:
            await self.move(cmd.job_id, State.failed, exc.message)
            return
        # A firmware update being flashed now: a reset or a medium would hit the BMC mid-flash
        # (an update held for this install is not "now": the job runs it itself).
        flashing = await self.firmware.store.active(cmd.spec.bmc_ip) if self.firmware is not None else None
        if flashing is not None:
            await self.move(
                cmd.job_id,
                State.failed,
                f"bmc_ip: firmware update {flashing} is running on BMC {cmd.spec.bmc_ip}; "
                "provision when it has ended (GET /controlnode/bmc/{ip}/firmware-updates/{id})",
            )
            return
        self.spawn(cmd.job_id)

    async def build_medium(self, cmd: StartProvision, token: str, job: Job | None = None) -> None:
        """Render the job's install method for this host into its medium's slot (the base ISO is
        shared). ``job``: its row, if the caller has it (its install method is fixed at insert)."""
        job = job if job is not None else await self.load(cmd.job_id)
        name = job.method or method_for(self.methods, cmd.job_type, cmd.spec.install_method, "preseed")
        method = self.methods.get(name)
        if method is None:
            raise PermanentFailure(
                f"install_method: {name!r} is not installed on this provisioner "
                f"(available: {', '.join(sorted(self.methods))})"
            )
        ctx = await host_context(self.bus, self.box, self.cfg, cmd, token, method, await self._image(cmd))
        await self._prepare(method, ctx.major, ctx.suite)
        t0 = time.perf_counter()
        with trace.get_tracer(TRACER).start_as_current_span("provision.media.build") as span:
            medium = await asyncio.to_thread(method.medium, ctx)
            await self.media.build_async(cmd.job_id, medium, serial_console_for(self.cfg, cmd.spec.vendor))
            served = self.media.open(cmd.job_id)
            size = served.size if served is not None else 0  # the medium's length as served
            span.set_attributes({"karios.install_method": name, "karios.media.bytes": size})
        metrics.medium_built(name, t0, size)

    async def _image(self, cmd: StartProvision) -> ImageView | None:
        """The catalog image the request names, ready (None: Karios's own image). Checked by the
        gateway before the 202; here again, as it may have been deleted or failed since."""
        name = cmd.spec.image
        if not name or cmd.job_type != "provision":
            return None
        view = await self.catalog.get(name) if self.catalog is not None else None
        if view is None:
            raise PermanentFailure(
                f"image: no image named {name!r} in the catalog (deleted since the request?)"
            )
        if view.state != "ready" or not view.path:
            raise PermanentFailure(f"image: {name} is {view.state}, not ready: {view.message}")
        return view

    async def _prepare(self, method: InstallMethod, major: str, suite: str) -> None:
        """A method's base artifacts of one release, prepared once per process (cached on disk)."""
        key = (method.name, major)
        if key in self._prepared:
            return
        async with self._prepare_lock:
            if key not in self._prepared:
                await asyncio.to_thread(method.prepare, major, suite)
                self._prepared.add(key)

    async def driver(self, cmd: StartProvision, *, probe: bool = False) -> RedfishDriver:
        drv = driver_of(self.driver_factory, cmd, await self.bmcs.endpoint(cmd, probe=probe))
        metrics.meter_bmc(getattr(drv, "client", None), cmd.spec.vendor)
        trace_http_client(
            getattr(drv, "client", None),
            template=metrics.redfish_route_template,
            **bmc_span_attributes(cmd.spec.vendor, cmd.spec.bmc_ip),
        )
        return drv

    async def cleanup_bmc(self, job: Job) -> None:
        """Leave the BMC clean: eject our medium, clear the boot override (best effort, logged)."""
        try:
            await leave_clean(await self.driver(StartProvision.model_validate(job.spec)), job.id)
        except Exception as exc:
            log.warning("BMC cleanup failed", job_id=job.id, error=str(exc)[:300])

    # -- use cases: installer reports (see callbacks) -------------------------------------
    async def step(self, req: CallbackRequestV2) -> JobView:
        with await self._callback_span("provision.installer.step", req.job_id):
            return await callbacks.step(self, req)

    async def complete(self, req: CallbackRequestV2) -> JobView:
        with await self._callback_span("provision.installer.complete", req.job_id):
            return await callbacks.complete(self, req)

    async def _callback_span(self, name: str, job_id: str) -> Any:
        """An installer report: a span of its own request, linked to the job's trace."""
        job = await self._job_or_none(job_id) if job_id else None
        tp = job.spec.get("traceparent") if job is not None else None
        return job_span(TRACER, name, tp, link=True, bind=job_binding(job_id, job))

    async def _job_or_none(self, job_id: str) -> Job | None:
        """The row for a span's context only: a miss or a database error never stops the work."""
        with contextlib.suppress(Exception):
            return await self.repo.load(job_id)
        return None

    async def firstboot(self, req: CallbackRequestV2) -> JobView:
        return await callbacks.firstboot(self, req)

    # -- use case: cancel ---------------------------------------------------------------
    async def cancel(self, req: CancelJob) -> JobView:
        job = await self.load(req.job_id)
        if job.state == State.cancelled:
            return callbacks.view(job)
        was = State(job.state)
        job = await self.move(job.id, State.cancelled, "cancelled by operator")
        task = self.tasks.pop(job.id, None)
        if task is not None:
            task.cancel()
            if was == State.mounting:  # an insert in flight may land after move()'s cleanup
                self._track(self._clean_after(task, job), f"cleanup-{job.id}-after-worker")
        return callbacks.view(job)

    async def _clean_after(self, worker_task: asyncio.Task[None], job: Job) -> None:
        await asyncio.wait({worker_task})  # never raises the worker's outcome
        await self.cleanup_bmc(job)

    def _track(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.cleanups.add(task)
        task.add_done_callback(self.cleanups.discard)

    # -- use cases: queue, stuck sweep ----------------------------------------------------
    async def queue(self) -> list[QueueEntry]:
        return await admitter.queue(self)

    async def admission(self) -> Admission:
        return (await admitter.admission(self))[0]

    async def image_info(self, q: ImageQuery) -> ImageInfo:
        """The installed size of the image a provision would write (its manifest; the image
        method measures an archive built before manifests once), for the gateway's disk-size
        check. None when unknown: no image built for the suite, or a method without one."""
        name = method_for(self.methods, "provision", q.install_method, self.cfg.install_method)
        measure = getattr(self.methods.get(name), "installed_bytes", None)
        size = await asyncio.to_thread(measure, q.suite) if measure is not None else None
        return ImageInfo(method=name, suite=q.suite, installed_bytes=size)

    async def job_request(self, q: JobRequestQuery) -> JobRequestView:
        """What job ``q.job_id`` was asked to do, its secrets left out (404: no such job)."""
        job = await self.repo.load(q.job_id)
        stored = (job.spec or {}).get("spec")  # the row keeps the StartProvision command's dump
        if not stored:
            known = {"vendor": job.vendor, "hostname": job.hostname, "method": job.method}
            return JobRequestView(job_id=job.id, job_type=job.job_type, bmc_ip=job.bmc_ip, **known)
        spec = ProvisionSpec.model_validate(stored)
        requested = spec.install_method or ""
        method = job.method or method_for(self.methods, job.job_type, requested, self.cfg.install_method)
        return JobRequestView(
            **spec.model_dump(
                include=set(JobRequestView.model_fields) - {"install_method", "method", "pool_backend"}
            ),
            pool_backend=_backend_of(spec, method),
            job_id=job.id,
            job_type=job.job_type,
            install_method=requested,
            method=method,
            has_os_password=bool(spec.os_password_enc),
            has_root_pass=bool(spec.root_pass_enc),
        )

    async def check_stuck(self) -> int:
        return await upkeep.check_stuck(self)

    async def stuck_loop(self) -> None:
        await upkeep.stuck_loop(self)

    # -- use case: lease upkeep (heartbeat, claim sweep, graceful hand-over: see upkeep) ----
    async def heartbeat(self) -> list[str]:
        return await upkeep.heartbeat(self)

    async def claim_expired(self, limit: int | None = None) -> list[tuple[str, int]]:
        return await self.repo.claim_expired(limit or self.cfg.claim_batch)

    async def resume_expired(self) -> list[str]:
        return await upkeep.resume_expired(self)

    async def lease_loop(self) -> None:
        await upkeep.lease_loop(self)

    async def stop(self, grace: float = 15.0) -> None:
        """Stop working: a power reset in flight is allowed to finish, everything else is
        cancelled, and (graceful stop) our leases are handed back so another replica resumes
        the jobs at once instead of after the lease expires."""
        await self.admitter.stop()
        await cancel_and_wait(*self.tasks.values(), grace=5.0)  # a job may end a BMC session
        waiting = [g for g in self.resetting.values() if not g.done()] + list(self.cleanups)
        if waiting:  # shielded: a reset already decided is sent, not cut in half
            await asyncio.wait(waiting, timeout=grace)
        self.resetting.clear()
        if self.release_on_stop:
            with contextlib.suppress(Exception):
                await self.repo.release_leases()


def _backend_of(spec: ProvisionSpec, method: str) -> str:
    """The pool backend job ``spec`` uses with ``method`` ("" for a wipe or one it would refuse)."""
    if method not in ("image", "preseed"):
        return ""
    try:
        return resolve_pool_backend(
            spec.pool_backend, spec.pool_type, method, catalog_archive=bool(spec.image)
        )
    except ValidationFailed:
        return spec.pool_backend or ""
