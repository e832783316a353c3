"""Continuous drift detection (use case): every ``drift_interval`` one replica (the one whose
lease claim on the ``drift_round`` row wins) looks at every node the fabric was applied to —
read-only: discovery + ``show bgp l2vpn evpn summary`` + ``show evpn vni`` — judges it against
what the nodes should carry (:mod:`.drift`), names each missing VTEP once and holds back what a
settling fabric shows (:mod:`.drift_rules`), stores the verdict, and publishes ``node_drifted`` /
``node_drift_cleared`` on the ``fabric`` channel when a node's reported state changes.

What the nodes should carry: the stored configuration once applied (``rollout_status`` ready or
degraded); while an edit is pending (or after a failed apply, whose nodes rolled back) the
configuration the last apply gave them (``applied_config``). Nothing when none was ever applied.
A round is skipped while an apply or teardown runs (its nodes are in flux). Repair: a node apply
(``POST …/node/{ip}/apply``).

Metrics (every replica, refreshed from the database each tick): ``karios_fabric_nodes_drifted``,
``karios_fabric_drift_last_check_timestamp_seconds``, ``karios_fabric_drift_round_seconds``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import UTC, datetime

from prometheus_client import Gauge

from karios.common.contracts.fabric_rollout import (
    DriftFinding,
    FabricDriftEvent,
    FabricDriftQuery,
    FabricDriftView,
    JobStatus,
    NodeDriftView,
    RolloutStatus,
)
from karios.common.errors import KariosError, NotFound
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.fabric_worker.models import FabricConfigRow, NodeDriftRow
from karios.fabric_worker.rollout.access import check_ip, intent_of
from karios.fabric_worker.rollout.drift import (
    NodeDrift,
    judge_drift,
    parse_remote_vteps,
    remote_vteps_command,
    unreachable,
)
from karios.fabric_worker.rollout.drift_rules import Settle, attribute, held_rows, hold, last_check
from karios.fabric_worker.rollout.facts import DISCOVER_SCRIPT, EVPN_SUMMARY_COMMAND, parse_facts
from karios.fabric_worker.rollout.intent import FabricIntent, NodeOverride, NodeTarget
from karios.fabric_worker.rollout.node import RolloutOptions
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.ssh import open_session, redact

log = get_logger(__name__)
_APPLIED = (RolloutStatus.READY, RolloutStatus.DEGRADED)
_LAST_APPLIED = (RolloutStatus.PENDING, RolloutStatus.FAILED)  # the nodes keep the last applied one


async def check_node(
    target: NodeTarget,
    intent: FabricIntent,
    *,
    vtep_ip: str | None,
    override: NodeOverride | None = None,
    options: RolloutOptions | None = None,
    expected_vteps: Iterable[str] = (),
) -> NodeDrift:
    """One node, read-only. Never raises: an unreachable node is a finding. `expected_vteps`:
    the other fabric nodes' VTEP addresses, each VNI should see them all."""
    opts = options or RolloutOptions()
    secrets = intent.secrets()
    try:
        async with open_session(target, connect_timeout=opts.connect_timeout, secrets=secrets) as s:
            facts = parse_facts((await s.run(DISCOVER_SCRIPT, limit_s=opts.command_timeout)).stdout)
            summary, remote = "", None
            if facts.frr_running:
                res = await s.run(EVPN_SUMMARY_COMMAND, check=False, limit_s=opts.command_timeout)
                summary = res.stdout
                vnis = await s.run(
                    remote_vteps_command(intent.vnis), check=False, limit_s=opts.command_timeout
                )
                remote = parse_remote_vteps(vnis.stdout)
    except (KariosError, ValueError) as exc:
        message = exc.message if isinstance(exc, KariosError) else f"unexpected discovery output: {exc}"
        return unreachable(target.node_ip, target.fqdn, redact(message, secrets))
    return judge_drift(
        target.node_ip,
        facts,
        summary,
        intent,
        vtep_ip=vtep_ip,
        override=override,
        remote_vteps=remote,
        expected_vteps=set(expected_vteps),
    )


