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

from karios.common.contracts.fabric_rollout import FabricRolloutEvent
from karios.common.errors import Conflict, NotFound
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry_tracing import job_span
from karios.fabric_worker import metrics
from karios.fabric_worker.rollout.facts import NodeFacts
from karios.fabric_worker.rollout.intent import FabricIntent, NodeOverride, NodeTarget
from karios.fabric_worker.rollout.node import (
    BaselineFn,
    NodeEvent,
    NodeResult,
    NodeRollout,
    RolloutOptions,
)
from karios.fabric_worker.rollout.node_ops import teardown_node
from karios.fabric_worker.rollout.overlay import RolledOut, RolledOutVtep
from karios.fabric_worker.rollout.summary import (
    JobNode,
    JobStatus,
    JobSummary,
    JobType,
    finalize,
    finalize_interrupted,
    record_node,
)

log = logging.getLogger(__name__)


# One progress event (SSE channel `fabric`, event type `fabric_switch`): the contract model.
RolloutEvent = FabricRolloutEvent
EventSink = Callable[[RolloutEvent], Awaitable[None]]
NODE_DONE = frozenset({"node_ready", "node_failed"})  # a node's apply ended (before any rollback)


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
        intent: FabricIntent | None,
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
        resume: JobSummary | None = None,
        rolled_out: Sequence[RolledOutVtep] = (),
    ) -> None:
        self.job_id = job_id or str(uuid.uuid4())
        # VTEPs that passed the post-deploy checks (and `rolled_out`: known rolled out before this
        # job, not part of it): a node checked later must have an IMET route from each.
        self.rolled_out = RolledOut(tuple(rolled_out))
        self._before_change = before_change
        self.intent = intent
        self.nodes = list(nodes)
        self.vteps = dict(vtep_allocations)
        self.strict = strict
        self.concurrency = max(1, concurrency)
        self.overrides = {o.node_ip: o for o in overrides}
        self.options = (options or RolloutOptions()).for_fanout(min(len(self.nodes), self.concurrency))
        self._sink = sink or _discard
        self._abort = asyncio.Event()
        self._cancelled = False
        self._strict_failed = False
        self.results: list[NodeResult] = []
        self._runs: dict[str, NodeRollout] = {}
        self.summary = resume or JobSummary(
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
        run = self._runs.get(ev.node_ip)
        if run is not None and ev.state in NODE_DONE:
            # Count the node before its event goes out: the event's progress includes it.
            self.summary = record_node(self.summary, _job_node(run.result))
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
        runs = [self._node(t) for t in self.nodes]
        self._runs = {r.target.node_ip: r for r in runs}

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

        try:
            await asyncio.gather(*(one(r) for r in runs))
            await self._recheck(runs, sem)
        finally:
            await asyncio.gather(*(r.release() for r in runs))
        forced = self._cancelled or self._strict_failed
        if forced:
            to_roll = [r for r in runs if r.result.touched]
            await self._emit("apply_rolling_back", message=f"{len(to_roll)} touched node(s)")
        else:
            to_roll = [r for r in runs if r.result.touched and not r.result.ok]
        await self._roll_back(to_roll, sem, forced=forced)
        self.results = [r.result for r in runs]
        return await self._end(
            finalize(self.summary, cancelled=self._cancelled, aborted_by_strict=self._strict_failed)
        )

    async def _recheck(self, runs: list[NodeRollout], sem: asyncio.Semaphore) -> None:
        """Every node's IMET routes from every VTEP the job rolled out: the nodes whose own check
        passed before all the others were counted are looked at once more."""

        async def one(run: NodeRollout) -> None:
            async with sem:
                if self._abort.is_set():
                    return
                await run.recheck(self._abort)
            self.summary = record_node(self.summary, _job_node(run.result))
            if not run.result.ok and self.strict and not self._abort.is_set():
                self._strict_failed = True
                self._abort.set()

        await asyncio.gather(*(one(r) for r in runs if r.needs_recheck()))

    async def recover(
        self, baselines: dict[str, NodeFacts], *, previous: str, cancelled: bool, missing: str = ""
    ) -> JobSummary:
        """Crash recovery: the replica that ran this job died after touching the nodes in
        `baselines` (persisted before each first change). Roll them back on the same path
        :meth:`run` uses, then end the job failed (cancelled when a cancel was requested).
        A touched node missing from ``self.nodes`` cannot be reached (`missing` says why)."""
        targets = {t.node_ip: t for t in self.nodes}
        fqdns = {n.node_ip: n.fqdn for n in self.summary.nodes}
        if baselines:
            await self._emit(
                "apply_rolling_back", message=f"{len(baselines)} touched node(s); worker {previous} stopped"
            )
        runs, stuck = [], []
        for node_ip, baseline in sorted(baselines.items()):
            if node_ip not in targets:
                stuck.append(f"{node_ip}: {missing or 'node no longer registered'}")
                continue
            run = self._node(targets[node_ip])
            run.baseline = baseline
            runs.append(run)
        await self._roll_back(runs, asyncio.Semaphore(self.concurrency), forced=False)
        for run in runs:
            if not run.result.rolled_back:
                stuck.append(f"{run.result.node_ip}: {run.result.error.removeprefix('rollback failed: ')}")
        back = [r.result.node_ip for r in runs if r.result.rolled_back]
        for ip in back:
            node = JobNode(
                node_ip=ip,
                fqdn=fqdns.get(ip, ""),
                rolled_back=True,
                error="interrupted; rolled back to baseline",
            )
            self.summary = record_node(self.summary, node)
        for item in stuck:
            ip, _, why = item.partition(": ")
            node = JobNode(node_ip=ip, fqdn=fqdns.get(ip, ""), error=f"interrupted; rollback failed: {why}")
            self.summary = record_node(self.summary, node)
        return await self._end(
            finalize_interrupted(self.summary, previous=previous, back=back, stuck=stuck, cancelled=cancelled)
        )

    def _node(self, target: NodeTarget) -> NodeRollout:
        assert self.intent is not None, "only recover() runs without an intent, and with no nodes"
        return NodeRollout(
            target,
            self.intent,
            self.vteps.get(target.node_ip, ""),
            override=self.overrides.get(target.node_ip),
            options=self.options,
            progress=self._on_node,
            before_change=self._before_change,
            rolled_out=self.rolled_out,
            keep_session=True,  # for the closing recheck: no second SSH handshake per node
        )

    async def _roll_back(self, runs: Sequence[NodeRollout], sem: asyncio.Semaphore, *, forced: bool) -> None:
        """Put `runs` back to their baselines (bounded); `forced`: the whole job aborts, so a node
        that succeeded is reported failed too. Shared by :meth:`run` and :meth:`recover`."""

        async def back(run: NodeRollout) -> None:
            async with sem:
                await run.rollback()
            if forced:
                run.result.ok = False
                run.result.error = run.result.error or "rolled back"
            self.summary = record_node(self.summary, _job_node(run.result))

        await asyncio.gather(*(back(r) for r in runs))

    async def _end(self, summary: JobSummary) -> JobSummary:
        """Store the terminal summary and emit the job's final event (shared by run/recover)."""
        self.summary = summary
        final = {
            JobStatus.CANCELLED: "apply_cancelled",
            JobStatus.COMPLETED: "apply_completed",
            JobStatus.PARTIAL: "apply_degraded",
        }.get(self.summary.job_status, "apply_failed")
        metrics.job_ended("apply", self.summary.job_status)
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
        nonlocal summary
        summary = summary.model_copy(update={"state": state})  # /latest shows the last event
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
            with job_span("karios.fabric-worker", "fabric.apply.run", None, bind={"job_id": job.job_id}):
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
        await cancel_and_wait(self._task, grace=5.0)

    def current(self) -> JobSummary | None:
        if self._inflight is not None and self._inflight.running:
            return self._inflight.summary
        return self.latest
