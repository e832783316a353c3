"""Apply preview (use case, ``q.fabric.diff``): per node, the apply's own load → discover →
render → diff, stopped before the commit. Read-only on the nodes and in the database: no VTEP
is allocated (the address an apply would take is computed), no host key is pinned.

The steps are :class:`~.node.NodeRollout`'s (:class:`NodePreview` only stops early), so the
preview and the apply cannot disagree on what changes; :mod:`.diff` turns the plan into text
with every secret redacted.
"""

from __future__ import annotations

import asyncio

from karios.common.contracts.fabric_diff import FabricDiffQuery, FabricDiffView, NodeDiff
from karios.common.errors import Conflict, KariosError, NotFound
from karios.fabric_worker.config import store
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.rollout.access import check_ip, intent_of
from karios.fabric_worker.rollout.diff import file_diffs, link_changes, planned_vteps
from karios.fabric_worker.rollout.errors import HostKeyChanged, NodeUnreachable
from karios.fabric_worker.rollout.intent import NodeOverride, NodeTarget
from karios.fabric_worker.rollout.node import NodeRollout
from karios.fabric_worker.rollout.plan import frr_plan, network_commands
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.ssh import redact


class NodePreview(NodeRollout):
    """A :class:`NodeRollout` that plans and stops: nothing on the node changes."""

    async def diff(self, *, allocated: bool, limit_s: float) -> NodeDiff:
        """Never raises: an unreachable node or a failed step is the diff's ``error``."""
        out = NodeDiff(node_ip=self.target.node_ip, fqdn=self.target.fqdn, vtep_ip=self.vtep_ip)
        out.vtep_allocated = allocated
        try:
            await asyncio.wait_for(self._plan(out), limit_s)
        except (NodeUnreachable, HostKeyChanged) as exc:
            out.reachable, out.error = False, redact(exc.message, self._secrets)
        except KariosError as exc:
            out.error = redact(exc.message, self._secrets)
        except TimeoutError:
            out.error = f"{self._who()}: no answer within {limit_s:.0f} s"
        if out.error:
            out.changed, out.files, out.links = False, [], []
        return out

    async def _plan(self, out: NodeDiff) -> None:
        if not self.vtep_ip:
            raise Conflict(f"{self._who()}: the VTEP pool has no free address for this node")
        async with self._session() as s:
            facts = await self._discover(s)
        out.fqdn = out.fqdn or facts.hostname
        iface, mtu = self._underlay(facts)
        files = render_node_files(
            self.intent,
            NodeRenderInput(hostname=facts.hostname or out.fqdn, vtep_ip=self.vtep_ip, underlay_iface=iface),
        ).as_dict()
        plan = frr_plan(facts, files)
        net = network_commands(facts, self._desired(facts, mtu))
        out.frr_install = not facts.frr_installed
        out.frr_action = plan.action.value  # type: ignore[assignment]
        out.files = file_diffs(facts, plan, self._secrets)
        out.links = link_changes(net, facts)
        out.changed = plan.changed or bool(net) or out.frr_install


async def diff(svc: RolloutService, q: FabricDiffQuery) -> FabricDiffView:
    """``q.fabric.diff``: every registered node (or ``node_ip``) as an apply would see it now."""
    node_ip = check_ip(q.node_ip) if q.node_ip else ""
    row = await svc.repo.config()  # 404 without a stored configuration
    intent = intent_of(row, svc.settings, svc.box)
    access = await svc.node_access(node_ip)
    if node_ip and not access:
        raise NotFound(f"node {node_ip} is not registered with an OS IP")
    targets = await svc.targets_of(access)
    cfg = store.fields_of(row)
    pool = VtepPool.of(cfg.router_id_base, cfg.router_id_prefix_len, [cfg.fabric_switch_peering_ip])
    ips = [t.node_ip for t in targets]
    allocated = await svc.repo.allocations(ips if node_ip else None)
    if any(not pool.contains(allocated.get(ip, "")) for ip in ips):
        allocated = await svc.repo.allocations()  # a node gets a free address: every taken one counts
    vteps = planned_vteps(pool, allocated, ips)  # the apply's order
    overrides = {o["node_ip"]: NodeOverride(**o) for o in row.node_overrides or [] if isinstance(o, dict)}
    gate = asyncio.Semaphore(svc.settings.concurrency)
    opts = svc.settings.options()

    async def one(t: NodeTarget) -> NodeDiff:
        vtep = vteps.get(t.node_ip, "")
        node = NodePreview(t, intent, vtep, override=overrides.get(t.node_ip), options=opts)
        async with gate:
            return await node.diff(
                allocated=allocated.get(t.node_ip) == vtep, limit_s=svc.settings.preflight_timeout
            )

    nodes = list(await asyncio.gather(*(one(t) for t in targets)))
    return FabricDiffView(
        changed=any(n.changed for n in nodes),
        nodes_total=len(nodes),
        nodes_changed=sum(1 for n in nodes if n.changed),
        nodes_failed=sum(1 for n in nodes if n.error),
        nodes_unreachable=sum(1 for n in nodes if not n.reachable),
        nodes=nodes,
    )