def _row(d: NodeDrift, now: datetime) -> NodeDriftRow:
    return NodeDriftRow(
        node_ip=d.node_ip,
        fqdn=d.fqdn,
        drifted=d.drifted,
        findings=[f.model_dump() for f in d.findings],
        held=held_rows(d),
        frr_config_sha256=d.frr_config_sha256,
        intent_sha256=d.intent_sha256,
        checked_at=now,
        since=now,
    )


def _event(d: NodeDrift, now: datetime) -> FabricDriftEvent:
    who = f"{d.fqdn} ({d.node_ip})" if d.fqdn else d.node_ip
    message = (
        f"{who} drifted: " + "; ".join(f"{f.kind}: {f.message}" for f in d.findings)
        if d.drifted
        else f"{who} matches the fabric intent again"
    )
    return FabricDriftEvent(
        state="node_drifted" if d.drifted else "node_drift_cleared",
        node_ip=d.node_ip,
        fqdn=d.fqdn,
        drifted=d.drifted,
        findings=list(d.findings),
        message=message,
        checked_at=now.isoformat(),
    )


class DriftWatch:
    """The periodic loop and the metrics of one replica."""

    def __init__(self, svc: RolloutService) -> None:
        self.svc = svc
        self._task: asyncio.Task | None = None
        reg = svc.rt.registry
        self.m_drifted = Gauge(
            "karios_fabric_nodes_drifted", "Fabric nodes drifted from the intent", registry=reg
        )
        self.m_last = Gauge(
            "karios_fabric_drift_last_check_timestamp_seconds",
            "Unix time the last drift round ended (any replica)",
            registry=reg,
        )
        self.m_round = Gauge(
            "karios_fabric_drift_round_seconds", "Duration of this replica's last drift round", registry=reg
        )

    @property
    def interval(self) -> float:
        return self.svc.settings.drift_interval

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        tick = max(0.2, min(self.interval / 4, 5.0))  # claims race on the row; ticks only poll it
        while not self.svc.stopping:
            try:
                await self.tick()
            except Exception as exc:
                log.warning("fabric drift round failed", error=type(exc).__name__)
            await asyncio.sleep(tick)

    async def tick(self) -> bool:
        """Run a round when it is due and this replica wins the claim; refresh the metrics."""
        ran = False
        latest = await self.svc.repo.latest_job()
        busy = latest is not None and latest.job_status == JobStatus.RUNNING
        if not busy and await self.svc.repo.claim_drift_round(self.interval):
            t0 = time.monotonic()
            try:
                await run_round(self.svc)
            finally:
                await self.svc.repo.finish_drift_round()
            self.m_round.set(time.monotonic() - t0)
            ran = True
        await self.refresh_metrics()
        return ran

    async def refresh_metrics(self) -> None:
        rows = await self.svc.repo.drift_rows()
        self.m_drifted.set(sum(1 for r in rows if r.drifted))
        rnd = await self.svc.repo.drift_round()
        if rnd is not None and rnd.finished_at is not None:
            self.m_last.set(rnd.finished_at.timestamp())


async def _checked_config(svc: RolloutService) -> tuple[FabricConfigRow | None, str]:
    """What the nodes should carry, and which it is: ``config`` (the stored one, applied),
    ``last_applied`` (an edit is pending, or the last apply failed and rolled back), or none."""
    row = await svc.repo.config_or_none()
    if row is None:
        return None, ""
    if row.rollout_status in _APPLIED:
        return row, "config"
    if row.rollout_status in _LAST_APPLIED:
        applied = await svc.repo.applied_config()
        return (applied, "last_applied") if applied is not None else (None, "")
    return None, ""


async def _settle(svc: RolloutService) -> Settle:
    """The settle window opened by the end of the last apply/teardown."""
    job = await svc.repo.latest_job()
    since = None
    if job is not None and job.job_status != JobStatus.RUNNING:
        try:
            since = datetime.fromisoformat(job.updated_at)
        except ValueError:
            since = None
    return Settle(since=since, window=svc.settings.drift_settle)


