"""Pure planning: what to change on a node (diff), how to go back (rollback), and how to
judge the result (verify, post-deploy). No I/O: everything here takes facts and returns
commands or verdicts, so the rules are read and tested without a node.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shlex
from collections.abc import Sequence
from enum import StrEnum

from karios.fabric_worker.rollout.facts import (
    EVPN_SUMMARY_COMMAND,
    FRRINIT,
    MANAGED_FILES,
    NodeFacts,
)

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
        if vx is not None and vx.vxlan_id == vni and ours:
            cmds.append(f"ip link del vxlan{vni}")
            if br is not None and br.kind == "bridge":
                cmds.append(f"ip link del br{vni}")
    if want.vtep_ip is None:
        if "vtep0" in ifs:
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
    """The network part of a node's baseline, as a target to roll back to."""
    vtep = baseline.vtep_ip
    if vtep is None:
        return DesiredNetwork(vtep_ip=None, managed_vnis=managed_vnis)
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
    )


@dataclasses.dataclass(frozen=True)
class FrrPlan:
    """Which managed files to write (None = delete) and what to do with the daemons."""

    writes: dict[str, str | None]
    action: FrrAction

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
    """Restore the baseline's files byte for byte and its running state."""
    writes = {
        n: baseline.files.get(n) for n in MANAGED_FILES if current.files.get(n) != baseline.files.get(n)
    }
    if baseline.frr_running:
        if not current.frr_running:
            action = FrrAction.START
        else:
            action = FrrAction.RESTART if writes else FrrAction.NONE
    else:
        action = FrrAction.STOP if current.frr_running else FrrAction.NONE
    return FrrPlan(writes, action)


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
    else after FRR), the managed files (contents over stdin, never argv), the FRR action.
    Empty script: nothing to do."""
    frr: list[str] = []
    data: list[str] = []
    if plan.action is FrrAction.STOP:
        frr.append(f"{FRRINIT} stop")
    for name in MANAGED_FILES:
        if name in plan.writes:
            content = plan.writes[name]
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


# -- interruptible steps -------------------------------------------------------------------
# A cancel must bite within seconds whatever the node is doing (an FRR restart takes ~6 s). Every
# changing command records its process group in a per-node file — in /run/frr (one per FRR
# instance, so namespaces sharing /run never collide), or /run before FRR is installed — and
# the rollback of an aborted node first kills that group, stops FRR (an interrupted restart
# leaves daemons half up), then restores the baseline like after any other step.
STEP_DIR = "/run/frr"
STEP_PIDFILE = f"{STEP_DIR}/.karios-step.pid"
STEP_PIDFILE_NO_FRR = "/run/.karios-step.pid"


# A step the SSH client sent just before a cancel may start on the node only after the rollback
# looked for it (sshd forks late on a loaded host): it would then change the node behind the
# rollback. Each apply therefore tags its steps with a fence token; the rollback writes the token to
# a fence file *before* it reads the pid file, and a step writes its pid file *before* it reads the
# fence — so either the rollback sees the step (and kills it) or the step sees the fence (and exits
# without running).
STEP_FENCES = (f"{STEP_PIDFILE}.fence", f"{STEP_PIDFILE_NO_FRR}.fence")
FENCED_EXIT = 125


def step_command(command: str, *, killable: bool = True, fence: str = "") -> str:
    """`command` as an interruptible step (stdin passes through; exit status kept). A step
    that is not `killable` (the package install: dpkg is never killed half-way) is waited for.
    With a `fence` token, the step does not run once a rollback has fenced that token."""
    pick = f"f={shlex.quote(STEP_PIDFILE)}; [ -d {STEP_DIR} ] || f={shlex.quote(STEP_PIDFILE_NO_FRR)}; "
    how = "kill" if killable else "wait"
    check = ""
    if fence:
        files = " ".join(shlex.quote(p) for p in STEP_FENCES)
        check = (
            f"if cat {files} 2>/dev/null | grep -qxF -- {shlex.quote(fence)}; then "
            f"echo 'karios: step fenced by a rollback' >&2; exit {FENCED_EXIT}; fi; "
        )
    return (
        pick
        + f'echo "$$ {how}" > "$f" && {check}{{ sh -c {shlex.quote(command)}; rc=$?; rm -f "$f"; exit $rc; }}'
    )


def interrupt_step_script(fence: str = "") -> str:
    """Kill the step in progress (wait for one that is not killable); with `fence`, first stop
    every later step of that apply from running. Prints ``interrupted`` when a step was cut."""
    fence_cmd = ""
    if fence:  # next to where this node's steps keep their pid file (/run may be shared)
        fence_cmd = (
            f"ff={shlex.quote(STEP_FENCES[0])}; [ -d {STEP_DIR} ] || ff={shlex.quote(STEP_FENCES[1])}; "
            f'echo {shlex.quote(fence)} > "$ff"\n'
        )
    return fence_cmd + _INTERRUPT_LOOP


_INTERRUPT_LOOP = f"""\
for f in {shlex.quote(STEP_PIDFILE)} {shlex.quote(STEP_PIDFILE_NO_FRR)}; do
  set -- $(cat "$f" 2>/dev/null)
  p=${{1:-}}; how=${{2:-kill}}
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    if [ "$how" = wait ]; then
      while kill -0 "$p" 2>/dev/null; do sleep 0.5; done
    else
      kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
      i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
      kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
    fi
    echo interrupted
  fi
  rm -f "$f"
