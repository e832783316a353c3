"""Read-only use cases: preflight (SSH fan-out; stores the HMAC probe and MTU consensus on the
config) and one node's post-deploy checklist."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

from karios.common.contracts.fabric_rollout import (
    FabricPreflightRequest,
    FabricPreflightResult,
    PostdeployQuery,
    PostdeployStep,
)
from karios.common.errors import NotFound, ValidationFailed
from karios.fabric_worker.config import rules, store
from karios.fabric_worker.rollout.access import check_ip, intent_of
from karios.fabric_worker.rollout.intent import NodeOverride
from karios.fabric_worker.rollout.node_ops import postdeploy_node
from karios.fabric_worker.rollout.preflight import preflight as run_preflight
from karios.fabric_worker.rollout.preflight import seen
from karios.fabric_worker.rollout.service import RolloutService


def _overrides(req: FabricPreflightRequest) -> list[NodeOverride]:
    out = []
    for i, o in enumerate(req.node_overrides):
        f = f"node_overrides.{i}"
        check_ip(o.node_ip, f"{f}.node_ip")
        if not o.underlay_iface_hint:
            raise ValidationFailed(f"{f}.underlay_iface_hint: required", field=f"{f}.underlay_iface_hint")
        try:
            ipaddress.IPv4Interface(o.underlay_ip)
        except ValueError:
            raise ValidationFailed(
                f"{f}.underlay_ip: must be host/CIDR such as 10.60.200.5/24", field=f"{f}.underlay_ip"
            ) from None
        out.append(NodeOverride(**o.model_dump()))
    return out


def _underlay_cidr(req: FabricPreflightRequest) -> str:
    if not req.underlay_cidr:
        raise ValidationFailed("underlay_cidr: required", field="underlay_cidr")
    try:
        return str(ipaddress.IPv4Network(req.underlay_cidr.strip(), strict=False))
    except ValueError:
        raise ValidationFailed(
            f"underlay_cidr: {req.underlay_cidr!r} is not an IPv4 CIDR", field="underlay_cidr"
        ) from None


async def preflight(svc: RolloutService, req: FabricPreflightRequest) -> FabricPreflightResult:
    cidr = _underlay_cidr(req)
    overrides = _overrides(req)
    row = await svc.repo.config_or_none()
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
    targets = await svc.targets()
    result = await run_preflight(
        targets,
        underlay_cidr=cidr,
        router_id_base=base,
        router_id_prefix_len=prefix,
        node_overrides=overrides,
        expected_nodes=req.expected_nodes or (cfg.expected_nodes if cfg else 0),
        concurrency=svc.settings.concurrency,
        per_node_timeout=svc.settings.preflight_timeout,
        reserved=(cfg.fabric_switch_peering_ip,) if cfg else (),
        vxlan_mtu=rules.effective_vxlan_mtu(cfg) if cfg else 0,
    )
    await svc.remember({n.node_ip: n.host_key for n in result.nodes if n.host_key and n.host_key_first_seen})
    if targets:
        await svc.repo.store_preflight(
            underlay_cidr=cidr,
            underlay_mtu=result.underlay_mtu,
            hmac_sha_capable=result.frr_hmac_sha_capable,
            overrides=overrides,
            nodes=[n.model_dump() for n in seen(result.nodes)],
        )
    return FabricPreflightResult.model_validate(result.model_dump(mode="json"))


async def postdeploy(svc: RolloutService, q: PostdeployQuery) -> list[PostdeployStep]:
    """One node's checklist; every step carries the node's OS IP and its BMC IP (the inventory's
    when the caller did not pass one: the UI keys nodes by bmc_ip)."""
    access = await svc.node_access(check_ip(q.node_ip))
    if not access:
        raise NotFound(f"node {q.node_ip} has no OS IP registered")
    target = (await svc.targets_of(access[:1]))[0]
    bmc_ip = q.bmc_ip or access[0].bmc_ip
    intent = intent_of(await svc.repo.config(), svc.settings, svc.box)
    vtep = await svc.repo.allocation_of(target.node_ip)
    steps = await postdeploy_node(target, intent, expected_vtep_ip=vtep, options=svc.settings.options())
    now = datetime.now(UTC).isoformat()
    return [
        PostdeployStep(
            step_id=st.step_id,
            status=str(st.status),
            message=st.message,
            progress=st.progress,
            node_ip=target.node_ip,
            bmc_ip=bmc_ip,
            batch_id=q.batch_id,
            created_at=now,
            updated_at=now,
        )
        for st in steps
    ]