async def run_round(svc: RolloutService) -> list[NodeDrift]:
    """Check every registered node that holds a VTEP address; store and announce changes."""
    row, against = await _checked_config(svc)
    if row is None:  # no applied intent (none, never applied, being deleted): nothing to drift from
        await svc.repo.forget_drift([])
        if await svc.repo.config_or_none() is None:
            await svc.repo.forget_applied()
        return []
    if against == "config" and await svc.repo.applied_config() is None:
        await svc.repo.keep_applied()  # applied before the record existed (migration 0007)
    intent = intent_of(row, svc.settings, svc.box)
    vteps = await svc.repo.allocations()
    access = [a for a in await svc.node_access() if a.node_ip in vteps]
    targets = await svc.targets_of(access)
    overrides = {o["node_ip"]: NodeOverride(**o) for o in row.node_overrides or [] if isinstance(o, dict)}
    gate = asyncio.Semaphore(svc.settings.concurrency)

    async def one(t: NodeTarget) -> NodeDrift:
        async with gate:
            return await check_node(
                t,
                intent,
                vtep_ip=vteps.get(t.node_ip),
                override=overrides.get(t.node_ip),
                options=svc.settings.options(),
                expected_vteps=fabric - {vteps.get(t.node_ip)},
            )

    fabric = {vteps[t.node_ip] for t in targets}
    results = attribute(list(await asyncio.gather(*(one(t) for t in targets))), vteps)
    await svc.repo.forget_drift([t.node_ip for t in targets])
    settle = await _settle(svc)
    last = {r.node_ip: last_check(r.checked_at, r.findings, r.held) for r in await svc.repo.drift_rows()}
    now = datetime.now(UTC)
    results = [hold(d, last.get(d.node_ip), settle, now) for d in results]
    for d in results:
        if await svc.repo.store_drift(_row(d, now)):
            log.info("fabric node drift changed", node_ip=d.node_ip, drifted=d.drifted, kinds=list(d.kinds))
            await _publish(svc, _event(d, now))
    return list(results)


async def _publish(svc: RolloutService, ev: FabricDriftEvent) -> None:
    try:
        await svc.rt.bus.publish_event(
            ev, svc.rt.bus.subjects.evt("fabric", ev.state, ev.node_ip), entity=ev.node_ip
        )
    except Exception:
        log.warning("fabric drift event not published", node_ip=ev.node_ip)


def _view(r: NodeDriftRow) -> NodeDriftView:
    return NodeDriftView(
        node_ip=r.node_ip,
        fqdn=r.fqdn,
        drifted=r.drifted,
        findings=[DriftFinding.model_validate(f) for f in r.findings],
        frr_config_sha256=r.frr_config_sha256,
        intent_sha256=r.intent_sha256,
        checked_at=r.checked_at.isoformat(),
        since=r.since.isoformat(),
        settling=any(h.get("why") == "settling" for h in r.held or []),
        held=[DriftFinding.model_validate(h) for h in r.held or []],
    )


async def drift(svc: RolloutService, q: FabricDriftQuery) -> FabricDriftView:
    """``q.fabric.drift``: the last round (404 for a node never checked)."""
    node_ip = check_ip(q.node_ip) if q.node_ip else ""
    rows = await svc.repo.drift_rows(node_ip)
    if node_ip and not rows:
        raise NotFound(f"node {node_ip} has not been checked for drift (not in the fabric, or no round yet)")
    rnd = await svc.repo.drift_round()
    return FabricDriftView(
        checked_at=rnd.finished_at.isoformat() if rnd is not None and rnd.finished_at else "",
        interval_s=svc.settings.drift_interval,
        nodes_total=len(rows),
        nodes_drifted=sum(1 for r in rows if r.drifted),
        nodes=[_view(r) for r in rows],
        settle_s=svc.settings.drift_settle,
        against=(await _checked_config(svc))[1],
    )
