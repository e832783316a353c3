"""Post-deploy overlay checks of a node apply (pure): after BGP is Established, every configured
L2 VNI must be on the node and an IMET (EVPN type-3) route must have arrived from every other VTEP
already rolled out; then a timed dataplane probe across the overlay. Shell text and parsers only —
:mod:`.node` runs them over SSH.

What is read (FRR 8.4, one ``vtysh`` run with three commands, one line per poll):

- ``show evpn vni json`` (zebra): the VNIs the node carries, their type and VXLAN device;
- ``show bgp l2vpn evpn vni json`` (bgpd): the VNI known to BGP (``inKernel``) and its import
  route targets, which say which VNI an IMET route belongs to;
- ``show bgp l2vpn evpn route type multicast json``: the type-3 routes, each with its originator
  VTEP (``ip``) and route targets (``extendedCommunity``);
- ``show bgp l2vpn evpn summary json``: each EVPN session's state, age and prefix counts (a hub
  that sends nothing on an Established session: :func:`silent_hub`);
- ``ip -j -d addr show``: the VXLAN devices (exist, up, the VNI) and the bridge's IPv6 link-local
  address (the probe's address on the overlay).

The probe (:func:`probe_script`): the node's VXLAN bridge of the first VNI has no IPv4 address in
a fabric (the tenant's L2 segment), but the kernel gives it an IPv6 link-local one. The node pings
another rolled-out node's bridge link-local (``fe80::…%br<vni>``) with DF at the pair's overlay
MTU: neighbour discovery floods through the head-end replication list that the IMET routes built,
the echo crosses the VXLAN tunnel both ways at full size. A bridge without a link-local address
(IPv6 off on it) cannot be probed: the probe is then skipped, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex

from karios.fabric_worker.rollout.facts import OVERLAY_VTYSH as OVERLAY_COMMAND
from karios.fabric_worker.rollout.facts import Interface, parse_interfaces
from karios.fabric_worker.rollout.verify import EvpnPeer, verify_loop_script

LINKS_COMMAND = "ip -j -d addr show"
# One poll = one line: the three vtysh JSON documents, a tab, the `ip` JSON.
_POLL = (
    f"{{ {{ {OVERLAY_COMMAND} 2>/dev/null || true; }} | tr -d '\\n\\t'; printf '\\t'; "
    f"{LINKS_COMMAND} 2>/dev/null | tr -d '\\n'; echo; }} || exit 0; "
)


def verify_overlay_loop_script(interval: float, polls: int, peer_ip: str) -> str:
    """The verify and then the overlay checks as ONE remote loop (one exec per node, one vtysh
    run per poll): :func:`.verify.verify_loop_script` gated on the BGP session, each poll the
    overlay line (:func:`parse_overlay`), whose EVPN summary is the verify's
    (:func:`session_peer`); the line that verifies is the overlay checks' first look."""
    return verify_loop_script(interval, polls, peer_ip, full=_POLL)


def session_peer(view: OverlayView, peer_ip: str) -> EvpnPeer | None:
    """The verify's view of the peer from an overlay line (None: not in the EVPN summary)."""
    s = view.sessions.get(peer_ip)
    return None if s is None else EvpnPeer(state=s.state, pfx_rcd=s.pfx_rcd, pfx_snt=s.pfx_snt)


def overlay_loop_script(interval: float, polls: int) -> str:
    """The overlay check as ONE remote loop: every `interval` s one line (:func:`parse_overlay`),
    at most `polls` times; it ends by itself, or at its next write once the client closed."""
    return (
        f"n={int(polls)}; while [ $n -gt 0 ]; do {_POLL}"
        f"n=$((n-1)); [ $n -gt 0 ] && sleep {interval:.2f}; done; true"
    )


@dataclasses.dataclass(frozen=True)
class Imet:
    vtep: str  # the originator's VTEP address
    rts: frozenset[str]  # "65000:100"


@dataclasses.dataclass(frozen=True)
class Session:
    """One EVPN session as the node sees it."""

    state: str
    up_s: float  # how long it has been Established (0 when not)
    pfx_rcd: int
    pfx_snt: int


