"""Bus wiring of the fabric rollout (issue 6): thin adapters between the bus, the database,
the inventory's node registry and the rollout core in :mod:`karios.fabric_worker.rollout`.

- ``cmd.fabric.apply``            :class:`StartFabricApply` → :class:`ApplyJob` (durable; in_progress kept)
- ``req.fabric.apply_check``      the gateway's synchronous check before it answers 202
- ``req.fabric.cancel_apply``     cancel the in-flight apply (404 otherwise)
- ``req.fabric.preflight``        read-only SSH fan-out; stores HMAC probe + MTU consensus on the config
- ``req.fabric.teardown_node``    remove the fabric from one node
- ``q.fabric.latest``             the latest job summary
- ``q.fabric.postdeploy``         one node's post-deploy checklist

Secrets (BGP password, OSPF key, OS passwords, the SSH private key) are decrypted here and only
handed to the rollout core; events, replies and logs never carry them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    TeardownFabricNode,
)
from karios.common.contracts.inventory import NodeAccess, NodeAccessQuery
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, KariosError, NotFound, ServiceUnavailable, ValidationFailed
from karios.common.service import ServiceRuntime
from karios.common.telemetry import get_logger
from karios.fabric_worker import rollout_store, store
from karios.fabric_worker.models import FabricConfigRow
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
from karios.fabric_worker.rollout.summary import JobStatus, JobSummary, JobType, RolloutStatus

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


@dataclass
class TeardownPlan:
    intent: FabricIntent
    targets: list[NodeTarget]


class RolloutService:
    """One per worker process: the in-flight apply lives in :class:`JobRegistry` (memory)."""

    def __init__(self, rt: ServiceRuntime, box: SecretBox, settings: RolloutSettings) -> None:
        self.rt, self.box, self.settings = rt, box, settings
        self.registry = JobRegistry()
        self.vnis = settings.vni_list()
        self._teardown: asyncio.Task | None = None
        self._teardown_job_id = ""

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

    def _busy(self) -> None:
        cur = self.registry.current()
        if cur is not None and cur.job_status is JobStatus.RUNNING:
            raise Conflict(f"fabric apply {cur.job_id} is still running", field="apply_job_id")
        if self._teardown is not None and not self._teardown.done():
            raise Conflict(f"fabric teardown {self._teardown_job_id} is still running")

    async def _publish(self, ev: RolloutEvent, cause: Any = None) -> None:
        entity = ev.node_ip or ev.job_id
        await self.rt.bus.publish_event(
            FabricRolloutEvent(**ev.model_dump(mode="json")),
            self.rt.bus.subjects.evt("fabric", ev.state, entity),
            cause=cause,
            entity=entity,
        )

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

    # -- apply ------------------------------------------------------------------------------

    async def apply_check(self, q: FabricApplyCheck) -> ApplyAccepted:
        node_ip = _check_ip(q.node_ip) if q.node_ip else ""
        self._busy()
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

    async def on_apply(self, cmd: StartFabricApply, ctx: HandlerContext) -> None:
        async with self._db().session() as s:
            seen = await rollout_store.get_job(s, cmd.job_id)
        cur = self.registry.current()
        if seen is not None and (
            seen.job_status != "running" or (cur is not None and cur.job_id == cmd.job_id)
        ):
            return  # redelivered: done already, or running here
        try:
            self._busy()
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
        )
        whole = not cmd.node_ip
        try:
            task = self.registry.start(job)
        except Conflict as exc:
            await self._fail_job(cmd, exc.message, ctx.envelope)
            return
        await self._save(job.summary)
        if whole:
            await self._set_status(RolloutStatus.ROLLING_OUT)
        while not task.done():
            await asyncio.wait({task}, timeout=self.settings.progress_interval)
            with contextlib.suppress(Exception):
                await ctx.in_progress()
        summary = task.result()
        await self._save(summary)
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
        self.registry.cancel(q.job_id)  # NotFound unless it is the in-flight apply
        return CancelAccepted(job_id=q.job_id, message="cancellation requested; nodes roll back to baseline")

    async def latest(self, _q: FabricLatestQuery) -> FabricJobView:
        cur = self.registry.current()
        if cur is not None and cur.job_status is JobStatus.RUNNING:
            return rollout_store.job_view(cur)
        async with self._db().session() as s:
            view = await rollout_store.latest_job(s)
        if view is None:
            raise NotFound("no fabric job has run yet")
        if view.job_status == "running" and self._teardown_job_id != view.job_id:
            # Not running in this process: the worker restarted under it.
            view = view.model_copy(update={"job_status": "failed", "error": "interrupted (worker restarted)"})
        return view

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
        self._busy()
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

    # -- whole-fabric teardown (DELETE /fabric-config) --------------------------------------

    async def prepare_teardown(self) -> TeardownPlan | None:
        """Before the config is deleted: what to tear down (None: nothing was ever allocated)."""
        self._busy()
        async with self._db().session() as s:
            row = await store.load(s)
            allocated = await rollout_store.allocations(s) if row is not None else {}
        if row is None or not allocated:
            return None
        try:
            intent = self.intent_of(row)
            targets = [t for t in await self.targets() if t.node_ip in allocated]
        except KariosError as exc:
            log.warning("fabric teardown skipped", reason=exc.message)
            return None
        return TeardownPlan(intent, targets) if targets else None

    def start_teardown(self, plan: TeardownPlan | None, result: DeleteResult) -> DeleteResult:
        if plan is None:
            return result
        job_id = str(uuid.uuid4())

        async def sink(ev: RolloutEvent) -> None:
            await self._publish(ev)

        async def run() -> None:
            await self._save(
                JobSummary(job_id=job_id, job_type=JobType.TEARDOWN, total_nodes=len(plan.targets))
            )
            summary = await run_teardown_job(
                plan.intent,
                plan.targets,
                concurrency=self.settings.concurrency,
                options=self.settings.options(),
                sink=sink,
                job_id=job_id,
            )
            await self._save(summary)

        self._teardown_job_id = job_id
        self._teardown = asyncio.get_running_loop().create_task(run())
        return result.model_copy(
            update={
                "teardown_job_id": job_id,
                "message": f"{result.message}; teardown of {len(plan.targets)} node(s) started",
            }
        )

    async def decorate(self, view: FabricConfigView) -> FabricConfigView:
        """``last_job`` on GET fabric-config when the rollout failed or is degraded."""
        if view.rollout_status not in (RolloutStatus.FAILED, RolloutStatus.DEGRADED):
            return view
        async with self._db().session() as s:
            job = await rollout_store.latest_job(s)
        return view.model_copy(update={"last_job": job.model_dump(mode="json") if job else None})

    async def stop(self) -> None:
        for task in (self._teardown,):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


def register_rollout(
    rt: ServiceRuntime, box: SecretBox, settings: RolloutSettings | None = None
) -> RolloutService:
    """Wire the rollout's handlers on ``rt.bus``; returns the service for app.py's few hooks."""
    svc = RolloutService(rt, box, settings or RolloutSettings())
    sub = rt.bus.subjects
    rt.bus.command_handler("fabric", StartFabricApply, svc.on_apply, verb="apply", concurrency=1)
    rt.bus.query_responder(sub.request("fabric", "apply_check"), FabricApplyCheck, svc.apply_check)
    rt.bus.query_responder(sub.request("fabric", "cancel_apply"), CancelFabricApply, svc.cancel)
    rt.bus.query_responder(sub.request("fabric", "preflight"), FabricPreflightRequest, svc.preflight)
    rt.bus.query_responder(sub.request("fabric", "teardown_node"), TeardownFabricNode, svc.teardown_node)
    rt.bus.query_responder(sub.query("fabric", "latest"), FabricLatestQuery, svc.latest)
    rt.bus.query_responder(sub.query("fabric", "postdeploy"), PostdeployQuery, svc.postdeploy)
    return svc
