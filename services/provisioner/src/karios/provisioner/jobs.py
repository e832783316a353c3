"""Job orchestration: admission, media build, BMC mount/boot, installer callbacks, stuck detection.

Worker phase (queued → building_media → mounting → booting) is owned through a lease in the job
row, not by the start command: the command is acked once the row exists, and the replica that
holds the lease (``owner``, ``lease_until``, renewed by a heartbeat) does the work. A replica
that dies stops renewing; any replica's claim sweep (``SELECT … FOR UPDATE SKIP LOCKED``) then
takes the job and resumes it from its recorded state: the medium is rebuilt (same token, kept
encrypted in the row), eject/insert and the boot override are repeated (idempotent), and the
power reset is sent only by the replica whose ``mounting → booting`` transition committed under
the row lock with its ownership checked — the state machine allows that move once per job, so a
machine is reset at most once per job. See docs/provisioning.md "Restarts and replicas".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import (
    AllocateIp,
    BmcAccess,
    BmcAccessQuery,
    IpAllocation,
    RegisterNode,
)
from karios.common.contracts.provision import (
    CallbackRequest,
    CancelJob,
    JobProgress,
    JobView,
    QueueEntry,
    StartProvision,
)
from karios.common.crypto import SecretBox
from karios.common.db import Database
from karios.common.errors import Conflict, KariosError, NotFound, ServiceUnavailable, Unauthorized
from karios.common.telemetry import get_logger
from karios.provisioner import preseed
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.drivers import BmcEndpoint, RedfishDriver, driver_for
from karios.provisioner.media import MediaBuilder, debian_release
from karios.provisioner.models import Job
from karios.provisioner.statemachine import INFO, WORKER_STATES, State, is_terminal, transition

log = get_logger(__name__)
T = Job.__table__  # type: ignore[attr-defined]


def _now() -> datetime:
    return datetime.now(UTC)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def subnet_of(ip: str) -> str:
    try:
        return str(ipaddress.ip_network(f"{ip}/24", strict=False))
    except ValueError:
        return ip


class JobCancelled(Exception):
    pass


class LeaseLost(Exception):
    """Another replica owns the job now (our lease expired): stop without touching the BMC."""


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


_WORK = [s.value for s in WORKER_STATES]


@dataclass
class JobService:
    bus: Bus
    db: Database
    box: SecretBox
    cfg: ProvisionerConfig
    media: MediaBuilder
    driver_factory: Any = None  # (vendor, endpoint) -> RedfishDriver; tests may wrap it
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    mounts: int = 0  # successful mounts (observed by tests)
    replica: str = field(default_factory=replica_id)  # this worker's lease owner name
    release_on_stop: bool = True  # hand leases back at a graceful stop (tests emulate a crash)
    # gate + reset of a job, shielded from cancellation: a stop lets a started reset finish
    resetting: dict[str, asyncio.Task[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.build_sem = asyncio.Semaphore(self.cfg.build_concurrency)
        self.bmc_sem = asyncio.Semaphore(self.cfg.bmc_concurrency)
        self.subnet_sems: dict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(self.cfg.bmc_per_subnet)
        )

    # -- persistence + events -----------------------------------------------------------
    async def load(self, job_id: str) -> Job:
        async with self.db.session() as s:
            job = await s.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

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
        )
        await self.bus.publish_event(
            ev, self.bus.subjects.evt("provision", fact or f"job.{job.state}", job.id), entity=job.id
        )

    async def move(
        self,
        job_id: str,
        target: State,
        message: str = "",
        *,
        percent: int | None = None,
        fact: str | None = None,
        owned: bool = False,
        **values: Any,
    ) -> Job:
        """Apply one transition of the table (409 if forbidden) and emit its event.

        ``owned``: a worker step; only the lease owner may make it (:class:`LeaseLost` otherwise),
        and it renews the lease while the job stays in the worker phase.
        """
        async with self.db.session() as s, s.begin():
            job = await s.get(Job, job_id, with_for_update=True)
            if job is None:
                raise NotFound(f"no job {job_id}")
            if owned and job.owner != self.replica and not is_terminal(job.state):
                raise LeaseLost(f"job {job_id} is owned by {job.owner or 'nobody'}")
            new = transition(job.state, target)
            if new in WORKER_STATES and owned:
                db_now = (await s.exec(sa.select(sa.func.now()))).one()[0]
                job.lease_until = db_now + timedelta(seconds=self.cfg.lease_seconds)
            elif new not in WORKER_STATES:
                job.lease_until = None  # worker phase over: nothing left to claim
            info = INFO[new]
            job.state = new.value
            job.message = message or info.stage
            job.percent = percent if percent is not None else (info.percent or job.percent)
            job.updated_at = _now()
            job.stage_deadline = _now() + timedelta(seconds=self.cfg.stage_deadline) if info.watched else None
            for k, v in values.items():
                setattr(job, k, v)
        await self.emit(job, fact=fact)
        return job

    def _lease_expr(self) -> Any:
        """``now() + lease`` on the database clock (replicas' clocks never compared)."""
        return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(self.cfg.lease_seconds))

    def _spawn(self, job_id: str) -> None:
        self.tasks[job_id] = asyncio.create_task(self._run(job_id), name=f"job-{job_id}")

    # -- command: start -----------------------------------------------------------------
    async def handle_start(self, cmd: StartProvision) -> None:
        """Record the job (a redelivered command is a no-op) and start working it under our lease.

        The command is acked when this returns: from then on the row is the job's durable
        record and the lease decides who works it (a crash → another replica resumes it).
        """
        token = secrets.token_urlsafe(24)
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
            "lease_until": self._lease_expr(),
            "attempts": 1,
            "os_ip": "",
            "spec": cmd.model_dump(mode="json"),
            "created_at": _now(),
            "updated_at": _now(),
        }
        async with self.db.session() as s, s.begin():
            res = await (await s.connection()).execute(
                pg_insert(T).values(**row).on_conflict_do_nothing().returning(T.c.id)
            )
            created = res.first() is not None
            other = None
            if created:
                other = (
                    await s.exec(
                        sa.select(T.c.id).where(
                            T.c.bmc_ip == cmd.spec.bmc_ip,
                            T.c.id != cmd.job_id,
                            T.c.state.notin_(["completed", "failed", "cancelled"]),
                        )
                    )
                ).first()
        if not created:
            log.info("duplicate start command ignored", job_id=cmd.job_id)
            return
        job = await self.load(cmd.job_id)
        await self.emit(job)
        if other is not None:
            await self.move(
                cmd.job_id, State.failed, f"BMC {cmd.spec.bmc_ip} already has running job {other[0]}"
            )
            return
        self._spawn(cmd.job_id)

    async def _check(self, job_id: str) -> Job:
        job = await self.load(job_id)
        if job.state == State.cancelled:
            raise JobCancelled
        if job.owner != self.replica and not is_terminal(job.state):
            raise LeaseLost(f"job {job_id} is owned by {job.owner or 'nobody'}")
        return job

    async def _job_token(self, job: Job) -> str:
        """The installer token the medium embeds; the same on every (re)build of the medium."""
        if job.token_enc:
            return self.box.decrypt(job.token_enc, context=f"job-token:{job.id}")
        # A row from before tokens were kept: mint a new one (no medium has been booted yet).
        token = secrets.token_urlsafe(24)
        async with self.db.session() as s, s.begin():
            res = await (await s.connection()).execute(
                sa.update(T)
                .where(T.c.id == job.id, T.c.owner == self.replica)
                .values(
                    token_hash=token_hash(token),
                    token_enc=self.box.encrypt(token, context=f"job-token:{job.id}"),
                )
            )
            if res.rowcount != 1:
                raise LeaseLost(f"job {job.id} is owned by another replica")
        return token

    async def _run(self, job_id: str) -> None:
        """Work a job from its recorded state up to booting; safe to run again after a crash.

        queued/building_media: (re)build the medium; mounting: rebuild the medium (it lives on
        the replica that serves it), eject + insert + read back, boot override (all idempotent);
        then the gate ``mounting → booting`` (owner-checked, under the row lock, once per job)
        and only after it commits the one power reset.
        """
        mounted = False
        job: Job | None = None
        try:
            job = await self._check(job_id)
            cmd = StartProvision.model_validate(job.spec)
            token = await self._job_token(job)
            state = State(job.state)
            async with self.build_sem:
                await self._check(job_id)
                if state == State.queued:
                    await self.move(job_id, State.building_media, owned=True)
                    state = State.building_media
                await self.build_medium(cmd, token)
            subnet = self.subnet_sems[subnet_of(cmd.spec.bmc_ip)]
            async with self.bmc_sem, subnet:
                await self._check(job_id)
                if state == State.building_media:
                    await self.move(job_id, State.mounting, owned=True)
                drv = await self.driver(cmd)
                async with drv:
                    mounted = True  # from here a cancel must eject what we may have inserted
                    await drv.mount(f"{self.cfg.media_url.rstrip('/')}/media/{job_id}.iso")
                    self.mounts += 1
                    await drv.set_boot_cd_once()
                    await self._check(job_id)
                    gate = asyncio.create_task(self._gate_and_reset(job_id, drv))
                    gate.add_done_callback(_retrieve)
                    self.resetting[job_id] = gate
                    try:
                        kind = await asyncio.shield(gate)
                    finally:
                        if gate.done():
                            self.resetting.pop(job_id, None)
                    await drv.wait_power_on()
                log.info("job booting", job_id=job_id, reset=kind, replica=self.replica)
        except asyncio.CancelledError:
            log.info("worker stopping; the job stays claimable", job_id=job_id)
        except JobCancelled:
            log.info("job cancelled", job_id=job_id)
            if mounted and job is not None:  # the cancel may have run its cleanup before our insert
                await self._cleanup_bmc(job)
        except LeaseLost as exc:
            log.warning("job lease lost; the owner resumes it", job_id=job_id, reason=str(exc))
        except KariosError as exc:
            if mounted and job is not None and await self._cancelled(job_id):
                await self._cleanup_bmc(job)  # e.g. the booting gate refused: cancelled meanwhile
            else:
                await self._fail(job_id, exc.message)
        except Exception as exc:
            log.exception("job failed", job_id=job_id)
            await self._fail(job_id, f"internal error: {type(exc).__name__}")
        finally:
            if self.tasks.get(job_id) is asyncio.current_task():
                self.tasks.pop(job_id, None)

    async def _cancelled(self, job_id: str) -> bool:
        try:
            return (await self.load(job_id)).state == State.cancelled
        except KariosError:
            return False

    async def _gate_and_reset(self, job_id: str, drv: RedfishDriver) -> str:
        """``mounting → booting`` as the lease owner (once per job, row-locked), then the reset."""
        await self.move(
            job_id, State.booting, "Medium mounted; resetting into it", owned=True, reset_at=_now()
        )
        return await drv.reset_into_media()

    async def _fail(self, job_id: str, message: str) -> None:
        try:
            await self.move(job_id, State.failed, message, owned=True)
        except LeaseLost:
            return  # the job is another replica's now: its medium may be the one in use
        except (Conflict, NotFound):
            pass
        self.media.remove(job_id)

    # -- leases: heartbeat, claim sweep, graceful hand-over --------------------------------
    async def heartbeat(self) -> list[str]:
        """Renew the lease of every job this replica works; stop tasks whose lease was taken."""
        ids = list(self.tasks)
        if not ids:
            return []
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            renewed = {
                r[0]
                for r in await conn.execute(
                    sa.update(T)
                    .where(T.c.id.in_(ids), T.c.owner == self.replica, T.c.state.in_(_WORK))
                    .values(lease_until=self._lease_expr())
                    .returning(T.c.id)
                )
            }
            rest = [i for i in ids if i not in renewed]
            lost = (
                [
                    r[0]
                    for r in await conn.execute(
                        sa.select(T.c.id).where(
                            T.c.id.in_(rest), T.c.owner != self.replica, T.c.state.in_(_WORK)
                        )
                    )
                ]
                if rest
                else []
            )
        for job_id in lost:
            task = self.tasks.get(job_id)
            if task is not None:
                log.warning("job lease taken by another replica; stopping here", job_id=job_id)
                task.cancel()
        return lost

    async def claim_expired(self, limit: int | None = None) -> list[tuple[str, int]]:
        """Take worker-phase jobs whose lease expired (or was handed back): (job id, attempts).

        ``FOR UPDATE SKIP LOCKED`` in one UPDATE: two replicas sweeping at once never take the
        same job; the lease is compared with the database clock.
        """
        pick = (
            sa.select(T.c.id)
            .where(
                T.c.state.in_(_WORK),
                sa.or_(T.c.lease_until.is_(None), T.c.lease_until < sa.func.now()),
            )
            .order_by(T.c.created_at)
            .limit(limit or self.cfg.claim_batch)
            .with_for_update(skip_locked=True)
        )
        async with self.db.session() as s, s.begin():
            rows = await (await s.connection()).execute(
                sa.update(T)
                .where(T.c.id.in_(pick.scalar_subquery()))
                .values(owner=self.replica, lease_until=self._lease_expr(), attempts=T.c.attempts + 1)
                .returning(T.c.id, T.c.attempts)
            )
            return [(r[0], r[1]) for r in rows]

    async def resume_expired(self) -> list[str]:
        """Claim expired jobs and resume each from its recorded state. Returns the job ids."""
        resumed = []
        for job_id, attempts in await self.claim_expired():
            if job_id in self.tasks and not self.tasks[job_id].done():
                continue  # our own task outlived a missed heartbeat: it still runs
            if attempts > self.cfg.max_attempts:
                with contextlib.suppress(Conflict, NotFound, LeaseLost):
                    await self.move(
                        job_id,
                        State.failed,
                        f"gave up after {attempts - 1} worker attempts (provisioner restarts)",
                        owned=True,
                    )
                self.media.remove(job_id)
                continue
            job = await self.load(job_id)
            log.info("resuming job", job_id=job_id, state=job.state, attempt=attempts, replica=self.replica)
            await self.emit(
                job,
                f"{INFO[State(job.state)].stage}: resumed by another worker (attempt {attempts})",
                fact="job.resumed",
            )
            self._spawn(job_id)
            resumed.append(job_id)
        return resumed

    async def lease_loop(self) -> None:
        """Heartbeat every lease/3 and claim expired jobs every ``claim_interval`` (first: now)."""
        loop = asyncio.get_running_loop()
        tick = max(0.05, min(self.cfg.claim_interval, self.cfg.lease_seconds / 3))
        next_claim = 0.0
        while True:
            try:
                await self.heartbeat()
                if loop.time() >= next_claim:
                    next_claim = loop.time() + self.cfg.claim_interval
                    await self.resume_expired()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # DB or bus blip: try again next tick
                log.warning("lease upkeep failed", error=f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(tick)

    async def stop(self, grace: float = 15.0) -> None:
        """Stop working: a power reset in flight is allowed to finish, everything else is
        cancelled, and (graceful stop) our leases are handed back so another replica resumes
        the jobs at once instead of after the lease expires."""
        pending = [t for t in self.tasks.values() if not t.done()]
        for t in pending:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*pending, return_exceptions=True)
        gates = [g for g in self.resetting.values() if not g.done()]
        if gates:  # shielded: a reset already decided is sent, not cut in half
            await asyncio.wait(gates, timeout=grace)
        self.resetting.clear()
        if self.release_on_stop:
            with contextlib.suppress(Exception):
                async with self.db.session() as s, s.begin():
                    await (await s.connection()).execute(
                        sa.update(T)
                        .where(T.c.owner == self.replica, T.c.state.in_(_WORK))
                        .values(lease_until=None)
                    )

    async def build_medium(self, cmd: StartProvision, token: str) -> None:
        spec = cmd.spec
        major, suite = debian_release(spec.debian_version)
        level, disks = preseed.raid_layout(spec.pool_type, spec.selected_disks)
        nic = spec.selected_nic or "auto"
        preseed.validate_host(spec.hostname or "node", spec.os_username or "debian", nic)
        os_password = (
            self.box.decrypt(spec.os_password_enc, context=f"os:{spec.bmc_ip}")
            if spec.os_password_enc
            else "adminadmin"
        )
        root_hash = ""
        if spec.root_pass_enc:
            root_hash = preseed.hash_password(
                self.box.decrypt(spec.root_pass_enc, context=f"os:{spec.bmc_ip}")
            )
        static = None
        if spec.prefix_id is not None:
            # NetBox allocates from prefix ``prefix_id``; the file inventory from its configured pool.
            alloc = await self.bus.request(
                self.bus.subjects.request("inventory", "allocate_ip"),
                AllocateIp(name=spec.hostname, prefix_id=spec.prefix_id),
                reply=IpAllocation,
            )
            iface = ipaddress.ip_interface(alloc.address)
            static = {
                "address": str(iface.ip),
                "netmask": str(iface.netmask),
                "gateway": alloc.gateway,
                "nameservers": alloc.gateway,
            }
        base = self.cfg.callback_url.rstrip("/")
        if spec.controlnode_host:
            base = f"http://{spec.controlnode_host}:{spec.controlnode_port or 8080}"
        ctx = preseed.HostContext(
            job_id=cmd.job_id,
            token=token,
            callback_base=f"{base}/controlnode",
            hostname=spec.hostname or "node",
            bmc_ip=spec.bmc_ip,
            os_username=spec.os_username or "debian",
            password_hash=preseed.hash_password(os_password),
            root_password_hash=root_hash,
            disks=disks,
            md_level=level.md_level,
            nic=nic,
            nic_mac=spec.selected_nic_mac,
            static=static,
            kernel_args=preseed.gpu_kernel_args(spec.gpu_passthrough),
            suite=suite,
            mirror_host=self.cfg.mirror_host,
            mirror_dir=self.cfg.mirror_dir,
            job_type=cmd.job_type,
        )
        files = preseed.render_media_files(ctx)
        boot = preseed.render_boot_configs(label=f"Karios {cmd.job_type} {ctx.hostname}", kernel_args=[])
        await self.media.build_async(cmd.job_id, major, files, boot)

    async def driver(self, cmd: StartProvision) -> RedfishDriver:
        ip = cmd.spec.bmc_ip
        over = self.cfg.bmc_endpoints.get(ip, {})
        user, password = over.get("username", ""), over.get("password", "")
        if cmd.bmc_username and cmd.bmc_password_enc:
            user, password = cmd.bmc_username, self.box.decrypt(cmd.bmc_password_enc, context=f"bmc:{ip}")
        if not user:
            with contextlib.suppress(KariosError):
                creds = await self.bus.request(
                    self.bus.subjects.query("inventory", "bmc_access"),
                    BmcAccessQuery(bmc_ip=ip),
                    timeout=2.0,
                    reply=BmcAccess,
                )
                if creds.username and creds.password_enc:
                    user, password = creds.username, self.box.decrypt(creds.password_enc, context=f"bmc:{ip}")
        if not user:
            user, password = self.cfg.bmc_default_user, self.cfg.bmc_default_password
        ep = BmcEndpoint(
            bmc_ip=ip,
            base_url=over.get("url") or f"{self.cfg.bmc_scheme}://{ip}",
            username=user,
            password=password,
            verify_tls=bool(over.get("verify_tls", self.cfg.bmc_verify_tls)),
            system_id=over.get("system_id", ""),
            timeout=self.cfg.bmc_timeout,
            retries=self.cfg.bmc_retries,
            backoff=self.cfg.bmc_backoff,
            power_deadline=self.cfg.power_deadline,
        )
        cls = driver_for(cmd.spec.vendor)
        return self.driver_factory(cls, ep) if self.driver_factory else cls(ep)

    # -- installer callbacks ------------------------------------------------------------
    def _verify(self, job: Job, token: str) -> None:
        if not token or not hmac.compare_digest(token_hash(token), job.token_hash):
            raise Unauthorized("invalid job token")
        if is_terminal(job.state):
            raise Conflict(f"job {job.id} is already {job.state}", details={"state": job.state})

    async def _newer_job(self, job: Job) -> None:
        async with self.db.session() as s:
            newer = (
                await s.exec(
                    sa.select(T.c.id).where(T.c.bmc_ip == job.bmc_ip, T.c.created_at > job.created_at)
                )
            ).first()
        if newer is not None:
            raise Conflict(f"job {job.id} was superseded by job {newer[0]} for BMC {job.bmc_ip}")

    async def _older_attempt(self, bmc_ip: str, token: str) -> None:
        """409 when ``token`` belongs to an earlier job of this BMC (a superseded attempt)."""
        async with self.db.session() as s:
            old = (
                await s.exec(
                    sa.select(T.c.id).where(T.c.bmc_ip == bmc_ip, T.c.token_hash == token_hash(token))
                )
            ).first()
        if old is not None:
            raise Conflict(f"job {old[0]} was superseded by a newer job for BMC {bmc_ip}")

    async def step(self, req: CallbackRequest) -> JobView:
        job = await self.load(req.job_id)
        self._verify(job, req.token)
        await self._newer_job(job)
        if req.state == "failed":
            job = await self.move(job.id, State.failed, f"installer step {req.step} failed")
        else:
            percent = max(50, min(89, req.percent)) if req.percent is not None else None
            target = State.first_boot if job.state == State.first_boot else State.installing
            if job.state == State.stuck and job.os_ip:
                target = State.first_boot
            job = await self.move(
                job.id, target, f"{req.step}: {req.state}", percent=percent, fact="job.step"
            )
        return _view(job)

    async def complete(self, req: CallbackRequest) -> JobView:
        job = await self.load(req.job_id)
        self._verify(job, req.token)
        await self._newer_job(job)
        enc = req.os_password_enc
        if job.state == State.booting:
            await self.move(job.id, State.installing, "installer reported completion")
        job = await self.move(
            job.id,
            State.first_boot,
            "OS installed; waiting for first boot",
            os_ip=req.os_ip or job.os_ip,
            **({"os_password_enc": enc} if enc else {}),
        )
        if job.job_type == "unprovision":
            job = await self.move(job.id, State.completed, "disks wiped")
            await self._release(job)
        return _view(job)

    async def firstboot(self, req: CallbackRequest) -> JobView:
        async with self.db.session() as s:
            row = (
                await s.exec(
                    sa.select(T.c.id).where(T.c.bmc_ip == req.bmc_ip).order_by(T.c.created_at.desc()).limit(1)
                )
            ).first()
        if row is None:
            raise NotFound(f"no job for BMC {req.bmc_ip}")
        job = await self.load(row[0])
        if req.token and not hmac.compare_digest(token_hash(req.token), job.token_hash):
            await self._older_attempt(req.bmc_ip, req.token)
        self._verify(job, req.token)
        if job.state in (State.booting, State.installing):
            raise Conflict(f"job {job.id} has not finished installing")
        job = await self.move(job.id, State.completed, f"first boot from {req.os_ip}", os_ip=req.os_ip)
        await self._release(job)
        try:
            await self.bus.request(
                self.bus.subjects.request("inventory", "register_node"),
                RegisterNode(
                    bmc_ip=job.bmc_ip,
                    os_ip=req.os_ip or None,
                    os_hostname=job.hostname or None,
                    vendor=job.vendor or None,
                    is_control_node=False,
                ),
            )
        except KariosError as exc:
            log.warning("could not record the OS IP in the registry", job_id=job.id, error=exc.message)
        return _view(job)

    async def _release(self, job: Job) -> None:
        """After the job: eject the medium and drop it (best effort; the OS is already installed)."""
        self.media.remove(job.id)

    # -- cancel ---------------------------------------------------------------------------
    async def cancel(self, req: CancelJob) -> JobView:
        job = await self.load(req.job_id)
        if job.state == State.cancelled:
            return _view(job)
        job = await self.move(job.id, State.cancelled, "cancelled by operator")
        task = self.tasks.pop(job.id, None)
        if task is not None:
            task.cancel()
        asyncio.create_task(self._cleanup_bmc(job))  # noqa: RUF006 - best effort, logged
        return _view(job)

    async def _cleanup_bmc(self, job: Job) -> None:
        try:
            cmd = StartProvision.model_validate(job.spec)
            drv = await self.driver(cmd)
            async with drv:
                await drv.unmount()
                await drv.clear_boot_override()
        except Exception as exc:
            log.warning("cleanup after cancel failed", job_id=job.id, error=str(exc))
        self.media.remove(job.id)

    # -- queue and stuck detection --------------------------------------------------------
    async def queue(self) -> list[QueueEntry]:
        async with self.db.session() as s:
            rows = (
                await s.exec(
                    sa.select(T.c.id, T.c.bmc_ip, T.c.job_type, T.c.state, T.c.created_at)
                    .where(T.c.state.notin_(["completed", "failed", "cancelled"]))
                    .order_by(T.c.created_at)
                )
            ).all()
        out, pos = [], 0
        for r in rows:
            queued = r.state == State.queued
            pos += queued
            out.append(
                QueueEntry(
                    job_id=r.id,
                    bmc_ip=r.bmc_ip,
                    job_type=r.job_type,
                    state=r.state,
                    position=pos if queued else 0,
                    created_at=r.created_at.isoformat(),
                )
            )
        return out

    async def check_stuck(self) -> int:
        async with self.db.session() as s:
            rows = (
                await s.exec(
                    sa.select(T.c.id).where(
                        T.c.state.in_(["booting", "installing", "first_boot"]), T.c.stage_deadline < _now()
                    )
                )
            ).all()
        n = 0
        for (job_id,) in rows:
            with contextlib.suppress(Conflict):
                await self.move(job_id, State.stuck, "no installer report before the stage deadline")
                n += 1
        return n

    async def stuck_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.stuck_check_interval)
            try:
                await self.check_stuck()
            except (ServiceUnavailable, OSError) as exc:
                log.warning("stuck check failed", error=str(exc))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shielded task's outcome as seen (its awaiter may be gone after a stop)."""
    if not task.cancelled():
        task.exception()


def _view(job: Job) -> JobView:
    return JobView(
        job_id=job.id,
        bmc_ip=job.bmc_ip,
        state=job.state,
        status=INFO[State(job.state)].status,
        message=job.message,
    )
