"""Fabric jobs: apply (with strict mode and cancel) and teardown over many nodes, emitting
events through a sink so wiring to the bus/SSE is a thin layer.

Event states: ``apply_started``, ``node_*`` (see :mod:`node`), ``apply_cancelling`` →
``apply_cancelled``, ``apply_rolling_back``, ``apply_completed`` / ``apply_degraded`` /
``apply_failed``; ``teardown_started``, ``teardown_node_removed`` / ``teardown_node_failed``,
``teardown_completed`` / ``teardown_failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

from pydantic import BaseModel

from karios.common.errors import Conflict, NotFound
from karios.fabric_worker.rollout.intent import FabricIntent, NodeOverride, NodeTarget
from karios.fabric_worker.rollout.node import (
    BaselineFn,
    NodeEvent,
    NodeResult,
    NodeRollout,
    RolloutOptions,
    teardown_node,
)
from karios.fabric_worker.rollout.summary import (
    JobNode,
    JobStatus,
    JobSummary,
    JobType,
    finalize,
    record_node,
)

log = logging.getLogger(__name__)


class RolloutEvent(BaseModel):
    """One progress event (SSE channel `fabric`, event type `fabric_switch`). No secrets."""

    job_id: str
    job_type: JobType
    state: str
    progress: int = 0
    node_ip: str = ""
    fqdn: str = ""
    message: str = ""


EventSink = Callable[[RolloutEvent], Awaitable[None]]


async def _discard(_: RolloutEvent) -> None:
    return None


def _job_node(r: NodeResult) -> JobNode:
    return JobNode(
        node_ip=r.node_ip,
        fqdn=r.fqdn,
        ok=r.ok,
        reachable=r.reachable,
        error=r.error,
        changed=r.changed,
        rolled_back=r.rolled_back,
        vtep_ip=r.vtep_ip,
    )


class ApplyJob:
    """Apply `intent` to `nodes`: bounded fan-out, per-node rollback on failure; in strict
    mode a failure (and always a cancel) rolls every touched node back to its baseline."""

    def __init__(
        self,
        intent: FabricIntent,
        nodes: Sequence[NodeTarget],
        vtep_allocations: dict[str, str],
        *,
        strict: bool = False,
        concurrency: int = 16,
        overrides: Sequence[NodeOverride] = (),
        options: RolloutOptions | None = None,
        sink: EventSink | None = None,
        job_id: str | None = None,
        before_change: BaselineFn | None = None,
    ) -> None:
        self.job_id = job_id or str(uuid.uuid4())
        self._before_change = before_change
        self.intent = intent
        self.nodes = list(nodes)
        self.vteps = dict(vtep_allocations)
        self.strict = strict
        self.concurrency = max(1, concurrency)
        self.overrides = {o.node_ip: o for o in overrides}
        self.options = options or RolloutOptions()
        self._sink = sink or _discard
        self._abort = asyncio.Event()
        self._cancelled = False
        self._strict_failed = False
        self.results: list[NodeResult] = []
        self.summary = JobSummary(
            job_id=self.job_id, job_type=JobType.APPLY, strict=strict, total_nodes=len(self.nodes)
        )

    @property
    def running(self) -> bool:
        return self.summary.job_status is JobStatus.RUNNING

    @property
    def cancel_requested(self) -> bool:
        return self._cancelled

    async def _emit(self, state: str, *, node_ip: str = "", fqdn: str = "", message: str = "") -> None:
        self.summary = self.summary.model_copy(update={"state": state})
        event = RolloutEvent(
            job_id=self.job_id,
            job_type=JobType.APPLY,
            state=state,
            progress=self.summary.progress,
            node_ip=node_ip,
            fqdn=fqdn,
            message=message,
        )
        try:
            await self._sink(event)
        except Exception:  # a broken sink must not break the rollout
            log.exception("fabric event sink failed for %s", state)

    async def _on_node(self, ev: NodeEvent) -> None:
        await self._emit(ev.state, node_ip=ev.node_ip, fqdn=ev.fqdn, message=ev.message)

    def cancel(self) -> None:
        """Request cancellation (idempotent); `apply_cancelling` is emitted at once."""
        if self._cancelled or not self.running:
            return
        self._cancelled = True
        self._abort.set()
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self._emit("apply_cancelling"))

    async def run(self) -> JobSummary:
        await self._emit("apply_started", message=f"{len(self.nodes)} node(s)")
        sem = asyncio.Semaphore(self.concurrency)
        runs: list[NodeRollout] = []
        for t in self.nodes:
            runs.append(
                NodeRollout(
                    t,
                    self.intent,
                    self.vteps.get(t.node_ip, ""),
                    override=self.overrides.get(t.node_ip),
                    options=self.options,
                    progress=self._on_node,
                    before_change=self._before_change,
                )
            )

        async def one(run: NodeRollout) -> None:
            async with sem:
                if self._abort.is_set():
                    run.result.error = "not started: apply aborted"
                elif not run.vtep_ip:
                    run.result.error = "no VTEP address allocated for this node"
                else:
                    await run.apply(self._abort)
            self.summary = record_node(self.summary, _job_node(run.result))
            if not run.result.ok and self.strict and not self._abort.is_set():
                self._strict_failed = True
                self._abort.set()

        await asyncio.gather(*(one(r) for r in runs))
        if self._cancelled or self._strict_failed:
            to_roll = [r for r in runs if r.result.touched]
            await self._emit("apply_rolling_back", message=f"{len(to_roll)} touched node(s)")
        else:
            to_roll = [r for r in runs if r.result.touched and not r.result.ok]

        async def back(run: NodeRollout) -> None:
            async with sem:
                await run.rollback()
            if self._cancelled or self._strict_failed:
                run.result.ok = False
                run.result.error = run.result.error or "rolled back"
            self.summary = record_node(self.summary, _job_node(run.result))

        await asyncio.gather(*(back(r) for r in to_roll))
        self.results = [r.result for r in runs]
        self.summary = finalize(
            self.summary, cancelled=self._cancelled, aborted_by_strict=self._strict_failed
        )
        final = {
            JobStatus.CANCELLED: "apply_cancelled",
            JobStatus.COMPLETED: "apply_completed",
            JobStatus.PARTIAL: "apply_degraded",
        }.get(self.summary.job_status, "apply_failed")
        await self._emit(final, message=self.summary.error)
        return self.summary


async def run_teardown_job(
    intent: FabricIntent | None,
    nodes: Sequence[NodeTarget],
    *,
    concurrency: int = 16,
    options: RolloutOptions | None = None,
    sink: EventSink | None = None,
    job_id: str | None = None,
    vnis: tuple[int, ...] = (),
) -> JobSummary:
    """Remove the fabric from every node (used by `DELETE /fabric-config`)."""
    sink = sink or _discard
    summary = JobSummary(
        job_id=job_id or str(uuid.uuid4()), job_type=JobType.TEARDOWN, total_nodes=len(nodes)
    )

    async def emit(state: str, **kw: str) -> None:
        with contextlib.suppress(Exception):
            await sink(
                RolloutEvent(
                    job_id=summary.job_id,
                    job_type=JobType.TEARDOWN,
                    state=state,
                    progress=summary.progress,
                    **kw,
                )
            )

    await emit("teardown_started")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: NodeTarget) -> None:
        nonlocal summary
        async with sem:
            res = await teardown_node(t, intent, options=options, vnis=vnis)
        node = JobNode(
            node_ip=t.node_ip,
            fqdn=res.fqdn,
            ok=res.removed,
            reachable=res.reachable,
            error="" if res.removed else res.message,
        )
        summary = record_node(summary, node)
        await emit(
            "teardown_node_removed" if res.removed else "teardown_node_failed",
            node_ip=t.node_ip,
            fqdn=res.fqdn,
            message=res.message,
        )

    await asyncio.gather(*(one(t) for t in nodes))
    summary = finalize(summary, cancelled=False, aborted_by_strict=False)
    await emit("teardown_completed" if summary.job_status is JobStatus.COMPLETED else "teardown_failed")
    return summary


class JobRegistry:
    """The in-flight apply (one at a time) and the latest job, for cancel and `latest`."""

    def __init__(self) -> None:
        self._inflight: ApplyJob | None = None
        self._task: asyncio.Task | None = None
        self.latest: JobSummary | None = None

    def start(self, job: ApplyJob) -> asyncio.Task:
        if self._inflight is not None and self._inflight.running:
            raise Conflict(f"fabric apply {self._inflight.job_id} is still running")
        self._inflight = job
        self.latest = job.summary

        async def runner() -> JobSummary:
            summary = await job.run()
            self.latest = summary
            return summary

        self._task = asyncio.get_running_loop().create_task(runner())
        return self._task

    def cancel(self, job_id: str) -> None:
        """Idempotent; NotFound when `job_id` is not the in-flight apply."""
        if not self.cancel_local(job_id):
            raise NotFound(f"no in-flight fabric apply {job_id}")

    def cancel_local(self, job_id: str) -> bool:
        """Cancel `job_id` when it runs in this process (idempotent); False otherwise."""
        job = self._inflight
        if job is None or job.job_id != job_id or not job.running:
            return False
        job.cancel()
        return True

    def running_job(self) -> ApplyJob | None:
        return self._inflight if self._inflight is not None and self._inflight.running else None

    async def halt(self) -> None:
        """Stop the in-flight apply where it stands, without rollback (worker shutdown): its
        baselines are persisted, so a peer (or this worker after a restart) rolls it back."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def current(self) -> JobSummary | None:
        if self._inflight is not None and self._inflight.running:
            return self._inflight.summary
        return self.latest
