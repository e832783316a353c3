"""Pure planning: what to change on a node (diff) and how to go back (rollback), as ``ip``
commands and managed FRR files, and the one script that commits them. No I/O: everything here
takes facts and returns commands, so the rules are read and tested without a node.

How a command runs on the node (interruptible, fenced) is :mod:`.steps`; how the result is
judged (verify, post-deploy checklist) is :mod:`.verify`.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from enum import StrEnum

from karios.fabric_worker.rollout.facts import FRRINIT, MANAGED_FILES, RECORD_NAME, NodeFacts

VXLAN_OVERHEAD = 50
VXLAN_PORT = 4789


# A dummy interface holds the VTEP address. Kernels built without the dummy driver (this
# lab's VM kernel, for one) get a veth pair instead: both ends up, so the /32 is a live
# connected route zebra can advertise.
VTEP_CREATE = (
    "{ ip link add vtep0 type dummy 2>/dev/null || "
    "{ ip link add vtep0 type veth peer name vtep0p && ip link set vtep0p up; }; }"
)


class FrrAction(StrEnum):
    NONE = "none"
    START = "start"
    RELOAD = "reload"
    RESTART = "restart"
    STOP = "stop"


@dataclasses.dataclass(frozen=True)
class DesiredNetwork:
    """Kernel state the rollout owns: vtep0 and one vxlanN in brN per VNI.

    ``vtep_ip=None`` means "none of it": vtep0 and the managed VXLAN devices are removed.
    """

    vtep_ip: str | None
    vnis: tuple[int, ...] = ()
    overlay_mtu: int = 1450
    managed_vnis: tuple[int, ...] = ()  # VNIs whose devices may be removed when not wanted
    # Devices never removed as "not wanted": the ones Karios did not create (see .ownership).
    keep: frozenset[str] = frozenset()


def overlay_mtu(vxlan_mtu: int, underlay_mtu: int) -> int:
    """MTU of the VXLAN devices and their bridges: the smaller of the fabric MTU and the
    node's real underlay MTU, minus the VXLAN encapsulation."""
    base = min(vxlan_mtu, underlay_mtu) if underlay_mtu > 0 else vxlan_mtu
    return base - VXLAN_OVERHEAD


def network_commands(facts: NodeFacts, want: DesiredNetwork) -> list[str]:
    """`ip` commands bringing the node's managed devices from `facts` to `want` (empty when equal)."""
    cmds: list[str] = []
    ifs = facts.interfaces
    wanted = set(want.vnis) if want.vtep_ip else set()
    for vni in sorted(set(want.managed_vnis) | set(facts.vxlan_vnis()) - wanted):
        if vni in wanted:
            continue
        vx, br = ifs.get(f"vxlan{vni}"), ifs.get(f"br{vni}")
        ours = vni in want.managed_vnis or (
            want.vtep_ip is not None and vx is not None and vx.vxlan_local == want.vtep_ip
        )
        if vx is not None and vx.vxlan_id == vni and ours and vx.name not in want.keep:
            cmds.append(f"ip link del vxlan{vni}")
            if br is not None and br.kind == "bridge" and br.name not in want.keep:
                cmds.append(f"ip link del br{vni}")
    if want.vtep_ip is None:
        if "vtep0" in ifs and "vtep0" not in want.keep:
            cmds.append("ip link del vtep0")
        return cmds
    vtep = ifs.get("vtep0")
    if vtep is None:
        cmds.append(VTEP_CREATE)
    if vtep is None or set(vtep.ipv4) != {f"{want.vtep_ip}/32"}:
        if vtep is not None:
            cmds.append("ip -4 addr flush dev vtep0")
        cmds.append(f"ip addr add {want.vtep_ip}/32 dev vtep0")
    if vtep is None or not vtep.up:
        cmds.append("ip link set vtep0 up")
    for vni in sorted(wanted):
        vx_name, br_name = f"vxlan{vni}", f"br{vni}"
        vx, br = ifs.get(vx_name), ifs.get(br_name)
        if vx is not None and (vx.kind != "vxlan" or vx.vxlan_id != vni or vx.vxlan_local != want.vtep_ip):
            cmds.append(f"ip link del {vx_name}")
            vx = None
        if br is None:
            cmds.append(f"ip link add {br_name} mtu {want.overlay_mtu} type bridge stp_state 0")
        elif br.mtu != want.overlay_mtu:
            cmds.append(f"ip link set {br_name} mtu {want.overlay_mtu}")
        if vx is None:
            cmds.append(
                f"ip link add {vx_name} mtu {want.overlay_mtu} type vxlan id {vni} "
                f"local {want.vtep_ip} dstport {VXLAN_PORT} nolearning"
            )
        elif vx.mtu != want.overlay_mtu:
            cmds.append(f"ip link set {vx_name} mtu {want.overlay_mtu}")
        if vx is None or vx.master != br_name:
            cmds.append(f"ip link set {vx_name} master {br_name}")
        if br is None or not br.up:
            cmds.append(f"ip link set {br_name} up")
        if vx is None or not vx.up:
            cmds.append(f"ip link set {vx_name} up")
    return cmds


