"""Bus wiring of the fabric rollout (issue 6): thin adapters between the bus, the database,
the inventory's node registry and the rollout core in :mod:`karios.fabric_worker.rollout`.

- ``cmd.fabric.apply``            :class:`StartFabricApply` → :class:`ApplyJob` (durable; in_progress kept)
- ``cmd.fabric.teardown``         :class:`StartFabricTeardown`: whole-fabric teardown (durable)
- ``req.fabric.apply_check``      the gateway's synchronous check before it answers 202
- ``req.fabric.cancel_apply``     cancel the in-flight apply, whichever replica runs it (404 otherwise)
- ``bcast.fabric.cancel_apply``   core NATS fan-out of a cancel to every replica (no queue group)
- ``req.fabric.preflight``        read-only SSH fan-out; stores HMAC probe + MTU consensus on the config
- ``req.fabric.teardown_node``    remove the fabric from one node
- ``q.fabric.latest``             the latest job summary
- ``q.fabric.postdeploy``         one node's post-deploy checklist

Secrets (BGP password, OSPF key, OS passwords, the SSH private key) are decrypted here and only
handed to the rollout core; events, replies and logs never carry them. Node baselines (their
frr.conf holds the BGP password / OSPF key) are stored SecretBox-encrypted.

Several replicas: the job row is the source of truth (see :mod:`rollout_store`): the replica
running a job renews a lease on it; a job whose lease expired is taken over by a peer, which
rolls the touched nodes back (apply) or runs it again (teardown, idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from faststream.nats import NatsMessage
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.exc import IntegrityError

from karios.common.bus.envelope import RawEnvelope, wrap
from karios.common.bus.runtime import HandlerContext
from karios.common.contracts.fabric import (
    BGP_PASSWORD_CONTEXT,
    OSPF_AUTH_KEY_CONTEXT,
    ApplyAccepted,
    CancelAccepted,
    CancelFabricApply,
    DeleteResult,
    FabricApplyCheck,
    FabricConfigView,
    FabricJobView,
    FabricLatestQuery,
    FabricPreflightRequest,
    FabricPreflightResult,
    FabricRolloutEvent,
    NodeTeardownView,
    PostdeployQuery,
    PostdeployStep,
    PreflightOverride,
    StartFabricApply,
    StartFabricTeardown,
    TeardownFabricNode,
)
from karios.common.contracts.inventory import NodeAccess, NodeAccessQuery
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, KariosError, NotFound, ServiceUnavailable, ValidationFailed
from karios.common.service import ServiceRuntime
from karios.common.telemetry import get_logger
from karios.fabric_worker import rollout_store, store
from karios.fabric_worker.models import FabricConfigRow, FabricJobRow
from karios.fabric_worker.rollout import (
    ApplyJob,
    FabricIntent,
    JobRegistry,
    NodeOverride,
    NodeTarget,
    RolloutEvent,
    RolloutOptions,
    postdeploy_node,
    preflight,
    run_teardown_job,
    teardown_node,
)
from karios.fabric_worker.rollout.facts import NodeFacts, facts_from_dict, facts_to_dict
from karios.fabric_worker.rollout.node import NodeEvent, rollback_node
from karios.fabric_worker.rollout.summary import JobNode, JobStatus, JobSummary, JobType, RolloutStatus

log = get_logger(__name__)


class RolloutSettings(BaseSettings):
    """Worker-side rollout settings (``KARIOS_FABRIC_*``)."""

    model_config = SettingsConfigDict(env_prefix="KARIOS_FABRIC_", extra="ignore")

    ssh_key: Path | None = Field(None, description="SSH private key file used for every node (key auth)")
    vnis: str = Field("", description="Comma-separated L2 VNIs configured on every node, e.g. '100,200'")
    frr_log_file: str = Field("/var/log/frr/frr.log", description="FRR log file on the nodes")
    concurrency: int = Field(16, ge=1, description="Nodes worked on at once")
    strict: bool = Field(False, description="A node failure rolls every touched node back")
    connect_timeout: float = Field(10.0, gt=0)
    verify_timeout: float = Field(60.0, gt=0, description="Seconds for BGP Established + EVPN routes")
    preflight_timeout: float = Field(20.0, gt=0, description="Per-node preflight limit, seconds")
    progress_interval: float = Field(15.0, gt=0, description="Seconds between in_progress() acks")
    heartbeat_interval: float = Field(5.0, gt=0, description="Seconds between job lease renewals")
    lease: float = Field(
        30.0, gt=0, description="A running job whose replica has not renewed it for this long is taken over"
    )
    ack_wait: float = Field(60.0, gt=0, description="Seconds before an unacked fabric command is redelivered")

    def vni_list(self) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in self.vnis.replace(" ", "").split(",") if v)
        except ValueError:
            raise ValueError(f"KARIOS_FABRIC_VNIS: not a list of integers: {self.vnis!r}") from None

    def options(self) -> RolloutOptions:
        return RolloutOptions(connect_timeout=self.connect_timeout, verify_timeout=self.verify_timeout)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _check_ip(value: str, field: str = "node_ip") -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValidationFailed(f"{field}: {value!r} is not an IP address", field=field) from None


def baseline_context(job_id: str, node_ip: str) -> str:
    """SecretBox associated data: a stored baseline only decrypts as that job's, that node's."""
    return f"fabric:baseline:{job_id}:{node_ip}"


class RolloutService:
    """One per worker process. The job row in PostgreSQL is the source of truth for what runs
    (any replica answers cancel / latest / busy); the running :class:`ApplyJob` itself lives
    in the :class:`JobRegistry` of the replica holding the job's lease."""

    def __init__(self, rt: ServiceRuntime, box: SecretBox, settings: RolloutSettings) -> None:
        self.rt, self.box, self.settings = rt, box, settings
        self.registry = JobRegistry()
        self.vnis = settings.vni_list()
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stopping = False
        self._handlers: set[asyncio.Task] = set()
        self._teardown: asyncio.Task | None = None
        self._reaper: asyncio.Task | None = None

    @property
    def cancel_subject(self) -> str:
        return self.rt.bus.subjects.broadcast("fabric", "cancel_apply")

    @property
    def heartbeat_interval(self) -> float:
        return min(self.settings.heartbeat_interval, self.settings.progress_interval, self.settings.lease / 3)

    # -- building blocks ---------------------------------------------------------------------

    def _db(self):  # type: ignore[no-untyped-def]
        assert self.rt.db is not None
        return self.rt.db

    async def _config(self) -> FabricConfigRow:
        async with self._db().session() as s:
            row = await store.load(s)
        if row is None:
            raise NotFound("no fabric configuration is stored")
        return row

    def intent_of(self, row: FabricConfigRow) -> FabricIntent:
        """The stored config as the rollout's intent; secrets decrypted here only."""
        cfg = store.fields_of(row)
        underlay_cidr = row.underlay_cidr or cfg.management_cidr
        required = {
            "as": cfg.as_,
            "fabric_switch_peering_ip": cfg.fabric_switch_peering_ip,
            "router_id_base": cfg.router_id_base,
            "router_id_prefix_len": cfg.router_id_prefix_len,
            "management_cidr": underlay_cidr,
        }
        for name, value in required.items():
            if not value:
                raise Conflict(f"{name}: required before the fabric can be rolled out", field=name)
        auth = cfg.ospf_auth_type if cfg.ospf_auth_type not in ("", "none") else "none"
        kwargs: dict[str, Any] = {
            "asn": cfg.as_,
            "peer_ip": cfg.fabric_switch_peering_ip,
            "peer_asn": cfg.fabric_switch_as or None,
            "router_id_base": cfg.router_id_base,
            "router_id_prefix_len": cfg.router_id_prefix_len,
            "underlay_cidr": underlay_cidr,
            "underlay": "ospf" if cfg.ospf_enabled else "bgp",
            "ospf_area": cfg.ospf_area or "0.0.0.0",
            "ospf_hello_interval": cfg.ospf_hello_interval or 10,
            "ospf_dead_interval": cfg.ospf_dead_interval or 40,
            "ospf_auto_ref_bw": cfg.ospf_auto_ref_bw or None,
            "ospf_auth_type": auth,
            "ospf_auth_key_id": cfg.ospf_auth_key_id or 1,
            "bfd_enabled": cfg.bfd_enabled,
            "vxlan_mtu": cfg.vxlan_mtu or 1500,
            "advertise_all_vni": cfg.advertise_all_vni,
            "vnis": self.vnis,
            "frr_log_file": self.settings.frr_log_file,
        }
        if row.bgp_password_enc:
            kwargs["bgp_password"] = self.box.decrypt(row.bgp_password_enc, context=BGP_PASSWORD_CONTEXT)
        if row.ospf_auth_key_enc and auth != "none":
            kwargs["ospf_auth_key"] = self.box.decrypt(row.ospf_auth_key_enc, context=OSPF_AUTH_KEY_CONTEXT)
        try:
            return FabricIntent(**kwargs)
        except ValidationError as exc:  # only loc + msg: never the (secret) input value
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ())) or "config"
            raise Conflict(
                f"the fabric configuration cannot be rolled out: {loc}: {first.get('msg')}"
            ) from None

    def _private_key(self) -> str | None:
        path = self.settings.ssh_key
        if path is None:
            return None
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise Conflict(f"KARIOS_FABRIC_SSH_KEY {path}: cannot read ({exc.strerror})") from None

    async def targets(self, node_ip: str = "") -> list[NodeTarget]:
        """Registered nodes with an OS IP (or only ``node_ip``), credentials decrypted here."""
        subjects = self.rt.bus.subjects
        raw = await self.rt.bus.request(
            subjects.query("inventory", "node_access"), NodeAccessQuery(node_ip=node_ip or None)
        )
        access = [NodeAccess.model_validate(a) for a in raw or []]
        async with self._db().session() as s:
            known = await rollout_store.host_keys(s)
        key = self._private_key()
        out = []
        for a in access:
            password = (
                self.box.decrypt(a.os_password_enc, context=f"os:{a.bmc_ip}") if a.os_password_enc else None
            )
            out.append(
                NodeTarget(
                    node_ip=a.node_ip,
                    fqdn=a.fqdn or a.hostname,
                    username=a.os_username or "root",
                    private_key=key,
                    password=password,
                    known_host_key=a.ssh_host_key or known.get(a.node_ip),
                )
            )
        return sorted(out, key=lambda t: ipaddress.ip_address(t.node_ip))

    async def _check_idle(self) -> None:
        """409 while any replica runs an apply/teardown (the running job row says so)."""
        async with self._db().session() as s:
            row = await rollout_store.running_row(s)
        if row is not None:
            what = "apply" if row.job_type == JobType.APPLY else "teardown"
            raise Conflict(f"fabric {what} {row.job_id} is still running", field="apply_job_id")

    async def _publish(self, ev: RolloutEvent, cause: Any = None) -> None:
        entity = ev.node_ip or ev.job_id
        await self.rt.bus.publish_event(
            FabricRolloutEvent(**ev.model_dump(mode="json")),
            self.rt.bus.subjects.evt("fabric", ev.state, entity),
            cause=cause,
            entity=entity,
        )

    async def _safe_publish(self, ev: RolloutEvent, cause: Any = None) -> None:
        try:
            await self._publish(ev, cause)
        except Exception:
            log.warning("fabric event not published", state=ev.state, job_id=ev.job_id)

    async def _save(self, summary: JobSummary) -> None:
        async with self._db().session() as s, s.begin():
            await rollout_store.save_job(s, summary)

    async def _set_status(self, status: str) -> None:
        async with self._db().session() as s, s.begin():
            await rollout_store.set_rollout_status(s, status)

    async def _remember(self, keys: dict[str, str]) -> None:
        if keys:
            async with self._db().session() as s, s.begin():
                n = await rollout_store.remember_host_keys(s, keys)
            if n:
                log.info("ssh host keys stored (first seen)", nodes=n)

    async def _allocate(self, node_ips: list[str]) -> dict[str, str]:
        out = {}
        for ip in node_ips:
            async with self._db().session() as s, s.begin():
                out[ip] = (await store.allocate(s, ip)).vtep_ip
        return out

    async def _start_row(self, summary: JobSummary, request: dict) -> None:
        """Insert the running job under this replica's lease; 409 when another job runs."""
        try:
            async with self._db().session() as s, s.begin():
                await rollout_store.start_job(s, summary, owner=self.instance, request=request)
        except IntegrityError:
            await self._check_idle()
            raise Conflict("another fabric job is running") from None

    async def _finish(self, summary: JobSummary) -> bool:
        async with self._db().session() as s, s.begin():
            ok = await rollout_store.finish_job(s, summary, self.instance)
            await rollout_store.drop_baselines(s, summary.job_id)
        return ok

    async def _hold_lease(
        self,
        job_id: str,
        task: asyncio.Task,
        *,
        ctx: HandlerContext | None = None,
        summary: Callable[[], JobSummary | None] = lambda: None,
        on_cancel: Callable[[], None] | None = None,
    ) -> bool:
        """Wait for `task` while renewing the lease (storing the live summary), telling the bus
        we are alive, and polling the durable cancel flag (the broadcast's backstop).
        False: the lease was lost (a peer took the job over): `task` is stopped, no rollback."""
        while not task.done():
            await asyncio.wait({task}, timeout=self.heartbeat_interval)
            if task.done():
                break
            if ctx is not None:
                with contextlib.suppress(Exception):
                    await ctx.in_progress()
            try:
                async with self._db().session() as s, s.begin():
                    cancel = await rollout_store.heartbeat(s, job_id, self.instance, summary())
            except Exception as exc:  # database hiccup: keep working, the lease is generous
                log.warning("fabric job heartbeat failed", job_id=job_id, error=type(exc).__name__)
                continue
            if cancel is None:
                log.error("fabric job lease lost; a peer took it over", job_id=job_id)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                return False
            if cancel and on_cancel is not None:
                on_cancel()
        return True

    async def _release(self, job_id: str) -> None:
        with contextlib.suppress(Exception):
            async with self._db().session() as s, s.begin():
                await rollout_store.release_lease(s, job_id, self.instance)

    def _track(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    # -- apply ------------------------------------------------------------------------------

    async def apply_check(self, q: FabricApplyCheck) -> ApplyAccepted:
        node_ip = _check_ip(q.node_ip) if q.node_ip else ""
        await self._check_idle()
        self.intent_of(await self._config())
        targets = await self.targets(node_ip)
        if not targets:
            raise Conflict("no registered node has an OS IP to roll the fabric out to")
        return ApplyAccepted(apply_job_id="", created=False, message=f"{len(targets)} node(s)")

    async def _fail_job(self, cmd: StartFabricApply, error: str, cause: Any) -> None:
        summary = JobSummary(
            job_id=cmd.job_id,
            job_type=JobType.APPLY,
            job_status=JobStatus.FAILED,
            rollout_status=RolloutStatus.FAILED,
            state="apply_failed",
            progress=100,
            error=error,
        )
        await self._save(summary)
        await self._publish(
            RolloutEvent(job_id=cmd.job_id, job_type=JobType.APPLY, state="apply_failed", message=error),
            cause,
        )

    def _baseline_keeper(self, job_id: str) -> Callable[[str, NodeFacts], Awaitable[None]]:
        async def keep(node_ip: str, facts: NodeFacts) -> None:
            blob = self.box.encrypt(
                json.dumps(facts_to_dict(facts)), context=baseline_context(job_id, node_ip)
            )
            try:
                async with self._db().session() as s, s.begin():
                    await rollout_store.keep_baseline(s, job_id, node_ip, blob)
            except Exception as exc:
                raise ServiceUnavailable(
                    f"{node_ip}: baseline not persisted ({type(exc).__name__}); node left untouched"
                ) from None

        return keep

    async def on_apply(self, cmd: StartFabricApply, ctx: HandlerContext) -> None:
        self._track()
        if self._stopping:
            raise ServiceUnavailable("fabric-worker is stopping")
        async with self._db().session() as s:
            seen = await rollout_store.get_row(s, cmd.job_id)
        if seen is not None:
            if seen.job_status == rollout_store.RUNNING and seen.owner != self.instance:
                await self._take_over(cmd.job_id)  # only when its replica is gone
            return  # done already, running here, or running on a live peer
        try:
            await self._check_idle()
            row = await self._config()
            intent = self.intent_of(row)
            targets = await self.targets(cmd.node_ip)
            if not targets:
                raise Conflict("no registered node has an OS IP to roll the fabric out to")
            vteps = await self._allocate([t.node_ip for t in targets])
            overrides = [NodeOverride(**o) for o in (row.node_overrides or []) if isinstance(o, dict)]
        except ServiceUnavailable:
            raise  # inventory/bus hiccup: let the bus retry
        except KariosError as exc:
            await self._fail_job(cmd, exc.message, ctx.envelope)
            return

        async def sink(ev: RolloutEvent) -> None:
            await self._publish(ev, ctx.envelope)

        job = ApplyJob(
            intent,
            targets,
            vteps,
            strict=self.settings.strict,
            concurrency=self.settings.concurrency,
            overrides=overrides,
            options=self.settings.options(),
            sink=sink,
            job_id=cmd.job_id,
            before_change=self._baseline_keeper(cmd.job_id),
        )
        whole = not cmd.node_ip
        request = {"node_ip": cmd.node_ip, "vnis": list(intent.vnis), "caller": cmd.caller}
        try:
            await self._start_row(job.summary, request)
            task = self.registry.start(job)
        except Conflict as exc:
            await self._fail_job(cmd, exc.message, ctx.envelope)
            return
        if whole:
            await self._set_status(RolloutStatus.ROLLING_OUT)
        held = await self._hold_lease(
            cmd.job_id, task, ctx=ctx, summary=lambda: job.summary, on_cancel=job.cancel
        )
        if not held:
            return
        if task.cancelled():  # worker stopping: the baselines stay, a peer rolls back
            await self._release(cmd.job_id)
            raise ServiceUnavailable(f"fabric-worker stopped during apply {cmd.job_id}")
        summary = task.result()
        if not await self._finish(summary):
            return
        await self._remember(
            {r.node_ip: r.host_key for r in job.results if r.host_key and r.host_key_first_seen}
        )
        if whole:
            await self._set_status(summary.rollout_status)
        elif summary.job_status is not JobStatus.COMPLETED:
            await self._set_status(RolloutStatus.DEGRADED)
        log.info(
            "fabric apply finished",
            job_id=summary.job_id,
            job_status=str(summary.job_status),
            completed=summary.completed_nodes,
            failed=summary.failed_nodes,
        )

    async def cancel(self, q: CancelFabricApply) -> CancelAccepted:
        """Any replica answers: the job row says whether `job_id` is in flight (404 otherwise);
        the flag is stored (durable) and broadcast to every replica (the runner reacts at once)."""
        async with self._db().session() as s, s.begin():
            running = await rollout_store.request_cancel(s, q.job_id)
        if not running:
            raise NotFound(f"no in-flight fabric apply {q.job_id}")
        self.registry.cancel_local(q.job_id)
        with contextlib.suppress(Exception):  # the flag is polled anyway
            env = wrap(q, source=self.rt.bus.service)
            await self.rt.bus.nc.publish(self.cancel_subject, env.model_dump_json().encode())
        return CancelAccepted(job_id=q.job_id, message="cancellation requested; nodes roll back to baseline")

    async def on_cancel_broadcast(self, body: Any, msg: NatsMessage) -> None:
        try:
            job_id = CancelFabricApply.model_validate(
                RawEnvelope.model_validate_json(msg.raw_message.data).data
            ).job_id
        except Exception:
            log.warning("ignoring malformed fabric cancel broadcast")
            return
        if self.registry.cancel_local(job_id):
            log.info("fabric apply cancel received", job_id=job_id)

    async def latest(self, _q: FabricLatestQuery) -> FabricJobView:
        cur = self.registry.running_job()
        if cur is not None:
            return rollout_store.job_view(cur.summary)
        async with self._db().session() as s:
            view = await rollout_store.latest_job(s)
        if view is None:
            raise NotFound("no fabric job has run yet")
        return view

    # -- recovery of a job whose replica died ------------------------------------------------

    async def _take_over(self, job_id: str) -> None:
        async with self._db().session() as s, s.begin():
            before = await rollout_store.get_row(s, job_id)
            previous = before.owner if before is not None else ""
            row = await rollout_store.claim(s, job_id, self.instance, self.settings.lease)
        if row is None:
            return  # held by a live replica, finished, or another peer won the claim
        if row.job_type == JobType.TEARDOWN:
            await self._run_teardown(row, None)
        else:
            await self._recover_apply(row, previous)

    async def _recover_apply(self, row: FabricJobRow, previous: str) -> None:
        """Roll every node the dead replica touched back to its persisted baseline; the job ends
        failed (cancelled when a cancel was requested), rollout_status failed, or degraded when
        a node could not be rolled back."""
        job_id = row.job_id
        try:
            summary = JobSummary.model_validate((row.summary or {}) | {"job_type": JobType.APPLY})
        except ValidationError:
            summary = JobSummary(job_id=job_id, job_type=JobType.APPLY)
        async with self._db().session() as s:
            blobs = await rollout_store.baselines(s, job_id)
        vnis = tuple(int(v) for v in (row.request or {}).get("vnis", self.vnis))

        async def emit(state: str, node_ip: str = "", fqdn: str = "", message: str = "") -> None:
            await self._safe_publish(
                RolloutEvent(
                    job_id=job_id,
                    job_type=JobType.APPLY,
                    state=state,
                    progress=summary.progress,
                    node_ip=node_ip,
                    fqdn=fqdn,
                    message=message,
                )
            )

        async def node_event(ev: NodeEvent) -> None:
            await emit(ev.state, ev.node_ip, ev.fqdn, ev.message)

        async def work() -> tuple[list[str], list[str]]:
            back, stuck = [], []
            if not blobs:
                return back, stuck
            await emit(
                "apply_rolling_back", message=f"{len(blobs)} touched node(s); worker {previous} stopped"
            )
            secrets: list[str] = []
            with contextlib.suppress(KariosError):
                secrets = self.intent_of(await self._config()).secrets()
            try:
                targets = {t.node_ip: t for t in await self.targets()}
            except KariosError as exc:
                targets, reason = {}, exc.message
            else:
                reason = "node no longer registered"
            for node_ip, blob in sorted(blobs.items()):
                target = targets.get(node_ip)
                if target is None:
                    stuck.append(f"{node_ip}: {reason}")
                    continue
                baseline = facts_from_dict(
                    json.loads(self.box.decrypt(blob, context=baseline_context(job_id, node_ip)))
                )
                node_secrets = secrets + [
                    x.get_secret_value() for x in (target.password, target.private_key) if x is not None
                ]
                ok, msg = await rollback_node(
                    target,
                    baseline,
                    vnis,
                    options=self.settings.options(),
                    secrets=node_secrets,
                    progress=node_event,
                    fqdn=target.fqdn,
                )
                (back if ok else stuck).append(node_ip if ok else f"{node_ip}: {msg}")
            return back, stuck

        task = asyncio.get_running_loop().create_task(work())
        if not await self._hold_lease(job_id, task):
            return
        if task.cancelled():
            await self._release(job_id)
            return
        back, stuck = task.result()
        nodes = {n.node_ip: n for n in summary.nodes}
        for ip in back:
            nodes[ip] = JobNode(
                node_ip=ip,
                fqdn=nodes[ip].fqdn if ip in nodes else "",
                rolled_back=True,
                error="interrupted; rolled back to baseline",
            )
        for item in stuck:
            ip = item.split(":", 1)[0]
            nodes[ip] = JobNode(
                node_ip=ip,
                fqdn=nodes[ip].fqdn if ip in nodes else "",
                error=f"interrupted; rollback failed: {item.split(': ', 1)[-1]}",
            )
        cancelled = bool(row.cancel_requested)
        error = (
            f"interrupted: the worker running this apply stopped ({previous or 'unknown'}); "
            f"{len(back)} touched node(s) rolled back to baseline"
        )
        if stuck:
            error += f", {len(stuck)} could not be: {'; '.join(stuck)}"
        done = summary.model_copy(
            update={
                "nodes": list(nodes.values()),
                "completed_nodes": sum(1 for n in nodes.values() if n.ok),
                "failed_nodes": sum(1 for n in nodes.values() if not n.ok),
                "job_status": JobStatus.CANCELLED if cancelled else JobStatus.FAILED,
                "rollout_status": RolloutStatus.DEGRADED if stuck else RolloutStatus.FAILED,
                "state": "apply_cancelled" if cancelled else "apply_failed",
                "progress": 100,
                "error": error,
                "updated_at": _now(),
            }
        )
        if not await self._finish(done):
            return
        whole = not (row.request or {}).get("node_ip")
        await self._set_status(done.rollout_status if whole else RolloutStatus.DEGRADED)
        await emit(done.state, message=error)
        log.warning(
            "interrupted fabric apply recovered", job_id=job_id, rolled_back=len(back), stuck=len(stuck)
        )

    async def recover_stale(self) -> int:
        """Take over every running job whose replica is gone (start-up and every lease/3)."""
        async with self._db().session() as s:
            ids = await rollout_store.stale_jobs(s, self.settings.lease)
        for job_id in ids:
            if self._stopping:
                break
            try:
                await self._take_over(job_id)
            except Exception:
                log.exception("fabric job recovery failed", job_id=job_id)
        return len(ids)

    async def _reap(self) -> None:
        while not self._stopping:
            try:
                await self.recover_stale()
            except Exception as exc:
                log.warning("fabric job reaper", error=type(exc).__name__)
            await asyncio.sleep(max(0.5, self.settings.lease / 3))

    async def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    # -- preflight --------------------------------------------------------------------------

    async def preflight(self, req: FabricPreflightRequest) -> FabricPreflightResult:
        if not req.underlay_cidr:
            raise ValidationFailed("underlay_cidr: required", field="underlay_cidr")
        try:
            cidr = str(ipaddress.IPv4Network(req.underlay_cidr.strip(), strict=False))
        except ValueError:
            raise ValidationFailed(
                f"underlay_cidr: {req.underlay_cidr!r} is not an IPv4 CIDR", field="underlay_cidr"
            ) from None
        overrides = []
        for i, o in enumerate(req.node_overrides):
            f = f"node_overrides.{i}"
            _check_ip(o.node_ip, f"{f}.node_ip")
            if not o.underlay_iface_hint:
                raise ValidationFailed(f"{f}.underlay_iface_hint: required", field=f"{f}.underlay_iface_hint")
            try:
                ipaddress.IPv4Interface(o.underlay_ip)
            except ValueError:
                raise ValidationFailed(
                    f"{f}.underlay_ip: must be host/CIDR such as 10.60.200.5/24", field=f"{f}.underlay_ip"
                ) from None
            overrides.append(NodeOverride(**o.model_dump()))
        async with self._db().session() as s:
            row = await store.load(s)
        cfg = store.fields_of(row) if row is not None else None
        base = req.router_id_base or (cfg.router_id_base if cfg else "")
        prefix = req.router_id_prefix_len or (cfg.router_id_prefix_len if cfg else 0)
        if not base or not prefix:
            raise ValidationFailed(
                "router_id_base: required when no fabric configuration is stored", field="router_id_base"
            )
        try:
            ipaddress.IPv4Network(f"{base}/{prefix}", strict=False)
        except ValueError:
            raise ValidationFailed(
                f"router_id_base: {base}/{prefix} is not a valid VTEP pool", field="router_id_base"
            ) from None
        targets = await self.targets()
        result = await preflight(
            targets,
            underlay_cidr=cidr,
            router_id_base=base,
            router_id_prefix_len=prefix,
            node_overrides=overrides,
            expected_nodes=req.expected_nodes or (cfg.expected_nodes if cfg else 0),
            concurrency=self.settings.concurrency,
            per_node_timeout=self.settings.preflight_timeout,
        )
        await self._remember(
            {n.node_ip: n.host_key for n in result.nodes if n.host_key and n.host_key_first_seen}
        )
        if targets:
            async with self._db().session() as s, s.begin():
                await rollout_store.store_preflight(
                    s,
                    underlay_cidr=cidr,
                    underlay_mtu=result.underlay_mtu,
                    hmac_sha_capable=result.frr_hmac_sha_capable,
                    overrides=[PreflightOverride(**o.model_dump()) for o in overrides],
                )
        return FabricPreflightResult.model_validate(result.model_dump(mode="json"))

    # -- node operations ---------------------------------------------------------------------

    async def _one_target(self, node_ip: str) -> NodeTarget:
        targets = await self.targets(_check_ip(node_ip))
        if not targets:
            raise NotFound(f"node {node_ip} has no OS IP registered")
        return targets[0]

    async def teardown_node(self, q: TeardownFabricNode) -> NodeTeardownView:
        target = await self._one_target(q.node_ip)
        await self._check_idle()
        intent = self.intent_of(await self._config())
        res = await teardown_node(target, intent, options=self.settings.options())
        if res.removed:
            async with self._db().session() as s, s.begin():
                with contextlib.suppress(NotFound):
                    await store.release(s, target.node_ip)
        await self._publish(
            RolloutEvent(
                job_id=f"node-teardown-{target.node_ip}",
                job_type=JobType.TEARDOWN,
                state="teardown_node_removed" if res.removed else "teardown_node_failed",
                progress=100,
                node_ip=target.node_ip,
                fqdn=res.fqdn,
                message=res.message,
            )
        )
        return NodeTeardownView(
            node_ip=target.node_ip,
            removed=res.removed,
            reachable=res.reachable,
            message=res.message,
            steps=res.steps,
        )

    async def postdeploy(self, q: PostdeployQuery) -> list[PostdeployStep]:
        target = await self._one_target(q.node_ip)
        intent = self.intent_of(await self._config())
        async with self._db().session() as s:
            vtep = (await rollout_store.allocations(s)).get(target.node_ip)
        steps = await postdeploy_node(target, intent, expected_vtep_ip=vtep, options=self.settings.options())
        now = _now()
        return [
            PostdeployStep(
                step_id=st.step_id,
                status=str(st.status),
                message=st.message,
                progress=st.progress,
                node_ip=target.node_ip,
                bmc_ip=q.bmc_ip,
                batch_id=q.batch_id,
                created_at=now,
                updated_at=now,
            )
            for st in steps
        ]

    # -- whole-fabric teardown (DELETE /fabric-config): a durable command ------------------------

    async def delete_config(self, caller: str = "") -> DeleteResult:
        """Delete the config and, when VTEPs were allocated, queue the teardown of those nodes in
        the same transaction (job row, no owner yet), then send ``cmd.fabric.teardown``. The
        command is durable (retried after a worker restart); a queued row nobody picks up within
        the lease is taken over by any replica's reaper."""
        await self._check_idle()
        job_id = str(uuid.uuid4())
        async with self._db().session() as s:
            allocated = await rollout_store.allocations(s)
        registered: set[str] | None = None
        if allocated:
            try:  # nodes no longer registered cannot be reached: nothing to queue for them
                registered = {t.node_ip for t in await self.targets()}
            except KariosError as exc:  # inventory down: queue them all, the job resolves later
                log.warning("fabric teardown: node registry unavailable", reason=exc.message)
        try:
            async with self._db().session() as s, s.begin():
                allocated = {
                    ip: v
                    for ip, v in (await rollout_store.allocations(s)).items()
                    if registered is None or ip in registered
                }
                result = await store.delete(s)  # 404 when none
                if allocated:
                    summary = JobSummary(job_id=job_id, job_type=JobType.TEARDOWN, total_nodes=len(allocated))
                    request = {"node_ips": sorted(allocated), "vnis": list(self.vnis), "caller": caller}
                    await rollout_store.start_job(s, summary, owner="", request=request)
        except IntegrityError:
            await self._check_idle()
            raise Conflict("another fabric job is running") from None
        if not allocated:
            return result
        with contextlib.suppress(KariosError):  # the reaper sends nothing: it runs the job itself
            await self.rt.bus.send_command(
                StartFabricTeardown(
                    job_id=job_id, node_ips=sorted(allocated), vnis=list(self.vnis), caller=caller
                ),
                self.rt.bus.subjects.cmd("fabric", "teardown"),
                entity=job_id,
                msg_id=job_id,
            )
        return result.model_copy(
            update={
                "teardown_job_id": job_id,
                "message": f"{result.message}; teardown of {len(allocated)} node(s) queued",
            }
        )

    async def on_teardown(self, cmd: StartFabricTeardown, ctx: HandlerContext) -> None:
        self._track()
        if self._stopping:
            raise ServiceUnavailable("fabric-worker is stopping")
        async with self._db().session() as s, s.begin():
            row = await rollout_store.claim(s, cmd.job_id, self.instance, self.settings.lease)
        if row is None:
            return  # finished, or held by a live replica
        await self._run_teardown(row, ctx)

    async def _run_teardown(self, row: FabricJobRow, ctx: HandlerContext | None) -> None:
        job_id = row.job_id
        req = row.request or {}
        node_ips = set(req.get("node_ips") or [])
        vnis = tuple(int(v) for v in req.get("vnis") or self.vnis)
        cause = ctx.envelope if ctx is not None else None

        async def sink(ev: RolloutEvent) -> None:
            await self._safe_publish(ev, cause)

        async def work() -> JobSummary:
            targets = [t for t in await self.targets() if t.node_ip in node_ips]
            return await run_teardown_job(
                None,
                targets,
                concurrency=self.settings.concurrency,
                options=self.settings.options(),
                sink=sink,
                job_id=job_id,
                vnis=vnis,
            )

        task = asyncio.get_running_loop().create_task(work())
        self._teardown = task
        if not await self._hold_lease(job_id, task, ctx=ctx):
            return
        if task.cancelled():
            await self._release(job_id)
            if ctx is not None:
                raise ServiceUnavailable(f"fabric-worker stopped during teardown {job_id}")
            return
        exc = task.exception()
        if isinstance(exc, ServiceUnavailable) and ctx is not None:
            await self._release(job_id)
            raise exc  # inventory unavailable: the bus retries the command
        if exc is not None:
            message = exc.message if isinstance(exc, KariosError) else type(exc).__name__
            summary = JobSummary(
                job_id=job_id,
                job_type=JobType.TEARDOWN,
                job_status=JobStatus.FAILED,
                rollout_status=RolloutStatus.FAILED,
                state="teardown_failed",
                progress=100,
                error=message,
            )
            await self._finish(summary)
            await sink(
                RolloutEvent(
                    job_id=job_id, job_type=JobType.TEARDOWN, state="teardown_failed", message=message
                )
            )
            return
        summary = task.result()
        await self._finish(summary)
        log.info("fabric teardown finished", job_id=job_id, job_status=str(summary.job_status))

    async def decorate(self, view: FabricConfigView) -> FabricConfigView:
        """``last_job`` on GET fabric-config when the rollout failed or is degraded."""
        if view.rollout_status not in (RolloutStatus.FAILED, RolloutStatus.DEGRADED):
            return view
        async with self._db().session() as s:
            job = await rollout_store.latest_job(s)
        return view.model_copy(update={"last_job": job.model_dump(mode="json") if job else None})

    async def stop(self) -> None:
        """Stop where we stand: the in-flight job keeps its row and baselines, its lease is
        released so a peer (or this worker after a restart) recovers it at once; the command
        is nak'ed for redelivery."""
        self._stopping = True
        for task in (self._reaper,):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        await self.registry.halt()
        if self._teardown is not None and not self._teardown.done():
            self._teardown.cancel()
        pending = [t for t in self._handlers if t is not asyncio.current_task() and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=10)


def register_rollout(
    rt: ServiceRuntime, box: SecretBox, settings: RolloutSettings | None = None
) -> RolloutService:
    """Wire the rollout's handlers on ``rt.bus``; returns the service for app.py's few hooks."""
    svc = RolloutService(rt, box, settings or RolloutSettings())
    sub = rt.bus.subjects
    rt.bus.ack_wait = svc.settings.ack_wait
    rt.bus.command_handler("fabric", StartFabricApply, svc.on_apply, verb="apply", concurrency=1)
    rt.bus.command_handler("fabric", StartFabricTeardown, svc.on_teardown, verb="teardown", concurrency=1)
    # Every replica hears a cancel (no queue group): the one running the apply acts on it.
    rt.bus.broker.subscriber(svc.cancel_subject, no_reply=True)(svc.on_cancel_broadcast)
    rt.bus.query_responder(sub.request("fabric", "apply_check"), FabricApplyCheck, svc.apply_check)
    rt.bus.query_responder(sub.request("fabric", "cancel_apply"), CancelFabricApply, svc.cancel)
    rt.bus.query_responder(sub.request("fabric", "preflight"), FabricPreflightRequest, svc.preflight)
    rt.bus.query_responder(sub.request("fabric", "teardown_node"), TeardownFabricNode, svc.teardown_node)
    rt.bus.query_responder(sub.query("fabric", "latest"), FabricLatestQuery, svc.latest)
    rt.bus.query_responder(sub.query("fabric", "postdeploy"), PostdeployQuery, svc.postdeploy)
    return svc
