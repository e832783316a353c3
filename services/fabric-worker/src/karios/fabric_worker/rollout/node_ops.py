"""Teardown and the post-deploy checklist of one node (SSH; the rules live in :mod:`plan`)."""

from __future__ import annotations

from pydantic import BaseModel

from karios.common.errors import KariosError
from karios.fabric_worker.rollout.errors import HostKeyChanged, NodeUnreachable
from karios.fabric_worker.rollout.facts import (
    DISCOVER_SCRIPT,
    EVPN_SUMMARY_COMMAND,
    find_underlay,
    parse_facts,
)
from karios.fabric_worker.rollout.intent import FabricIntent, NodeTarget
from karios.fabric_worker.rollout.node import RolloutOptions
from karios.fabric_worker.rollout.ownership import teardown_message, teardown_plan
from karios.fabric_worker.rollout.plan import commit_script
from karios.fabric_worker.rollout.ssh import open_session, redact
from karios.fabric_worker.rollout.verify import ChecklistStep, StepStatus, postdeploy_checklist

# -- teardown ------------------------------------------------------------------------------


class TeardownResult(BaseModel):
    node_ip: str
    fqdn: str = ""
    removed: bool = False
    reachable: bool = True
    message: str = ""
    steps: list[str] = []


async def teardown_node(
    target: NodeTarget,
    intent: FabricIntent | None,
    *,
    options: RolloutOptions | None = None,
    vnis: tuple[int, ...] = (),
) -> TeardownResult:
    """Remove what Karios created on the node and nothing else (:mod:`.ownership`): its devices
    (vtep0, vxlanN, brN), the managed /etc/frr files it created (an operator's original is put
    back), FRR stopped (restarted on the original when it ran before Karios). One SSH exec after
    the discovery. The FRR package stays installed. `vnis` (the intent's when there is one): the
    VNIs of the rule for nodes an older version applied, which carry no record."""
    opts = options or RolloutOptions()
    secrets = intent.secrets() if intent is not None else []
    vnis = intent.vnis if intent is not None else tuple(vnis)
    res = TeardownResult(node_ip=target.node_ip, fqdn=target.fqdn)
    try:
        async with open_session(target, connect_timeout=opts.connect_timeout, secrets=secrets) as s:
            facts = parse_facts((await s.run(DISCOVER_SCRIPT, limit_s=opts.command_timeout)).stdout)
            res.fqdn = res.fqdn or facts.hostname
            plan = teardown_plan(facts, vnis)
            # FRR first, then the devices; the record goes last (a failure half-way keeps it).
            script, data = commit_script(plan.frr, plan.net, net_first=False)
            if script:
                await s.run(script, input=data or None, limit_s=opts.command_timeout)
            res.steps = list(plan.steps)
        res.removed = True
        res.message = teardown_message(plan)
    except (NodeUnreachable, HostKeyChanged) as exc:
        res.reachable = False
        res.message = exc.message
    except KariosError as exc:
        res.message = redact(exc.message, secrets)
    return res


# -- post-deploy -------------------------------------------------------------------------


async def postdeploy_node(
    target: NodeTarget,
    intent: FabricIntent,
    *,
    expected_vtep_ip: str | None = None,
    options: RolloutOptions | None = None,
) -> list[ChecklistStep]:
    """The node's checklist; an unreachable node yields a single failed `ssh` step."""
    opts = options or RolloutOptions()
    try:
        async with open_session(target, connect_timeout=opts.connect_timeout, secrets=intent.secrets()) as s:
            facts = parse_facts((await s.run(DISCOVER_SCRIPT, limit_s=opts.command_timeout)).stdout)
            summary = ""
            if facts.frr_running:
                summary = (
                    await s.run(EVPN_SUMMARY_COMMAND, check=False, limit_s=opts.command_timeout)
                ).stdout
    except KariosError as exc:
        return [ChecklistStep("ssh", StepStatus.FAILED, exc.message, 0)]
    matches = find_underlay(facts, intent.underlay_cidr)
    return postdeploy_checklist(
        facts,
        summary,
        peer_ip=intent.peer_ip,
        vnis=intent.vnis,
        vxlan_mtu=intent.vxlan_mtu,
        underlay_iface=matches[0].iface if matches else None,
        expected_vtep_ip=expected_vtep_ip,
    )