@dataclasses.dataclass(frozen=True)
class OverlayView:
    """One look at a node's overlay (None fields: that command printed nothing usable)."""

    zebra_vnis: dict[int, str] | None  # L2 VNI -> its VXLAN device (zebra)
    bgp_vnis: dict[int, frozenset[str]] | None  # VNI known to bgpd in the kernel -> import RTs
    imets: tuple[Imet, ...] | None
    links: dict[str, Interface]
    link_locals: dict[str, str]  # device -> its IPv6 link-local address
    sessions: dict[str, Session] = dataclasses.field(default_factory=dict)  # EVPN peer -> its session


def _json_docs(text: str) -> list[object]:
    """The JSON documents `text` holds one after another (vtysh prints one per command)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        try:
            doc, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # "% Unknown command", a daemon down: the rest is not read
        out.append(doc)


def parse_zebra_vnis(doc: object) -> dict[int, str] | None:
    """``show evpn vni json``: {VNI: VXLAN device} of the L2 VNIs."""
    if not isinstance(doc, dict):
        return None
    out = {}
    for key, v in doc.items():
        if isinstance(v, dict) and str(key).isdigit() and v.get("type", "L2") == "L2":
            out[int(key)] = str(v.get("vxlanIf", ""))
    return out


def parse_bgp_vnis(doc: object) -> dict[int, frozenset[str]] | None:
    """``show bgp l2vpn evpn vni json``: {VNI in the kernel: import route targets}."""
    if not isinstance(doc, dict):
        return None
    out = {}
    for key, v in doc.items():
        if isinstance(v, dict) and str(key).isdigit() and str(v.get("inKernel", "True")) == "True":
            out[int(key)] = frozenset(str(rt) for rt in v.get("importRTs") or [])
    return out


_RT = re.compile(r"RT:(\S+)")


def parse_imets(doc: object) -> tuple[Imet, ...] | None:
    """``show bgp l2vpn evpn route type multicast json``: every valid type-3 path (RD → prefix →
    paths, a list of lists in FRR 8.4), its originator and route targets."""
    if not isinstance(doc, dict):
        return None
    out = []
    for rd in doc.values():
        if not isinstance(rd, dict):
            continue
        for prefix in rd.values():
            if not isinstance(prefix, dict):
                continue
            for group in prefix.get("paths") or []:
                for path in group if isinstance(group, list) else [group]:
                    if not isinstance(path, dict) or path.get("routeType", 3) != 3:
                        continue
                    if path.get("valid") is False or not path.get("ip"):
                        continue
                    community = (path.get("extendedCommunity") or {}).get("string", "")
                    out.append(Imet(vtep=str(path["ip"]), rts=frozenset(_RT.findall(community))))
    return tuple(out)


def parse_sessions(doc: object) -> dict[str, Session]:
    """``show bgp l2vpn evpn summary json``: {peer address: its session}."""
    peers = doc.get("peers") if isinstance(doc, dict) else None
    out = {}
    for ip, p in (peers or {}).items() if isinstance(peers, dict) else ():
        if not isinstance(p, dict):
            continue
        state = str(p.get("state", ""))
        try:
            up_s = int(p.get("peerUptimeMsec") or 0) / 1000 if state == "Established" else 0.0
            out[str(ip)] = Session(state, up_s, int(p.get("pfxRcd") or 0), int(p.get("pfxSnt") or 0))
        except (TypeError, ValueError):
            continue
    return out


def _link_locals(ip_json: str) -> dict[str, str]:
    try:
        raw = json.loads(ip_json or "[]")
    except json.JSONDecodeError:
        return {}
    out = {}
    for link in raw if isinstance(raw, list) else []:
        for a in link.get("addr_info") or []:
            if a.get("family") == "inet6" and str(a.get("local", "")).startswith("fe80:"):
                out.setdefault(str(link.get("ifname", "")), str(a["local"]))
    return out


def parse_overlay(line: str) -> OverlayView:
    """One poll line of :func:`overlay_loop_script` (or the discovery's overlay section with
    the discovery's own ``ip`` JSON): never raises, unusable parts are None / empty."""
    vtysh, _, links = line.partition("\t")
    docs = [*_json_docs(vtysh), None, None, None, None]
    try:
        interfaces = parse_interfaces(links) if links.strip() else {}
    except (ValueError, KeyError, TypeError):
        interfaces = {}
    return OverlayView(
        zebra_vnis=parse_zebra_vnis(docs[0]),
        bgp_vnis=parse_bgp_vnis(docs[1]),
        imets=parse_imets(docs[2]),
        links=interfaces,
        link_locals=_link_locals(links),
        sessions=parse_sessions(docs[3]),
    )


# -- (a) every configured VNI on the node --------------------------------------------------


def vni_problems(view: OverlayView, vnis: tuple[int, ...], *, evpn: bool = True) -> list[str]:
    """What is wrong with each configured VNI on the node ([] = all present and up). Without
    `evpn` (no ``advertise-all-vni``: FRR holds no VNI) only the VXLAN devices are checked."""
    if evpn and (view.zebra_vnis is None or view.bgp_vnis is None):
        return ["FRR's EVPN VNI tables could not be read (zebra/bgpd not answering)"]
    by_vni = {i.vxlan_id: i for i in view.links.values() if i.kind == "vxlan" and i.vxlan_id}
    out = []
    for vni in vnis:
        link = by_vni.get(vni)
        if link is None:
            out.append(f"VNI {vni}: no VXLAN device with VNI {vni}")
        elif not link.up:
            out.append(f"VNI {vni}: {link.name} is down")
        elif not evpn or view.zebra_vnis is None or view.bgp_vnis is None:
            continue
        elif vni not in view.zebra_vnis:
            out.append(f"VNI {vni}: not in FRR's EVPN VNIs (show evpn vni)")
        elif vni not in view.bgp_vnis:
            out.append(f"VNI {vni}: not known to BGP EVPN (show bgp l2vpn evpn vni)")
    return out


# -- (b) an IMET route from every other rolled-out VTEP ---------------------------------------


def _vni_of_rts(rts: frozenset[str], bgp_vnis: dict[int, frozenset[str]]) -> set[int]:
    """The VNIs a route with `rts` is imported into: its RT among the VNI's import RTs, else
    (no import RTs known) FRR's auto RT ``<AS>:<VNI>``."""
    out = {vni for vni, imports in bgp_vnis.items() if imports and rts & imports}
    for rt in rts:
        tail = rt.rsplit(":", 1)[-1]
        if tail.isdigit() and int(tail) in bgp_vnis and not bgp_vnis[int(tail)]:
            out.add(int(tail))
    return out


def imet_seen(view: OverlayView) -> dict[int, set[str]]:
    """Per VNI of the node, the VTEPs it has an IMET route from."""
    seen: dict[int, set[str]] = {vni: set() for vni in view.bgp_vnis or {}}
    for r in view.imets or ():
        for vni in _vni_of_rts(r.rts, view.bgp_vnis or {}):
            seen[vni].add(r.vtep)
    return seen


def imet_on_every_vni(view: OverlayView, vnis: tuple[int, ...]) -> set[str]:
    """The VTEPs the node has an IMET route from on every configured VNI: what a passed check
    saw arrive, counted by the job or not (a VTEP counted later whose routes were already in
    needs no second look)."""
    seen = imet_seen(view)
    per_vni = [seen.get(vni, set()) for vni in vnis]
    return set.intersection(*per_vni) if per_vni else set()


def imet_missing(view: OverlayView, vnis: tuple[int, ...], expected: set[str]) -> dict[int, set[str]]:
    """Per configured VNI, the `expected` VTEPs (the other rolled-out nodes') with no IMET route."""
    if not expected:
        return {}
    seen = imet_seen(view)
    out = {vni: expected - seen.get(vni, set()) for vni in vnis}
    return {vni: m for vni, m in out.items() if m}


def imet_problems(missing: dict[int, set[str]]) -> list[str]:
    return [
        f"VNI {vni}: no IMET (type-3) route from VTEP {', '.join(sorted(m))}"
        for vni, m in sorted(missing.items())
    ]


def overlay_verdict(
    view: OverlayView, vnis: tuple[int, ...], expected: set[str], *, evpn: bool = True
) -> str | None:
    """None when (a) and (b) pass, else the reason (shown verbatim, without the node's name).
    Without `evpn` (no ``advertise-all-vni``: no VNI is advertised) only the devices count."""
    problems = vni_problems(view, vnis, evpn=evpn)
    if not evpn:
        return "; ".join(problems) or None
    if view.imets is None and not problems:
        problems = ["EVPN type-3 routes could not be read"]
    problems = problems or imet_problems(imet_missing(view, vnis, expected))
    return "; ".join(problems) or None


def overlay_passed(view: OverlayView, vnis: tuple[int, ...], expected: set[str], *, evpn: bool = True) -> str:
    """What a passed check says in the node's event."""
    n = len(expected)
    imet = f"IMET from {n} other VTEP(s)" if n else "no other VTEP rolled out yet"
    if not evpn:
        imet = "IMET not checked (advertise-all-vni off)"
    return f"{len(vnis)} VNI(s) up ({', '.join(map(str, vnis))}); {imet}"


# -- (b') a hub that lost this node ------------------------------------------------------------

# How long an Established session may carry nothing from the hub while other VTEPs' routes are
# missing before the node resets it: a hub sends its table right after the session comes up
# (well under a second here, even under load), so 5 s of silence is not slowness.
SILENT_HUB_AFTER_S = 5.0


def silent_hub(view: OverlayView, hub_ip: str, missing: dict[int, set[str]]) -> str | None:
    """Why the session to the hub must be reset, or None. The hub is silent when the session is
    Established for :data:`SILENT_HUB_AFTER_S`, this node has advertised its own routes, and it
    received *nothing* while IMET routes of other rolled-out VTEPs are missing: the hub holds
    those routes (they reached it from the other nodes) but does not send them on this session.

    Seen on FRR 8.4 as the hub (the switch's ``bgp listen range``, the lab's route reflector):
    when a node's session comes back while the hub has not yet cleared the old one (the hub
    busy), the hub takes the new connection into the old dynamic peer, which then disappears
    from its configuration (``show bgp summary`` lists it no longer) and is never sent an update
    — while what the node sends is still reflected to the others (FRR issue 9929, fixed in FRR
    PR 20120, FRR 10.5). Resetting the session from the node makes the hub delete that peer and
    take the next connection as a new one."""
    s = view.sessions.get(hub_ip)
    if not missing or s is None or s.state != "Established" or s.up_s < SILENT_HUB_AFTER_S:
        return None
    if s.pfx_rcd or not s.pfx_snt:
        return None
    vteps = sorted(set().union(*missing.values()))
    return (
        f"the session to {hub_ip} was Established {s.up_s:.0f} s with {s.pfx_snt} route(s) sent and none"
        f" received while the IMET routes of {', '.join(vteps)} were missing: session reset (a hub that"
        " lost this dynamic peer)"
    )


def hub_reset_command(hub_ip: str) -> str:
    """Reset the BGP session to `hub_ip` (a hard reset: the hub sees the session end)."""
    return f"vtysh -c {shlex.quote(f'clear bgp {hub_ip}')}"


# -- the VTEPs already rolled out (one per job, shared by its nodes) ------------------------


@dataclasses.dataclass(frozen=True)
class RolledOutVtep:
    node_ip: str
    label: str  # "node2 (198.18.0.12)"
    vtep_ip: str
    link_local: str = ""  # IPv6 link-local of its probe bridge ("" = none: not a probe target)
    overlay_mtu: int = 0
    since: float = 0.0  # when it was counted (the caller's monotonic clock; 0: before the job)
    # the other VTEPs whose IMET routes its own passed check saw (a peer missing from it may not
    # be reachable back from this node yet: see plan_probe)
    checked_against: frozenset[str] = frozenset()


def settle_deadline(started: float, expected: tuple[RolledOutVtep, ...], settle: float) -> float:
    """When a node's overlay check gives up: `settle` s after it started, or after the latest of
    the VTEPs it waits for was counted, whichever is later (a VTEP rolled out while this node was
    being checked gets the same time for its IMET routes to arrive)."""
    return max([started, *(v.since for v in expected)]) + settle


class RolledOut:
    """The VTEPs that passed the post-deploy checks (plus any known rolled out before): a node
    checked later expects an IMET route from each of them. Plain state, no I/O; a job owns one."""

    def __init__(self, before: tuple[RolledOutVtep, ...] = ()) -> None:
        self._by_node: dict[str, RolledOutVtep] = {v.node_ip: v for v in before}

    def add(self, vtep: RolledOutVtep) -> None:
        self._by_node[vtep.node_ip] = vtep

    def discard(self, node_ip: str) -> None:
        self._by_node.pop(node_ip, None)

    def others(self, node_ip: str, own_vtep: str) -> tuple[RolledOutVtep, ...]:
        return tuple(v for ip, v in sorted(self._by_node.items()) if ip != node_ip and v.vtep_ip != own_vtep)


# -- (c) the timed dataplane probe -------------------------------------------------------------

IPV6_ICMP_OVERHEAD = 48  # IPv6 header 40 + ICMPv6 echo 8
_RTT = re.compile(r"time=([0-9.]+) ms")


@dataclasses.dataclass(frozen=True)
class ProbePlan:
    target: RolledOutVtep
    bridge: str
    mtu: int  # the IPv6 packet's size: the smaller overlay MTU of the pair

    @property
    def payload(self) -> int:
        return self.mtu - IPV6_ICMP_OVERHEAD


def plan_probe(
    peers: tuple[RolledOutVtep, ...],
    vnis: tuple[int, ...],
    own_mtu: int,
    own_link_local: str,
    *,
    evpn: bool = True,
    own_vtep: str = "",
) -> ProbePlan | str:
    """The probe to run, or why none can: a peer with a link-local address on the same bridge
    (one whose own check saw `own_vtep`'s IMET route if any), at min(own, peer) overlay MTU."""
    if not vnis:
        return "no VNI configured"
    if not evpn:
        return "advertise-all-vni off: no EVPN flooding list to reach another VTEP with"
    bridge = f"br{vnis[0]}"
    if not own_link_local:
        return f"{bridge} has no IPv6 link-local address (IPv6 off on it): no address on the overlay"
    targets = [p for p in peers if p.link_local]
    if not targets:
        return "no other VTEP with an overlay address rolled out yet"
    # A peer whose own check saw this node's IMET route first: its reply path is known good.
    peer = next((p for p in targets if own_vtep and own_vtep in p.checked_against), targets[0])
    mtu = min(own_mtu, peer.overlay_mtu or own_mtu)
    return ProbePlan(target=peer, bridge=bridge, mtu=mtu)


PROBE_ROUND_S = 3  # one ping process: a neighbour resolution that fails ends it after ~3 s


def probe_script(plan: ProbePlan, deadline_s: int, interval_s: float = 0.2) -> str:
    """Ping the peer's bridge link-local with DF at the pair's MTU until the first reply, for
    about `deadline_s` s: each round is one ping process sending an echo request every
    `interval_s` s (a reply is seen within `interval_s` of the path converging), ended by the
    reply, by its own deadline, or by a failed neighbour resolution (iputils then exits after
    ~3 s: "Address unreachable"); then the next round. Prints the last round's output."""
    dst = shlex.quote(f"{plan.target.link_local}%{plan.bridge}")
    ping = f"ping -6 -n -c 1 -i {interval_s:.1f} -w {PROBE_ROUND_S} -M do -s {plan.payload} {dst}"
    rounds = max(1, math.ceil(deadline_s / PROBE_ROUND_S))
    return (
        f'i=0; while [ $i -lt {rounds} ]; do out=$({ping} 2>&1) && break; i=$((i+1)); done; echo "$out"; true'
    )


def probe_rtt_ms(output: str) -> float | None:
    """The echo's round-trip time in ms from ping's output (None: no reply)."""
    if " 0 received" in output or "100% packet loss" in output:
        return None
    m = _RTT.search(output)
    return float(m.group(1)) if m else None


def probe_message(plan: ProbePlan, rtt_ms: float | None, elapsed_s: float) -> str:
    where = f"over {plan.bridge} to {plan.target.label} ({plan.target.link_local})"
    if rtt_ms is None:
        return f"DF ping {plan.mtu} B {where}: no reply after {elapsed_s:.1f} s"
    return f"DF ping {plan.mtu} B {where}: rtt {rtt_ms:.3f} ms, answered after {elapsed_s:.2f} s"