done
true
"""
INTERRUPT_STEP_SCRIPT = interrupt_step_script()
# After an interrupted step: FRR is stopped whatever state it was left in (never fails).
FRR_FORCE_STOP = f"{FRRINIT} stop >/dev/null 2>&1; true"


INSTALL_FRR_SCRIPT = """\
set -e
export DEBIAN_FRONTEND=noninteractive
# Keep the package's own frr.conf/daemons out of the way of the rendered ones.
for f in /etc/frr/frr.conf /etc/frr/daemons; do
  dpkg-divert --local --rename --divert "$f.dpkg-dist" --add "$f" >/dev/null
done
install() { apt-get -q -y -o DPkg::Lock::Timeout=300 install frr frr-pythontools >/dev/null; }
install || { apt-get -q update >/dev/null && install; }
test -x /usr/lib/frr/frrinit.sh
"""


# -- verification ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvpnPeer:
    state: str
    pfx_rcd: int
    pfx_snt: int


# A verify poll that found no TCP session to the peer's BGP port prints this instead of running
# vtysh: until the session exists, vtysh (~25 ms of CPU per run, a poll budget of 40/s is a whole
# core) cannot say anything but "not Established", and at 50 nodes the polls competed with the FRR
# start-ups they wait for. Every VERIFY_FULL_EVERY-th poll and the last one run vtysh regardless
# (a peering this check cannot see, e.g. in another network namespace, is still verified).
VERIFY_NO_SESSION = "-"
VERIFY_FULL_EVERY = 8
BGP_PORT = 179


def proc_net_tcp_addr(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp prints it (the 32-bit value in host byte order, hex)."""
    return ipaddress.IPv4Address(ip).packed[::-1].hex().upper()


def bgp_session_test(peer_ip: str) -> str:
    """Shell test: an established TCP connection to or from `peer_ip` on the BGP port."""
    peer, port = proc_net_tcp_addr(peer_ip), f"{BGP_PORT:04X}"
    hexa = "[0-9A-F]"
    return (
        f"grep -qE '^ *[0-9]+: {hexa}{{8}}:{hexa}{{4}} {peer}:{port} 01 "
        f"|^ *[0-9]+: {hexa}{{8}}:{port} {peer}:{hexa}{{4}} 01 ' /proc/net/tcp"
    )


def verify_loop_script(interval: float, polls: int, peer_ip: str | None = None) -> str:
    """The verify as ONE remote loop (one SSH exec per node, not one per poll): every `interval`
    s, `show bgp l2vpn evpn summary json` on one line (empty when vtysh fails), at most `polls`
    times. With `peer_ip`, a poll with no TCP session to the peer prints :data:`VERIFY_NO_SESSION`
    instead (but every :data:`VERIFY_FULL_EVERY`-th poll and the last run vtysh anyway). It ends
    by itself, or at its next write once the client closed the channel."""
    summary = f"{{ {EVPN_SUMMARY_COMMAND} 2>/dev/null || true; }} | tr -d '\\n'; echo || exit 0; "
    poll = summary
    if peer_ip is not None:
        poll = (
            f"if [ $((n % {VERIFY_FULL_EVERY})) -eq 1 ] || [ $n -eq 1 ] || {bgp_session_test(peer_ip)}; "
            f"then {summary}else echo {VERIFY_NO_SESSION} || exit 0; fi; "
        )
    return (
        f"n={int(polls)}; while [ $n -gt 0 ]; do {poll}"
        f"n=$((n-1)); [ $n -gt 0 ] && sleep {interval:.2f}; done; true"
    )


def no_session_verdict(peer_ip: str) -> str:
    """The verdict of a poll that found no TCP session to the peer (:data:`VERIFY_NO_SESSION`)."""
    return f"BGP neighbor {peer_ip} not Established (no TCP session to port {BGP_PORT})"


def parse_evpn_summary(text: str, peer_ip: str) -> EvpnPeer | None:
    """The peer's line of `show bgp l2vpn evpn summary json` (None when not configured)."""
    try:
        data = json.loads(text or "{}")
    except json.JSONDecodeError:
        return None
    peer = (data.get("peers") or {}).get(peer_ip)
    if peer is None:
        return None
    return EvpnPeer(
        state=str(peer.get("state", "")),
        pfx_rcd=int(peer.get("pfxRcd", 0) or 0),
        pfx_snt=int(peer.get("pfxSnt", 0) or 0),
    )


