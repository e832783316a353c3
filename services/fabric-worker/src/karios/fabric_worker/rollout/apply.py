"""Use cases of a fabric apply: request it (the gateway's one request), run it (the command),
cancel it, and read the latest job.

``POST .../apply`` is ONE bus request: :func:`request_apply` checks (config, nothing running,
nodes registered: the only inventory round trip), writes the queued job row with the node
access it found (credentials still encrypted) and sends ``cmd.fabric.apply``; the 202 carries
the real job id. :func:`run_apply` claims the row and decrypts the secrets just before the
first SSH; it asks the bus nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from karios.common.bus.runtime import HandlerContext
from karios.common.contracts.fabric_rollout import (
    ApplyAccepted,
    CancelAccepted,
    CancelFabricApply,
    FabricJobView,
    FabricLatestQuery,
    PreflightBlocked,
    PreflightBlocker,
    RequestFabricApply,
    StartFabricApply,
)
from karios.common.contracts.inventory import NodeAccess
from karios.common.errors import (
    Conflict,
    Forbidden,
    KariosError,
    NotFound,
    ServiceUnavailable,
    ValidationFailed,
)
from karios.common.telemetry import get_logger
from karios.fabric_worker.config import store
from karios.fabric_worker.config.ackgate import ADMIN_ROLE
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.models import FabricConfigRow, FabricJobRow
from karios.fabric_worker.rollout import judge, recovery
from karios.fabric_worker.rollout.access import baseline_context, check_ip, intent_of
from karios.fabric_worker.rollout.facts import NodeFacts, facts_to_dict
from karios.fabric_worker.rollout.intent import NodeOverride
from karios.fabric_worker.rollout.jobs import ApplyJob, RolloutEvent
from karios.fabric_worker.rollout.repository import RUNNING
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.summary import JobStatus, JobSummary, JobType, RolloutStatus

log = get_logger(__name__)
NO_NODES = "no registered node has an OS IP to roll the fabric out to"


async def check_apply(
    svc: RolloutService, node_ip: str = "", *, force: bool = False
) -> tuple[FabricConfigRow, list[NodeAccess], list[PreflightBlocker]]:
    """Whether an apply may start now: (the config row checked, the nodes it would reach, the
    preflight blockers a fabric_admin forced past). Decrypts nothing."""
    await svc.repo.check_idle()
    row = await svc.repo.config()
    if not svc.vnis:
        raise ValidationFailed(
            "vnis: no L2 VNI is configured (KARIOS_FABRIC_VNIS is empty): the nodes would get no "
            "overlay; set e.g. KARIOS_FABRIC_VNIS=10000",
            field="vnis",
        )
    intent = intent_of(row, svc.settings)  # 409 naming the field when the config cannot be rolled out
    access = await svc.node_access(node_ip)
    if not access:
        raise Conflict(NO_NODES)
    found = _blockers(svc, row, intent.vxlan_mtu, access, whole=not node_ip)
    if found and not force:
        largest = judge.max_vxlan_mtu(svc.verdicts.seen(row.preflight_nodes or []).values())
        raise PreflightBlocked(
            judge.headline(found, largest),
            field=found[0].field,
            details=judge.refusal_details(found, largest),
        )
    return row, access, found


async def _still(session: Any, checked: FabricConfigRow) -> None:
    """In the job row's transaction, under the config lock: the configuration is still the one
    :func:`check_apply` judged (a write that landed in between: 409, send the apply again)."""
    now = await store.load(session)
    if now is None or now.updated_at != checked.updated_at:
        raise Conflict("the fabric configuration changed while the apply was checked; send it again")


def _blockers(
    svc: RolloutService, row: FabricConfigRow, vxlan_mtu: int, access: list[NodeAccess], *, whole: bool
) -> list[PreflightBlocker]:
    """The last preflight's verdict on the nodes this apply reaches (nodes it never saw pass)."""
    cfg = store.fields_of(row)
    capacity = VtepPool.of(
        cfg.router_id_base, cfg.router_id_prefix_len, [cfg.fabric_switch_peering_ip]
    ).total_usable
    return svc.verdicts.blockers(
        row.preflight_nodes or [],
        frozenset(a.node_ip for a in access),
        vxlan_mtu=vxlan_mtu,
        capacity=capacity,
        needed=len(access) if whole else 0,
        prefix_len=cfg.router_id_prefix_len,
    )