def baseline_network(baseline: NodeFacts, managed_vnis: tuple[int, ...]) -> DesiredNetwork:
    """The network part of a node's baseline, as a target to roll back to: a device that was
    there before the apply is never removed by its rollback."""
    vtep = baseline.vtep_ip
    keep = frozenset(baseline.interfaces)
    if vtep is None:
        return DesiredNetwork(vtep_ip=None, managed_vnis=managed_vnis, keep=keep)
    vnis = tuple(
        i.vxlan_id
        for i in baseline.interfaces.values()
        if i.kind == "vxlan" and i.vxlan_id and i.vxlan_local == vtep
    )
    mtus = [baseline.interfaces[f"vxlan{v}"].mtu for v in vnis if f"vxlan{v}" in baseline.interfaces]
    return DesiredNetwork(
        vtep_ip=vtep,
        vnis=tuple(sorted(vnis)),
        overlay_mtu=mtus[0] if mtus else 1450,
        managed_vnis=tuple(sorted(set(managed_vnis) | set(vnis))),
        keep=keep,
    )


@dataclasses.dataclass(frozen=True)
class FrrPlan:
    """Which managed files to write (None = delete) and what to do with the daemons; `state`:
    Karios's own files in /etc/frr written with them (the ownership record), which are not FRR
    configuration: they change neither `changed` nor the FRR action."""

    writes: dict[str, str | None]
    action: FrrAction
    state: dict[str, str | None] = dataclasses.field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.writes) or self.action is not FrrAction.NONE


def frr_plan(facts: NodeFacts, files: dict[str, str]) -> FrrPlan:
    """Diff the rendered files against the node; reload only when the config changed."""
    writes: dict[str, str | None] = {n: c for n, c in files.items() if facts.files.get(n) != c}
    if not facts.frr_running:
        action = FrrAction.START
    elif "daemons" in writes:
        action = FrrAction.RESTART
    elif writes:
        action = FrrAction.RELOAD
    else:
        action = FrrAction.NONE
    return FrrPlan(writes, action)


def frr_rollback_plan(baseline: NodeFacts, current: NodeFacts) -> FrrPlan:
    """Restore the baseline's files byte for byte (the ownership record too) and its running state."""
    writes = {
        n: baseline.files.get(n) for n in MANAGED_FILES if current.files.get(n) != baseline.files.get(n)
    }
    state = {RECORD_NAME: baseline.record} if current.record != baseline.record else {}
    if baseline.frr_running:
        if not current.frr_running:
            action = FrrAction.START
        else:
            action = FrrAction.RESTART if writes else FrrAction.NONE
    else:
        action = FrrAction.STOP if current.frr_running else FrrAction.NONE
    return FrrPlan(writes, action, state)


def write_file_command(name: str, content: str | None) -> str:
    """Shell for one managed file; content (which may hold secrets) goes over stdin, never argv."""
    path = shlex.quote(f"/etc/frr/{name}")
    if content is None:
        return f"rm -f {path}"
    tmp = shlex.quote(f"/etc/frr/.{name}.karios-new")
    return (
        f"umask 027 && mkdir -p /etc/frr && cat > {tmp} && chown frr:frr {tmp} && chmod 640 {tmp} "
        f"&& mv -f {tmp} {path}"
    )


def write_file_from_stdin(name: str, content: str | None) -> str:
    """Like :func:`write_file_command`, for a script that writes several files from one stdin:
    reads exactly this file's bytes (``dd iflag=fullblock``), so the next file's follow on stdin."""
    if content is None:
        return write_file_command(name, None)
    size = len(content.encode())
    path = shlex.quote(f"/etc/frr/{name}")
    tmp = shlex.quote(f"/etc/frr/.{name}.karios-new")
    read = f"dd bs={size} count=1 iflag=fullblock status=none of={tmp}" if size else f": > {tmp}"
    return (
        f"umask 027 && mkdir -p /etc/frr && {read} && [ $(wc -c < {tmp}) -eq {size} ] "
        f"&& chown frr:frr {tmp} && chmod 640 {tmp} && mv -f {tmp} {path}"
    )


def commit_script(plan: FrrPlan, net: Sequence[str] = (), *, net_first: bool = True) -> tuple[str, str]:
    """One shell script (and its stdin) making a whole commit in one SSH exec, in order: FRR
    stopped first when the plan stops it, the link changes (before the files when `net_first`,
    else after FRR), the managed files (contents over stdin, never argv), the plan's `state`
    files, the FRR action. Empty script: nothing to do."""
    frr: list[str] = []
    data: list[str] = []
    if plan.action is FrrAction.STOP:
        frr.append(f"{FRRINIT} stop")
    for name in MANAGED_FILES:
        if name in plan.writes:
            content = plan.writes[name]
            frr.append(write_file_from_stdin(name, content))
            data.append(content or "")
    for name, content in sorted(plan.state.items()):
        frr.append(write_file_from_stdin(name, content))
        data.append(content or "")
    action = None if plan.action is FrrAction.STOP else frr_action_command(plan.action)
    if action:
        frr.append(action)
    cmds = [*net, *frr] if net_first else [*frr, *net]
    return ("set -e\n" + "\n".join(cmds)) if cmds else "", "".join(data)


def frr_action_command(action: FrrAction) -> str | None:
    if action is FrrAction.NONE:
        return None
    if action is FrrAction.STOP:
        return f"{FRRINIT} stop"
    if action is FrrAction.START:
        return f"chown frr:frr /etc/frr && {FRRINIT} start"
    return f"{FRRINIT} {action.value}"