def verify_verdict(peer: EvpnPeer | None, peer_ip: str, expect_routes: bool) -> str | None:
    """None when verified, else the reason (shown to the operator verbatim)."""
    if peer is None:
        return f"BGP neighbor {peer_ip} not configured for l2vpn evpn"
    if peer.state != "Established":
        return f"BGP neighbor {peer_ip} not Established (state {peer.state or 'unknown'})"
    if expect_routes and peer.pfx_snt < 1:
        return f"no EVPN routes advertised to {peer_ip} yet"
    return None


# -- post-deploy checklist -----------------------------------------------------------------


class StepStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    WARNING = "warning"


@dataclasses.dataclass(frozen=True)
class ChecklistStep:
    step_id: str
    status: StepStatus
    message: str
    progress: int


def _step(step_id: str, ok: bool, good: str, bad: str, *, warn: bool = False) -> ChecklistStep:
    if ok:
        return ChecklistStep(step_id, StepStatus.PASSED, good, 100)
    return ChecklistStep(step_id, StepStatus.WARNING if warn else StepStatus.FAILED, bad, 0)


def postdeploy_checklist(
    facts: NodeFacts,
    evpn_summary_json: str,
    *,
    peer_ip: str,
    vnis: tuple[int, ...],
    vxlan_mtu: int,
    underlay_iface: str | None,
    expected_vtep_ip: str | None = None,
) -> list[ChecklistStep]:
    """Five checks a user can act on; each passes or says why not."""
    installed = _step(
        "frr_installed",
        facts.frr_installed and facts.frr_running,
        "FRR installed and running",
        "FRR not installed" if not facts.frr_installed else "FRR installed but not running",
    )
    return [
        installed,
        _vtep_step(facts, expected_vtep_ip),
        *_bgp_steps(evpn_summary_json, peer_ip, vnis),
        _mtu_step(facts, vnis, vxlan_mtu, underlay_iface),
    ]


def _vtep_step(facts: NodeFacts, expected_vtep_ip: str | None) -> ChecklistStep:
    vtep = facts.interfaces.get("vtep0")
    vtep_ok = vtep is not None and vtep.up and bool(vtep.ipv4)
    if vtep_ok and expected_vtep_ip and facts.vtep_ip != expected_vtep_ip:
        return _step("vtep0_up", False, "", f"vtep0 has {facts.vtep_ip}, expected {expected_vtep_ip}")
    return _step(
        "vtep0_up",
        vtep_ok,
        f"vtep0 up with {facts.vtep_ip}",
        "vtep0 missing" if vtep is None else "vtep0 down or without address",
    )


def _bgp_steps(evpn_summary_json: str, peer_ip: str, vnis: tuple[int, ...]) -> list[ChecklistStep]:
    peer = parse_evpn_summary(evpn_summary_json, peer_ip)
    established = peer is not None and peer.state == "Established"
    routes = peer.pfx_rcd + peer.pfx_snt if peer else 0
    return [
        _step(
            "bgp_established",
            established,
            f"BGP EVPN session to {peer_ip} Established",
            verify_verdict(peer, peer_ip, False) or "",
        ),
        _step(
            "evpn_routes",
            established and (routes > 0 or not vnis),
            f"EVPN routes exchanged ({peer.pfx_snt if peer else 0} sent, "
            f"{peer.pfx_rcd if peer else 0} received)",
            "no EVPN routes exchanged with the route reflector",
        ),
    ]


def _mtu_step(
    facts: NodeFacts, vnis: tuple[int, ...], vxlan_mtu: int, underlay_iface: str | None
) -> ChecklistStep:
    under = facts.interfaces.get(underlay_iface or "")
    if under is None:
        return _step("mtu_consistent", False, "", "underlay interface not found")
    want_overlay = overlay_mtu(vxlan_mtu, under.mtu)
    bad_overlay = [
        f"{n} {facts.interfaces[n].mtu}"
        for v in vnis
        for n in (f"vxlan{v}", f"br{v}")
        if n in facts.interfaces and facts.interfaces[n].mtu != want_overlay
    ]
    if under.mtu < vxlan_mtu:
        msg = f"underlay {under.name} MTU {under.mtu} is below the fabric vxlan_mtu {vxlan_mtu}"
        return _step("mtu_consistent", False, "", msg)
    return _step(
        "mtu_consistent",
        not bad_overlay,
        f"underlay MTU {under.mtu}, overlay MTU {want_overlay}",
        f"overlay MTU differs from {want_overlay}: {', '.join(bad_overlay)}",
    )