def _forced(q: RequestFabricApply) -> bool:
    """`force` counts for a fabric_admin only (the route requires it; checked again here)."""
    if q.force and q.caller_role != ADMIN_ROLE:
        raise Forbidden(f"force: needs role {ADMIN_ROLE} (caller has {q.caller_role or 'none'})")
    return q.force


async def request_apply(svc: RolloutService, q: RequestFabricApply) -> ApplyAccepted:
    node_ip = check_ip(q.node_ip) if q.node_ip else ""
    checked, access, forced = await check_apply(svc, node_ip, force=_forced(q))
    if forced:
        log.warning(
            "fabric apply forced past preflight blockers",
            caller=q.caller,
            blockers=[b.message for b in forced],
        )
    job_id = str(uuid.uuid4())
    summary = JobSummary(
        job_id=job_id, job_type=JobType.APPLY, strict=svc.settings.strict, total_nodes=len(access)
    )
    request = {
        "node_ip": node_ip,
        "vnis": list(svc.vnis),
        "caller": q.caller,
        "forced": [b.message for b in forced],
        "access": [a.model_dump(mode="json") for a in access],
    }
    cmd = StartFabricApply(job_id=job_id, node_ip=node_ip, caller=q.caller)
    subject = svc.rt.bus.subjects.cmd("fabric", "apply")

    async def command(session: Any) -> None:  # in the job row's transaction (the outbox, ADR 0002)
        await _still(session, checked)
        await svc.outbox.add(session, cmd, subject, entity=job_id, msg_id=job_id)

    # Under the config lock: 409 when another job got in first; a config write waits for it.
    await svc.repo.queue_job(summary, request, then=command)
    if svc.after_commit is not None:
        svc.after_commit()  # chaos tests: die between the commit and the relay
    what = f"node {node_ip}" if node_ip else "every registered node"
    note = f" (forced past {len(forced)} preflight blocker(s))" if forced else ""
    return ApplyAccepted(
        apply_job_id=job_id,
        created=True,
        id=checked.id,
        message=f"fabric apply to {what} queued{note}; follow SSE channel fabric (fabric_switch) or "
        f"job:{job_id}",
    )


async def fail_job(
    svc: RolloutService, job_id: str, error: str, cause: Any = None, *, held: bool = False
) -> None:
    """End the job failed before it ran (`held`: under this replica's lease)."""
    summary = JobSummary(
        job_id=job_id,
        job_type=JobType.APPLY,
        job_status=JobStatus.FAILED,
        rollout_status=RolloutStatus.FAILED,
        state="apply_failed",
        progress=100,
        error=error,
    )
    await (svc.repo.finish(summary) if held else svc.repo.save_job(summary))
    await svc.publish(
        RolloutEvent(job_id=job_id, job_type=JobType.APPLY, state="apply_failed", message=error), cause
    )


def baseline_keeper(svc: RolloutService, job_id: str) -> Callable[[str, NodeFacts], Awaitable[None]]:
    async def keep(node_ip: str, facts: NodeFacts) -> None:
        blob = svc.box.encrypt(json.dumps(facts_to_dict(facts)), context=baseline_context(job_id, node_ip))
        try:
            await svc.repo.keep_baseline(job_id, node_ip, blob)
        except Exception as exc:
            raise ServiceUnavailable(
                f"{node_ip}: baseline not persisted ({type(exc).__name__}); node left untouched"
            ) from None

    return keep


async def _prepare(
    svc: RolloutService, row: FabricJobRow, cmd: StartFabricApply, ctx: HandlerContext
) -> ApplyJob:
    """The job, secrets decrypted now: the first SSH follows."""
    config = await svc.repo.config()
    intent = intent_of(config, svc.settings, svc.box)
    access = [NodeAccess.model_validate(a) for a in (row.request or {}).get("access") or []]
    targets = await svc.targets_of(access)
    if not targets:
        raise Conflict(NO_NODES)
    vteps = await svc.repo.allocate([t.node_ip for t in targets])

    async def sink(ev: RolloutEvent) -> None:
        await svc.publish(ev, ctx.envelope)

    return ApplyJob(
        intent,
        targets,
        vteps,
        strict=svc.settings.strict,
        concurrency=svc.settings.concurrency,
        overrides=[NodeOverride(**o) for o in (config.node_overrides or []) if isinstance(o, dict)],
        options=svc.settings.options(),
        sink=sink,
        job_id=cmd.job_id,
        before_change=baseline_keeper(svc, cmd.job_id),
    )


