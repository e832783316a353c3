"""Preflight's judgement (pure): which nodes are outliers, the largest ``vxlan_mtu`` the
underlay carries, and what would make an apply of the configuration fail — each named with
the node and the number, so the 409 an apply answers says what to fix.

The same function judges a fresh preflight (``blockers`` in its result) and an apply request
(against the nodes the last preflight saw, stored on the config row).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import BaseModel

from karios.common.contracts.fabric_rollout import PreflightBlocker


class NodeSeen(BaseModel):
    """What preflight learned about one node (kept on the config row for the apply's judgement)."""

    node_ip: str
    fqdn: str = ""
    mode: str  # reuse | needs_override | unreachable
    bridge: str = ""
    bridge_mtu: int = 0
    reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.fqdn} ({self.node_ip})" if self.fqdn else self.node_ip


def max_vxlan_mtu(nodes: Iterable[NodeSeen]) -> int:
    """The largest vxlan_mtu every reuse node's underlay carries: its smallest bridge MTU (0: none)."""
    mtus = [n.bridge_mtu for n in nodes if n.mode == "reuse" and n.bridge_mtu > 0]
    return min(mtus) if mtus else 0


def mtu_outliers(nodes: Sequence[NodeSeen]) -> list[NodeSeen]:
    """Reuse nodes whose MTU differs from the most common one (a tie goes to the larger MTU:
    the fabric is built for jumbo frames and the small ones are the nodes to fix)."""
    reuse = [n for n in nodes if n.mode == "reuse" and n.bridge_mtu > 0]
    counts = Counter(n.bridge_mtu for n in reuse)
    if len(counts) < 2:
        return []
    usual = max(counts, key=lambda mtu: (counts[mtu], mtu))
    return [n for n in reuse if n.bridge_mtu != usual]


def blockers(
    nodes: Sequence[NodeSeen],
    *,
    vxlan_mtu: int,
    capacity: int | None = None,
    needed: int = 0,
    prefix_len: int = 0,
) -> list[PreflightBlocker]:
    """Why an apply of `vxlan_mtu` to `nodes` would fail: a node whose underlay MTU is below it,
    a node preflight could not reach or resolve, a pool holding fewer than `needed` addresses."""
    out: list[PreflightBlocker] = []
    for n in nodes:
        if n.mode == "unreachable":
            out.append(
                PreflightBlocker(
                    kind="unreachable",
                    field="node_ip",
                    node_ip=n.node_ip,
                    fqdn=n.fqdn,
                    message=f"{n.label} was unreachable in preflight: {n.reason}",
                )
            )
        elif n.mode != "reuse":
            out.append(
                PreflightBlocker(
                    kind="needs_override",
                    field="node_overrides",
                    node_ip=n.node_ip,
                    fqdn=n.fqdn,
                    message=f"{n.label} has no underlay bridge: {n.reason}",
                )
            )
        elif vxlan_mtu and 0 < n.bridge_mtu < vxlan_mtu:
            out.append(
                PreflightBlocker(
                    kind="mtu",
                    field="vxlan_mtu",
                    node_ip=n.node_ip,
                    fqdn=n.fqdn,
                    mtu=n.bridge_mtu,
                    message=f"{n.label} underlay {n.bridge or 'bridge'} MTU {n.bridge_mtu} "
                    f"is below vxlan_mtu {vxlan_mtu}",
                )
            )
    if capacity is not None and needed > capacity:
        out.append(
            PreflightBlocker(
                kind="pool_headroom",
                field="router_id_prefix_len",
                message=f"the VTEP pool /{prefix_len} holds {capacity} addresses, {needed - capacity} "
                f"fewer than the {needed} nodes: widen router_id_prefix_len",
            )
        )
    return out


#: A refused apply names this many blockers in its message and lists this many in
#: ``details.blockers`` (``details.blockers_total`` counts them all): a 1,000-node fabric with
#: every node unreachable answered 448 KB. Preflight's own answer lists every node.
NAMED_IN_MESSAGE = 10
LISTED_IN_DETAILS = 100


def refusal_details(found: Sequence[PreflightBlocker], largest: int) -> dict:
    """``details`` of the 409: the first :data:`LISTED_IN_DETAILS` blockers and their count."""
    return {
        "blockers": [b.model_dump() for b in found[:LISTED_IN_DETAILS]],
        "blockers_total": len(found),
        "max_vxlan_mtu": largest,
    }


def headline(found: Sequence[PreflightBlocker], largest: int) -> str:
    """One sentence for the 409: the blockers (the first :data:`NAMED_IN_MESSAGE`, then how many
    more), and the vxlan_mtu that would pass the MTU check."""
    parts = [b.message for b in found[:NAMED_IN_MESSAGE]]
    if len(found) > NAMED_IN_MESSAGE:
        parts.append(f"and {len(found) - NAMED_IN_MESSAGE} more (details.blockers)")
    if any(b.kind == "mtu" for b in found) and largest:
        parts.append(f"the underlay carries at most vxlan_mtu {largest} (set it, or fix those nodes)")
    return (
        f"apply refused by the last preflight ({len(found)} blocker(s)): "
        + "; ".join(parts)
        + ". Fix and re-run preflight, or force the apply (fabric_admin)"
    )


class VerdictMemo:
    """The last stored preflight's verdicts parsed once, and the blockers found in them: an
    apply request refused for the same preflight (1,000 nodes, each refusal re-reading them:
    ``benchmarks/every_route.py``) reuses both while the stored list is equal. Plain state, no
    I/O; a worker owns one."""

    _MAX_KEYS = 8  # blocker sets kept per preflight (target sets × MTU); more are recomputed

    def __init__(self) -> None:
        self._nodes: list | None = None
        self._seen: dict[str, NodeSeen] = {}
        self._found: dict[tuple, tuple[PreflightBlocker, ...]] = {}

    def seen(self, stored: list) -> dict[str, NodeSeen]:
        """{node_ip: verdict} of a stored preflight list (a node probed twice: the last counts).
        Not validated again: the worker stored them from validated ``NodeSeen``."""
        if stored != self._nodes:
            self._seen = {
                n["node_ip"]: NodeSeen.model_construct(**n)
                for n in stored
                if isinstance(n, dict) and "node_ip" in n and "mode" in n
            }
            self._nodes, self._found = list(stored), {}
        return self._seen

    def blockers(
        self,
        stored: list,
        targets: frozenset[str],
        *,
        vxlan_mtu: int,
        capacity: int,
        needed: int,
        prefix_len: int,
    ) -> list[PreflightBlocker]:
        """:func:`blockers` of the stored verdicts of `targets` (nodes preflight never saw pass)."""
        seen = self.seen(stored)
        key = (targets, vxlan_mtu, capacity, needed, prefix_len)
        if key not in self._found:
            if len(self._found) >= self._MAX_KEYS:
                self._found.clear()
            found = blockers(
                [n for ip, n in seen.items() if ip in targets],
                vxlan_mtu=vxlan_mtu,
                capacity=capacity,
                needed=needed,
                prefix_len=prefix_len,
            )
            self._found[key] = tuple(found)
        return list(self._found[key])
