"""PostgreSQL adapter: the fabric config row, VTEP allocations and the ack audit log.

Every write takes one transaction-scoped advisory lock, so a config change, a delete and
VTEP allocations never interleave: concurrent allocations cannot hand out one address twice
(the primary key on ``vtep_ip`` is the backstop), and a rejected request writes nothing.

The lock is also the one a fabric job is queued under (``RolloutRepository.queue_job``): a
config write checks for a running job *inside* it (:func:`refuse_while_job_runs`), so a write and
a job start are ordered — the write lands before the job reads the config, or it is refused
with 409 ``FABRIC_JOB_RUNNING`` and leaves the row (and its ``rollout_status``) untouched.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import defer
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.contracts.fabric import (
    BGP_PASSWORD_CONTEXT,
    OSPF_AUTH_KEY_CONTEXT,
    DeleteResult,
    FabricConfigFields,
    FabricConfigView,
    UpsertFabricConfig,
    VtepAllocation,
    VtepPoolStatus,
)
from karios.common.contracts.fabric_busy import FabricJobRunning
from karios.common.contracts.fabric_rollout import JobStatus
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, NotFound, ValidationFailed
from karios.common.telemetry import get_logger
from karios.fabric_worker.config import ackgate, rules
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.models import (
    SINGLETON_ID,
    FabricConfigRow,
    FabricJobRow,
    SwitchAckAudit,
    VtepAllocationRow,
)

log = get_logger(__name__)

BGP_CONTEXT = BGP_PASSWORD_CONTEXT
OSPF_CONTEXT = OSPF_AUTH_KEY_CONTEXT


async def lock(session: AsyncSession) -> None:
    """The fabric config lock, held until the caller's transaction ends (re-entrant)."""
    await (await session.connection()).execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtext('karios.fabric.config'))")
    )


async def running_job(session: AsyncSession) -> FabricJobRow | None:
    """The fabric job running or queued now (at most one: the partial unique index)."""
    stmt = select(FabricJobRow).where(FabricJobRow.job_status == str(JobStatus.RUNNING)).limit(1)
    return (await session.exec(stmt)).first()


async def refuse_while_job_runs(session: AsyncSession) -> None:
    """409 ``FABRIC_JOB_RUNNING`` naming the job; call it under :func:`lock`, before writing."""
    job = await running_job(session)
    if job is not None:
        raise FabricJobRunning.of(job.job_id, job.job_type)


async def load(
    session: AsyncSession, *, for_update: bool = False, preflight: bool = True
) -> FabricConfigRow | None:
    """The config row. ``preflight=False``: without what the last preflight saw per node
    (``preflight_nodes``, ``node_overrides``: ~100 KB of JSON at 1,000 nodes), which the view
    and the pool status do not show; reading them then raises instead of loading."""
    stmt = select(FabricConfigRow).where(FabricConfigRow.id == SINGLETON_ID)
    if not preflight:
        stmt = stmt.options(
            defer(FabricConfigRow.preflight_nodes, raiseload=True),  # type: ignore[arg-type]
            defer(FabricConfigRow.node_overrides, raiseload=True),  # type: ignore[arg-type]
        )
    if for_update:
        stmt = stmt.with_for_update()
    return (await session.exec(stmt)).first()


def fields_of(row: FabricConfigRow) -> FabricConfigFields:
    return FabricConfigFields.model_validate(row.data)


def view_of(row: FabricConfigRow, *, created: bool = False) -> FabricConfigView:
    fields = fields_of(row)
    return FabricConfigView(
        **fields.model_dump(by_alias=True),
        bgp_mode=rules.bgp_mode(fields),
        bgp_password_is_set=bool(row.bgp_password_enc),
        ospf_auth_key_is_set=bool(row.ospf_auth_key_enc),
        router_id_cidr=rules.encode_router_id_cidr(fields.router_id_base, fields.router_id_prefix_len),
        rollout_status=row.rollout_status or "ready",
        frr_hmac_sha_capable=row.frr_hmac_sha_capable,
        physnet=None,  # projection filled by the rollout (issue 6)
        last_job=None,
        created=created,
    )


ROLLOUT_PENDING = "pending"


def _secret_len(box: SecretBox, token: str | None, context: str) -> int:
    return len(box.decrypt(token, context=context)) if token else 0


def _secret_has_space(box: SecretBox, token: str | None, context: str) -> bool:
    return bool(token) and any(c.isspace() for c in box.decrypt(token, context=context))  # type: ignore[arg-type]