async def run_apply(svc: RolloutService, cmd: StartFabricApply, ctx: HandlerContext) -> None:
    """``cmd.fabric.apply``: claim the queued job row and run it under this replica's lease."""
    svc.track()
    seen = await svc.repo.get_row(cmd.job_id)
    if seen is None or seen.job_status != RUNNING:
        return  # done already (or never queued: nothing to run)
    if seen.owner:
        if seen.owner != svc.instance:
            await recovery.take_over(svc, cmd.job_id)  # only when its replica is gone
        return  # running here, or running on a live peer
    row = await svc.repo.claim(cmd.job_id, svc.settings.lease)
    if row is None:
        return  # another replica claimed it
    try:
        job = await _prepare(svc, row, cmd, ctx)
        task = svc.registry.start(job)
    except ServiceUnavailable:
        await svc.repo.requeue(cmd.job_id)
        raise  # database hiccup: the bus redelivers, the row is claimable again
    except KariosError as exc:
        await fail_job(svc, cmd.job_id, exc.message, ctx.envelope, held=True)
        return
    await _supervise(svc, job, task, cmd, ctx)


async def _supervise(
    svc: RolloutService, job: ApplyJob, task: Any, cmd: StartFabricApply, ctx: HandlerContext
) -> None:
    whole = not cmd.node_ip
    if whole:
        await svc.repo.set_rollout_status(RolloutStatus.ROLLING_OUT)
    held = await svc.hold_lease(cmd.job_id, task, ctx=ctx, summary=lambda: job.summary, on_cancel=job.cancel)
    if not held:
        return
    if task.cancelled():  # worker stopping: the baselines stay, a peer rolls back
        await svc.repo.release(cmd.job_id)
        raise ServiceUnavailable(f"fabric-worker stopped during apply {cmd.job_id}")
    summary = task.result()
    status = summary.rollout_status if whole else None
    if not whole and summary.job_status is not JobStatus.COMPLETED:
        status = RolloutStatus.DEGRADED
    if not await svc.repo.finish(summary, status):
        return
    await svc.remember({r.node_ip: r.host_key for r in job.results if r.host_key and r.host_key_first_seen})
    log.info(
        "fabric apply finished",
        job_id=summary.job_id,
        job_status=str(summary.job_status),
        completed=summary.completed_nodes,
        failed=summary.failed_nodes,
    )


async def cancel(svc: RolloutService, q: CancelFabricApply) -> CancelAccepted:
    """Any replica answers: the job row says whether `job_id` is in flight (404 otherwise);
    the flag is stored (durable) and broadcast to every replica (the runner reacts at once)."""
    if not await svc.repo.request_cancel(q.job_id):
        raise NotFound(f"no in-flight fabric apply {q.job_id}")
    svc.registry.cancel_local(q.job_id)
    try:  # the flag is polled anyway
        await svc.rt.bus.broadcast(q, svc.cancel_subject)
    except Exception as exc:
        log.warning("fabric cancel not broadcast", job_id=q.job_id, error=type(exc).__name__)
    return CancelAccepted(job_id=q.job_id, message="cancellation requested; nodes roll back to baseline")


async def on_cancel_broadcast(svc: RolloutService, q: CancelFabricApply) -> None:
    if svc.registry.cancel_local(q.job_id):
        log.info("fabric apply cancel received", job_id=q.job_id)


async def latest(svc: RolloutService, _q: FabricLatestQuery) -> FabricJobView:
    cur = svc.registry.running_job()
    if cur is not None:
        return cur.summary
    view = await svc.repo.latest_job()
    if view is None:
        raise NotFound("no fabric job has run yet")
    return view
