"""Use cases of removing the fabric: from every node when the config is deleted (a durable
command, re-run by a peer when its replica dies), and from one node on request."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from karios.common.bus.runtime import HandlerContext
from karios.common.contracts.fabric import DeleteResult
from karios.common.contracts.fabric_rollout import NodeTeardownView, StartFabricTeardown, TeardownFabricNode
from karios.common.errors import KariosError, NotFound, ServiceUnavailable
from karios.common.telemetry import get_logger
from karios.fabric_worker.models import FabricJobRow
from karios.fabric_worker.rollout.access import check_ip, intent_of
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.jobs import RolloutEvent, run_teardown_job
from karios.fabric_worker.rollout.node_ops import teardown_node as teardown_one
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.summary import JobStatus, JobSummary, JobType, RolloutStatus

log = get_logger(__name__)


async def one_target(svc: RolloutService, node_ip: str) -> NodeTarget:
    targets = await svc.targets(check_ip(node_ip))
    if not targets:
        raise NotFound(f"node {node_ip} has no OS IP registered")
    return targets[0]


async def delete_config(svc: RolloutService, caller: str = "") -> DeleteResult:
    """Delete the config and, when VTEPs were allocated, queue the teardown of those nodes in
    the same transaction (job row, no owner yet), then send ``cmd.fabric.teardown``. The
    command is durable (retried after a worker restart); a queued row nobody picks up within
    the lease is taken over by any replica's reaper."""
    await svc.repo.check_idle()
    job_id = str(uuid.uuid4())
    registered: set[str] | None = None
    if await svc.repo.any_allocated():
        try:  # nodes no longer registered cannot be reached: nothing to queue for them
            registered = {a.node_ip for a in await svc.node_access()}
        except KariosError as exc:  # inventory down: queue them all, the job resolves later
            log.warning("fabric teardown: node registry unavailable", reason=exc.message)
    summary = JobSummary(job_id=job_id, job_type=JobType.TEARDOWN, state="teardown_queued")
    request = {"vnis": list(svc.vnis), "caller": caller}
    result, allocated = await svc.repo.delete_config_and_queue(summary, request, registered)
    if not allocated:
        return result
    with contextlib.suppress(KariosError):  # the reaper sends nothing: it runs the job itself
        await svc.rt.bus.send_command(
            StartFabricTeardown(
                job_id=job_id, node_ips=sorted(allocated), vnis=list(svc.vnis), caller=caller
            ),
            svc.rt.bus.subjects.cmd("fabric", "teardown"),
            entity=job_id,
            msg_id=job_id,
        )
    return result.model_copy(
        update={
            "teardown_job_id": job_id,
            "message": f"{result.message}; teardown of {len(allocated)} node(s) queued",
        }
    )


async def run_teardown(svc: RolloutService, cmd: StartFabricTeardown, ctx: HandlerContext) -> None:
    """``cmd.fabric.teardown``: claim the queued row and run it."""
    svc.track()
    row = await svc.repo.claim(cmd.job_id, svc.settings.lease)
    if row is None:
        return  # finished, or held by a live replica
    await run_claimed(svc, row, ctx)


async def run_claimed(svc: RolloutService, row: FabricJobRow, ctx: HandlerContext | None) -> None:
    """Run a teardown this replica holds the lease of (from the command or a take-over)."""
    job_id = row.job_id
    req = row.request or {}
    node_ips = set(req.get("node_ips") or [])
    vnis = tuple(int(v) for v in req.get("vnis") or svc.vnis)
    cause = ctx.envelope if ctx is not None else None

    async def sink(ev: RolloutEvent) -> None:
        await svc.safe_publish(ev, cause)

    async def work() -> JobSummary:
        targets = [t for t in await svc.targets() if t.node_ip in node_ips]
        return await run_teardown_job(
            None,
            targets,
            concurrency=svc.settings.concurrency,
            options=svc.settings.options(),
            sink=sink,
            job_id=job_id,
            vnis=vnis,
        )

    task = asyncio.get_running_loop().create_task(work())
    svc.teardown_task = task
    if not await svc.hold_lease(job_id, task, ctx=ctx):
        return
    if task.cancelled():
        await svc.repo.release(job_id)
        if ctx is not None:
            raise ServiceUnavailable(f"fabric-worker stopped during teardown {job_id}")
        return
    exc = task.exception()
    if isinstance(exc, ServiceUnavailable) and ctx is not None:
        await svc.repo.release(job_id)
        raise exc  # inventory unavailable: the bus retries the command
    if exc is not None:
        message = exc.message if isinstance(exc, KariosError) else type(exc).__name__
        failed = JobSummary(
            job_id=job_id,
            job_type=JobType.TEARDOWN,
            job_status=JobStatus.FAILED,
            rollout_status=RolloutStatus.FAILED,
            state="teardown_failed",
            progress=100,
            error=message,
        )
        await svc.repo.finish(failed)
        await sink(
            RolloutEvent(job_id=job_id, job_type=JobType.TEARDOWN, state="teardown_failed", message=message)
        )
        return
    summary = task.result()
    await svc.repo.finish(summary)
    log.info("fabric teardown finished", job_id=job_id, job_status=str(summary.job_status))


async def teardown_node(svc: RolloutService, q: TeardownFabricNode) -> NodeTeardownView:
    target = await one_target(svc, q.node_ip)
    await svc.repo.check_idle()
    intent = intent_of(await svc.repo.config(), svc.settings, svc.box)
    res = await teardown_one(target, intent, options=svc.settings.options())
    if res.removed:
        await svc.repo.release_vtep(target.node_ip)
    if res.removed and res.steps:
        # The fabric is no longer on every node: "degraded" while others keep it (an apply
        # brings this one back), "pending" when no node has it any more.
        left = await svc.repo.any_allocated()
        await svc.repo.set_rollout_status(RolloutStatus.DEGRADED if left else RolloutStatus.PENDING)
    await svc.publish(
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