def _secret_change(
    box: SecretBox, row: FabricConfigRow | None, bgp_enc: str | None, ospf_enc: str | None
) -> ackgate.SecretChange:
    """What the write does to the switch's secrets: set, cleared, or a new value (compared
    decrypted: each write encrypts afresh, so equal ciphertexts are never the test)."""
    old_bgp, old_ospf = (row.bgp_password_enc, row.ospf_auth_key_enc) if row else (None, None)

    def revalued(old: str | None, new: str | None, context: str) -> bool:
        if not old or not new or old == new:
            return False
        return box.decrypt(old, context=context) != box.decrypt(new, context=context)

    changed = tuple(
        name
        for name, old, new, context in (
            ("bgp_password", old_bgp, bgp_enc, BGP_CONTEXT),
            ("ospf_auth_key", old_ospf, ospf_enc, OSPF_CONTEXT),
        )
        if revalued(old, new, context)
    )
    return ackgate.SecretChange(bool(old_bgp), bool(bgp_enc), changed)


def _stored_secrets(req: UpsertFabricConfig, row: FabricConfigRow | None) -> tuple[str | None, str | None]:
    """The (encrypted) BGP password and OSPF key the row keeps after this write."""
    inp = req.config
    if inp.clear_bgp_password and req.bgp_password_enc:
        raise ValidationFailed(
            "clear_bgp_password: cannot clear and set bgp_password at once", field="clear_bgp_password"
        )
    if inp.clear_ospf_auth_key and req.ospf_auth_key_enc:
        raise ValidationFailed(
            "clear_ospf_auth_key: cannot clear and set ospf_auth_key at once", field="clear_ospf_auth_key"
        )
    bgp_enc = (
        None if inp.clear_bgp_password else (req.bgp_password_enc or (row.bgp_password_enc if row else None))
    )
    ospf_enc = (
        None
        if inp.clear_ospf_auth_key
        else (req.ospf_auth_key_enc or (row.ospf_auth_key_enc if row else None))
    )
    return bgp_enc, ospf_enc


async def upsert(session: AsyncSession, req: UpsertFabricConfig, box: SecretBox) -> FabricConfigView:
    """Merge, validate, pass the ack gate, then write config (+ audit, + pool cleanup) or nothing."""
    await lock(session)
    row = await load(session, for_update=True)
    await refuse_while_job_runs(session)  # after the row lock: a job ending now has committed
    stored = fields_of(row) if row is not None else None
    inp = req.config
    merged = rules.merge(stored, inp, set(req.fields_set))

    bgp_enc, ospf_enc = _stored_secrets(req, row)
    ctx = rules.RuleContext(
        frr_hmac_sha_capable=row.frr_hmac_sha_capable if row else None,
        underlay_mtu=row.underlay_mtu if row else 0,
        bgp_password_set=bool(bgp_enc),
        ospf_auth_key_set=bool(ospf_enc),
        bgp_password_len=_secret_len(box, req.bgp_password_enc, BGP_CONTEXT),
        ospf_auth_key_len=_secret_len(box, ospf_enc, OSPF_CONTEXT),
        bgp_password_space=_secret_has_space(box, req.bgp_password_enc, BGP_CONTEXT),
        ospf_auth_key_space=_secret_has_space(box, req.ospf_auth_key_enc, OSPF_CONTEXT),
    )
    rules.check(merged, ctx)
    secrets = _secret_change(box, row, bgp_enc, ospf_enc)
    ack = ackgate.evaluate(
        stored, merged, inp, caller=req.caller, caller_role=req.caller_role, secrets=secrets
    )

    now = datetime.now(UTC)
    data = merged.model_dump(mode="json", by_alias=True)
    created = row is None
    if row is None:
        # Nothing rolled out yet: "pending" until the first apply (an empty legacy value reads "ready").
        row = FabricConfigRow(
            id=SINGLETON_ID, data=data, created_at=now, updated_at=now, rollout_status=ROLLOUT_PENDING
        )
        session.add(row)
    else:
        changed = data != row.data or (bgp_enc, ospf_enc) != (row.bgp_password_enc, row.ospf_auth_key_enc)
        if changed and row.rollout_status in ("", "ready"):
            row.rollout_status = ROLLOUT_PENDING  # the nodes run the previous config until the next apply
        row.data = data
        row.updated_at = now
    row.bgp_password_enc, row.ospf_auth_key_enc = bgp_enc, ospf_enc
    if ack is not None:
        session.add(SwitchAckAudit(**asdict(ack), at=now))
        log.info(
            "switch listen range moved",
            old=ack.old_range,
            new=ack.new_range,
            acked_by=ack.acked_by,
            skipped=ack.skipped,
        )
    if stored is not None and _pool_of(stored) != _pool_of(merged):
        # With a BGP underlay the switch does not change (no ack), but the nodes' VTEPs move.
        released = await _release_outside(session, merged)
        log.info("vtep pool moved", old=_pool_of(stored), new=_pool_of(merged), released=released)
    await session.flush()
    return view_of(row, created=created)


