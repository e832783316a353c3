"""Judging a rollout's result (pure): the BGP EVPN verify (one remote poll loop, its verdicts)
and the post-deploy checklist. Takes facts and command output, returns verdicts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from enum import StrEnum

from karios.fabric_worker.rollout.facts import EVPN_SUMMARY_COMMAND, NodeFacts
from karios.fabric_worker.rollout.plan import overlay_mtu


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


def verify_loop_script(interval: float, polls: int, peer_ip: str | None = None, full: str = "") -> str:
    """The verify as ONE remote loop (one SSH exec per node, not one per poll): every `interval`
    s, `show bgp l2vpn evpn summary json` on one line (empty when vtysh fails), at most `polls`
    times. With `peer_ip`, a poll with no TCP session to the peer prints :data:`VERIFY_NO_SESSION`
    instead (but every :data:`VERIFY_FULL_EVERY`-th poll and the last run vtysh anyway). It ends
    by itself, or at its next write once the client closed the channel. `full`: another poll
    printing one line (the overlay checks' poll, whose vtysh run includes the summary) instead
    of the summary alone."""
    summary = full or f"{{ {EVPN_SUMMARY_COMMAND} 2>/dev/null || true; }} | tr -d '\\n'; echo || exit 0; "
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
