"""Teardown and the post-deploy checklist of one node (SSH; the rules live in :mod:`plan`)."""

from __future__ import annotations

from pydantic import BaseModel

from karios.common.errors import KariosError
from karios.fabric_worker.rollout.errors import HostKeyChanged, NodeUnreachable
from karios.fabric_worker.rollout.facts import (
    DISCOVER_SCRIPT,
    EVPN_SUMMARY_COMMAND,
    MANAGED_FILES,
    find_underlay,
    parse_facts,
)
from karios.fabric_worker.rollout.intent import FabricIntent, NodeTarget
from karios.fabric_worker.rollout.node import RolloutOptions
from karios.fabric_worker.rollout.plan import (
    DesiredNetwork,
    FrrAction,
    frr_action_command,
    network_commands,
    write_file_command,
)
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
    """Stop FRR, remove the managed /etc/frr files, vtep0 and the VXLAN devices. The FRR
    package itself stays installed. Without an intent (the config is already deleted), the
    VNIs to remove are `vnis` plus whatever VXLAN devices the node has."""
    opts = options or RolloutOptions()
    secrets = intent.secrets() if intent is not None else []
    vnis = intent.vnis if intent is not None else tuple(vnis)
    res = TeardownResult(node_ip=target.node_ip, fqdn=target.fqdn)
    try:
        async with open_session(target, connect_timeout=opts.connect_timeout, secrets=secrets) as s:
            facts = parse_facts((await s.run(DISCOVER_SCRIPT, limit_s=opts.command_timeout)).stdout)
            res.fqdn = res.fqdn or facts.hostname
            if facts.frr_running:
                await s.run(frr_action_command(FrrAction.STOP) or "true", limit_s=opts.command_timeout)
                res.steps.append("frr_stopped")
            present = [n for n in MANAGED_FILES if facts.files.get(n) is not None]
            for name in present:
                await s.run(write_file_command(name, None), limit_s=opts.command_timeout)
            if present:
                res.steps.append("frr_config_removed")
            managed = tuple(sorted(set(vnis) | set(facts.vxlan_vnis())))
            cmds = network_commands(facts, DesiredNetwork(vtep_ip=None, managed_vnis=managed))
            if cmds:
                await s.run("set -e\n" + "\n".join(cmds), limit_s=opts.command_timeout)
                res.steps += [c.split()[3] + "_removed" for c in cmds if c.startswith("ip link del ")]
        res.removed = True
        res.message = "fabric removed from node" if res.steps else "nothing was configured"
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