def _pool_of(cfg: FabricConfigFields) -> str:
    return rules.encode_router_id_cidr(cfg.router_id_base, cfg.router_id_prefix_len)


async def _release_outside(session: AsyncSession, cfg: FabricConfigFields) -> int:
    """Drop allocations the moved pool no longer contains (the rollout re-allocates those nodes)."""
    pool = VtepPool.of(cfg.router_id_base, cfg.router_id_prefix_len, [cfg.fabric_switch_peering_ip])
    rows = (await session.exec(select(VtepAllocationRow.vtep_ip))).all()
    gone = [ip for ip in rows if not pool.contains(ip)]
    if gone:
        await (await session.connection()).execute(
            sa.delete(VtepAllocationRow).where(VtepAllocationRow.vtep_ip.in_(gone))
        )  # type: ignore[attr-defined]
    return len(gone)


async def delete(session: AsyncSession) -> DeleteResult:
    await lock(session)
    row = await load(session, for_update=True)
    await refuse_while_job_runs(session)  # also while the teardown of a deleted config runs
    if row is None:
        raise NotFound("no fabric configuration is stored")
    released = (await (await session.connection()).execute(sa.delete(VtepAllocationRow))).rowcount or 0  # type: ignore[attr-defined]
    await session.delete(row)
    return DeleteResult(deleted=True, message="fabric configuration deleted", released_vteps=released)


def _pool(cfg: FabricConfigFields) -> VtepPool:
    if not cfg.router_id_base or not cfg.router_id_prefix_len:
        raise Conflict("the fabric configuration has no VTEP pool (router_id_base / router_id_prefix_len)")
    return VtepPool.of(cfg.router_id_base, cfg.router_id_prefix_len, [cfg.fabric_switch_peering_ip])


async def pool_status(session: AsyncSession) -> VtepPoolStatus:
    row = await load(session, preflight=False)
    if row is None:
        raise NotFound("no fabric configuration is stored")
    cfg = fields_of(row)
    pool = _pool(cfg)
    ips = (await session.exec(select(VtepAllocationRow.vtep_ip).order_by(VtepAllocationRow.seq.desc()))).all()  # type: ignore[union-attr]
    inside = [ip for ip in ips if pool.contains(ip)]
    total = pool.total_usable
    remaining = max(total - len(inside), 0)
    return VtepPoolStatus(
        allocated=len(inside),
        exhausted=remaining == 0,
        last_allocated_ip=inside[0] if inside else "",
        prefix_length=cfg.router_id_prefix_len,
        remaining=remaining,
        router_id_base=cfg.router_id_base,
        start_ip=str(pool.start or ""),
        subnet_cidr=str(pool.subnet),
        total_usable=total,
    )


async def allocate(session: AsyncSession, node_ip: str) -> VtepAllocation:
    """The node's address if it has one, else the lowest free one. Conflict when the pool is full."""
    await lock(session)
    row = await load(session)
    if row is None:
        raise NotFound("no fabric configuration is stored")
    pool = _pool(fields_of(row))
    existing = (
        await session.exec(select(VtepAllocationRow).where(VtepAllocationRow.node_ip == node_ip))
    ).first()
    if existing is not None and pool.contains(existing.vtep_ip):
        return VtepAllocation(node_ip=node_ip, vtep_ip=existing.vtep_ip, created=False)
    if existing is not None:
        await session.delete(existing)
    taken = set((await session.exec(select(VtepAllocationRow.vtep_ip))).all())
    ip = pool.first_free(taken)
    if ip is None:
        raise Conflict(f"VTEP pool {pool.subnet} is exhausted", field="router_id_prefix_len")
    await (await session.connection()).execute(
        sa.insert(VtepAllocationRow.__table__).values(  # type: ignore[attr-defined]
            vtep_ip=ip, node_ip=node_ip, allocated_at=datetime.now(UTC)
        )
    )
    return VtepAllocation(node_ip=node_ip, vtep_ip=ip, created=True)


async def release(session: AsyncSession, node_ip: str) -> VtepAllocation:
    await lock(session)
    existing = (
        await session.exec(select(VtepAllocationRow).where(VtepAllocationRow.node_ip == node_ip))
    ).first()
    if existing is None:
        raise NotFound(f"node {node_ip} holds no VTEP address")
    await session.delete(existing)
    return VtepAllocation(node_ip=node_ip, vtep_ip=existing.vtep_ip, created=False)
