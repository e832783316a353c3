"""Preflight: read-only SSH fan-out resolving each node's underlay (no kernel change).

:func:`resolve_node` and :func:`summarize` are pure; :func:`preflight` does the I/O.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, computed_field

from karios.common.contracts.fabric_rollout import PreflightBlocker, VtepPoolHeadroom, preflight_ready
from karios.common.errors import KariosError
from karios.fabric_worker.rollout import judge
from karios.fabric_worker.rollout.errors import HostKeyChanged
from karios.fabric_worker.rollout.facts import DISCOVER_SCRIPT, NodeFacts, find_underlay, parse_facts
from karios.fabric_worker.rollout.intent import (
    NodeOverride,
    NodeTarget,
    OverrideMode,
    vtep_pool_status,
)
from karios.fabric_worker.rollout.judge import NodeSeen
from karios.fabric_worker.rollout.render import HMAC_SHA_PROBE_CONF
from karios.fabric_worker.rollout.ssh import open_session


class PreflightNode(BaseModel):
    node_ip: str
    fqdn: str = ""
    mode: OverrideMode
    needs_override: bool = False
    bridge: str = ""
    bridge_mtu: int = 0
    underlay_ip: str = ""
    reason: str = ""
    host_key: str = ""  # key seen (store it when host_key_first_seen)
    host_key_first_seen: bool = False
    hmac_sha_capable: bool | None = None


class MtuDrift(BaseModel):
    node_ip: str
    fqdn: str = ""
    bridge: str
    bridge_mtu: int


class PreflightResult(BaseModel):
    underlay_cidr: str
    nodes: list[PreflightNode]
    matched_bridges: list[str]
    node_overrides: list[NodeOverride]
    underlay_mtu: int
    mtu_drift: list[MtuDrift]
    vtep_pool: VtepPoolHeadroom
    frr_hmac_sha_capable: bool | None  # None: no node could be probed
    max_vxlan_mtu: int = 0
    mtu_outliers: list[MtuDrift] = []
    blockers: list[PreflightBlocker] = []

    @computed_field
    @property
    def ready(self) -> bool:
        """Derived, never stored: nodes, every one reuse, and no blocker (the contract's rule)."""
        return preflight_ready((n.mode for n in self.nodes), self.blockers)


def seen(nodes: Sequence[PreflightNode]) -> list[NodeSeen]:
    """What the apply's judgement needs of each node (stored on the config row)."""
    return [NodeSeen.model_validate(n.model_dump(include=set(NodeSeen.model_fields))) for n in nodes]


def resolve_node(
    target: NodeTarget, facts: NodeFacts, underlay_cidr: str, override: NodeOverride | None
) -> PreflightNode:
    """reuse: a bridge holds an address in the CIDR, or the operator's node_overrides entry
    names an underlay that exists (reason says so); otherwise needs_override with the reason."""
    base = {"node_ip": target.node_ip, "fqdn": target.fqdn or facts.hostname}
    if override is not None:
        iface = facts.interfaces.get(override.underlay_bridge_name or override.underlay_iface_hint)
        name = override.underlay_bridge_name or override.underlay_iface_hint
        if iface is None:
            return PreflightNode(
                **base, mode="needs_override", needs_override=True, reason=f"override names {name!r}, absent"
            )
        # The seed's modes are reuse / needs_override / unreachable and `ready` is "every node
        # reuse": a working override resolves the node to an existing underlay, so it is reuse.
        return PreflightNode(
            **base,
            mode="reuse",
            bridge=iface.name,
            bridge_mtu=iface.mtu,
            underlay_ip=override.underlay_ip,
            reason=f"resolved by node_overrides ({name})",
        )
    matches = find_underlay(facts, underlay_cidr)
    bridges = [m for m in matches if m.is_bridge]
    if bridges:
        m = bridges[0]
        return PreflightNode(
            **base, mode="reuse", bridge=m.iface, bridge_mtu=m.mtu, underlay_ip=m.underlay_ip
        )
    if matches:
        m = matches[0]
        reason = f"{m.underlay_ip} is on {m.iface}, which is not a bridge"
    else:
        reason = f"no interface has an IPv4 address in {underlay_cidr}"
    return PreflightNode(**base, mode="needs_override", needs_override=True, reason=reason)


def summarize(
    nodes: list[PreflightNode],
    *,
    underlay_cidr: str,
    overrides: Sequence[NodeOverride],
    router_id_base: str,
    router_id_prefix_len: int,
    expected_nodes: int,
    reserved: tuple[str, ...] = (),
    vxlan_mtu: int = 0,
) -> PreflightResult:
    """The seed's fields (consensus `underlay_mtu`, every pair in `mtu_drift`) plus the
    judgement: outliers, the largest vxlan_mtu, and `blockers` for `vxlan_mtu` (0: not judged)."""
    reuse = [n for n in nodes if n.mode == "reuse"]
    mtus = Counter(n.bridge_mtu for n in reuse)
    if len(mtus) == 1:
        underlay_mtu, drift = next(iter(mtus)), []
    else:
        underlay_mtu = 0
        drift = [
            MtuDrift(node_ip=n.node_ip, fqdn=n.fqdn, bridge=n.bridge, bridge_mtu=n.bridge_mtu) for n in reuse
        ]
    probes = [n.hmac_sha_capable for n in nodes if n.hmac_sha_capable is not None]
    pool = vtep_pool_status(router_id_base, router_id_prefix_len, expected_nodes or len(nodes), reserved)
    judged = seen(nodes)
    found = judge.blockers(
        judged,
        vxlan_mtu=vxlan_mtu,
        capacity=pool.capacity,
        needed=max(pool.expected_nodes, len(nodes)),
        prefix_len=router_id_prefix_len,
    )
    return PreflightResult(
        underlay_cidr=underlay_cidr,
        nodes=nodes,
        matched_bridges=sorted({n.bridge for n in reuse}),
        node_overrides=list(overrides),
        underlay_mtu=underlay_mtu,
        mtu_drift=drift,
        vtep_pool=pool,
        frr_hmac_sha_capable=all(probes) if probes else None,
        max_vxlan_mtu=judge.max_vxlan_mtu(judged),
        mtu_outliers=[
            MtuDrift(node_ip=n.node_ip, fqdn=n.fqdn, bridge=n.bridge, bridge_mtu=n.bridge_mtu)
            for n in judge.mtu_outliers(judged)
        ],
        blockers=found,
    )


HMAC_PROBE_COMMAND = (
    "command -v vtysh >/dev/null || { echo absent; exit 0; }; "
    "f=$(mktemp) && cat > $f && if vtysh -C -f $f >/dev/null 2>&1; then echo yes; else echo no; fi; rm -f $f"
)


async def probe_node(
    target: NodeTarget, underlay_cidr: str, override: NodeOverride | None, *, limit_s: float
) -> PreflightNode:
    """SSH to one node: discover, resolve the underlay, probe FRR's HMAC-SHA support."""
    try:
        async with asyncio.timeout(limit_s):
            async with open_session(target, connect_timeout=min(limit_s, 10.0)) as s:
                facts = parse_facts((await s.run(DISCOVER_SCRIPT)).stdout)
                probe = (await s.run(HMAC_PROBE_COMMAND, input=HMAC_SHA_PROBE_CONF)).stdout.strip()
                node = resolve_node(target, facts, underlay_cidr, override)
                return node.model_copy(
                    update={
                        "host_key": s.host_key,
                        "host_key_first_seen": s.host_key_first_seen,
                        "hmac_sha_capable": {"yes": True, "no": False}.get(probe),
                    }
                )
    except TimeoutError:
        reason = f"no answer within {limit_s:.0f} s"
    except HostKeyChanged as exc:
        reason = exc.message
    except KariosError as exc:
        reason = exc.message
    except ValueError as exc:  # discovery output we cannot parse
        reason = f"unexpected discovery output: {exc}"
    return PreflightNode(node_ip=target.node_ip, fqdn=target.fqdn, mode="unreachable", reason=reason)


async def preflight(
    nodes: Sequence[NodeTarget],
    *,
    underlay_cidr: str,
    router_id_base: str,
    router_id_prefix_len: int,
    node_overrides: Sequence[NodeOverride] = (),
    expected_nodes: int = 0,
    concurrency: int = 16,
    per_node_timeout: float = 20.0,
    reserved: tuple[str, ...] = (),
    vxlan_mtu: int = 0,
) -> PreflightResult:
    """Read-only fan-out over `nodes` (bounded by `concurrency`, each within `per_node_timeout`).
    `reserved`: addresses of the VTEP pool never handed out (the switch's peering IP);
    `vxlan_mtu`: the MTU the blockers are judged against (0: not judged)."""
    cidr = str(ipaddress.IPv4Network(underlay_cidr, strict=False))
    by_ip = {o.node_ip: o for o in node_overrides}
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: NodeTarget) -> PreflightNode:
        async with sem:
            return await probe_node(t, cidr, by_ip.get(t.node_ip), limit_s=per_node_timeout)

    results = await asyncio.gather(*(one(t) for t in nodes))
    return summarize(
        list(results),
        underlay_cidr=cidr,
        overrides=node_overrides,
        router_id_base=router_id_base,
        router_id_prefix_len=router_id_prefix_len,
        expected_nodes=expected_nodes,
        reserved=reserved,
        vxlan_mtu=vxlan_mtu,
    )
