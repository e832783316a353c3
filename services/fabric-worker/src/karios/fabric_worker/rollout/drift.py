"""Drift (pure): how one node differs from the intent, from what a read-only look at it found.

The same rules as apply and post-deploy, so "no drift" means "a node apply would change nothing
and the checklist passes": the rendered FRR files against the node's (compared by sha256, the
contents hold secrets), the ``ip`` changes an apply would make (vtep0, the VXLAN devices and
their MTUs), FRR running, the BGP EVPN session to the route reflector and EVPN routes seen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from karios.common.contracts.fabric_rollout import DriftFinding
from karios.fabric_worker.rollout.facts import NodeFacts, find_underlay
from karios.fabric_worker.rollout.intent import FabricIntent, NodeOverride
from karios.fabric_worker.rollout.ownership import foreign_devices
from karios.fabric_worker.rollout.plan import DesiredNetwork, network_commands, overlay_mtu
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from karios.fabric_worker.rollout.verify import StepStatus, postdeploy_checklist

_VNI_MARK = "@@karios:vni:"


def remote_vteps_command(vnis: tuple[int, ...]) -> str:
    """One SSH command: ``show evpn vni <v> json`` per VNI, each after a marker line."""
    return "; ".join(f"echo '{_VNI_MARK}{v}'; vtysh -c 'show evpn vni {v} json'" for v in vnis) or "true"


def parse_remote_vteps(output: str) -> dict[int, set[str]]:
    """Remote VTEPs zebra installed per VNI (FRR 8.4 lists them under ``numRemoteVteps``, sic;
    later releases under ``remoteVteps``). A VNI whose output is not JSON maps to no VTEP."""
    chunks: dict[int, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(_VNI_MARK):
            current = int(line[len(_VNI_MARK) :].strip())
            chunks[current] = []
        elif current is not None:
            chunks[current].append(line)
    out: dict[int, set[str]] = {}
    for vni, lines in chunks.items():
        try:
            data = json.loads("\n".join(lines) or "{}")
        except json.JSONDecodeError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        vteps = data.get("remoteVteps") or data.get("numRemoteVteps") or []
        out[vni] = (
            {v["ip"] if isinstance(v, dict) else str(v) for v in vteps} if isinstance(vteps, list) else set()
        )
    return out


def missing_vteps(
    seen: dict[int, set[str]], expected: set[str], vnis: tuple[int, ...]
) -> dict[int, frozenset[str]]:
    """Per VNI, the `expected` remote VTEPs (the other nodes' addresses) it does not see."""
    out = {vni: frozenset(expected - seen.get(vni, set())) for vni in vnis}
    return {vni: m for vni, m in out.items() if m}


def missing_findings(missing: dict[int, frozenset[str]]) -> list[DriftFinding]:
    """A ``vteps`` finding per VNI that misses some remote VTEP."""
    return [
        DriftFinding(kind="vteps", message=f"VNI {vni}: remote VTEPs not seen: {', '.join(sorted(m))}")
        for vni, m in sorted(missing.items())
        if m
    ]


def vtep_findings(seen: dict[int, set[str]], expected: set[str], vnis: tuple[int, ...]) -> list[DriftFinding]:
    """A finding per VNI missing some of the `expected` remote VTEPs (the other nodes' addresses)."""
    return missing_findings(missing_vteps(seen, expected, vnis))


def bgp_admin_shutdown(evpn_summary_json: str, peer_ip: str) -> bool:
    """The peer is shut down by configuration (``neighbor … shutdown``): FRR's summary says
    ``"state": "Idle (Admin)"`` (``"peerState": "Admin"``; ``adminShutDown`` in ``show bgp
    neighbor json``)."""
    try:
        data = json.loads(evpn_summary_json or "{}")
    except json.JSONDecodeError:
        return False
    peer = (data.get("peers") or {}).get(peer_ip) if isinstance(data, dict) else None
    if not isinstance(peer, dict):
        return False
    state = str(peer.get("state", ""))
    return "(Admin)" in state or peer.get("peerState") == "Admin" or peer.get("adminShutDown") is True


def sha256(text: str | None) -> str:
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else ""


@dataclasses.dataclass(frozen=True)
class NodeDrift:
    """The verdict on one node (no secrets: file contents are reduced to hashes)."""

    node_ip: str
    fqdn: str = ""
    findings: tuple[DriftFinding, ...] = ()
    frr_config_sha256: str = ""
    intent_sha256: str = ""
    # The node's view of the other nodes' VTEPs (``looked``: read this round), per VNI the
    # expected ones it misses: drift_rules.attribute decides whose finding each one is.
    looked: bool = False
    missing: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)
    # Findings seen but not reported (drift_rules.hold): (finding, why) with why "settling" or
    # "unconfirmed".
    held: tuple[tuple[DriftFinding, str], ...] = ()

    @property
    def label(self) -> str:
        return self.fqdn or self.node_ip

    @property
    def settling(self) -> bool:
        return any(why == "settling" for _, why in self.held)

    @property
    def drifted(self) -> bool:
        return bool(self.findings)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(f.kind for f in self.findings)


def unreachable(node_ip: str, fqdn: str, message: str) -> NodeDrift:
    return NodeDrift(node_ip, fqdn, (DriftFinding(kind="unreachable", message=message),))


def _underlay(facts: NodeFacts, intent: FabricIntent, override: NodeOverride | None) -> tuple[str, int]:
    if override is not None:
        name = override.underlay_bridge_name or override.underlay_iface_hint
        iface = facts.interfaces.get(name)
        return (name, iface.mtu) if iface is not None else ("", 0)
    matches = find_underlay(facts, intent.underlay_cidr)
    return (matches[0].iface, matches[0].mtu) if matches else ("", 0)


def _file_findings(facts: NodeFacts, files: dict[str, str]) -> list[DriftFinding]:
    out = []
    for name, want in files.items():
        have = facts.files.get(name)
        if have == want:
            continue
        kind = "frr config" if name == "frr.conf" else f"frr {name}"
        state = "missing" if have is None else f"sha256 {sha256(have)[:12]}, intent {sha256(want)[:12]}"
        out.append(DriftFinding(kind=kind, message=f"/etc/frr/{name} differs from the intent ({state})"))
    return out


def _network_findings(cmds: list[str]) -> list[DriftFinding]:
    """Classify the ``ip`` commands an apply would run into what a user reads."""
    if not cmds:
        return []
    vtep = [c for c in cmds if "vtep0" in c]
    other = [c for c in cmds if "vtep0" not in c]
    out = []
    if "ip link add vtep0" in " ".join(vtep):
        out.append(DriftFinding(kind="vtep0 missing", message="vtep0 missing"))
    elif vtep:
        out.append(DriftFinding(kind="vtep0", message="vtep0 differs: " + "; ".join(vtep)))
    if other:
        mtu = all(c.startswith("ip link set ") and " mtu " in c for c in other)
        out.append(
            DriftFinding(
                kind="mtu" if mtu else "vxlan",
                message=("overlay MTU differs: " if mtu else "VXLAN devices differ: ") + "; ".join(other),
            )
        )
    return out


def _kinds(findings: list[DriftFinding]) -> set[str]:
    return {f.kind for f in findings}


_CHECK_KINDS = {"frr_installed": "frr not running", "bgp_established": "bgp session", "evpn_routes": "evpn"}
_NO_SESSION = {"bgp session", "bgp shutdown"}


def judge_drift(
    node_ip: str,
    facts: NodeFacts,
    evpn_summary_json: str,
    intent: FabricIntent,
    *,
    vtep_ip: str | None,
    override: NodeOverride | None = None,
    remote_vteps: dict[int, set[str]] | None = None,
    expected_vteps: set[str] = frozenset(),  # type: ignore[assignment]
) -> NodeDrift:
    """Every difference between the node and the intent; none means the node is in sync.
    `remote_vteps` (None: not looked at) is checked against `expected_vteps`, the other nodes'."""
    iface, under_mtu = _underlay(facts, intent, override)
    findings: list[DriftFinding] = []
    want_sha = ""
    if not vtep_ip:
        findings.append(DriftFinding(kind="vtep0", message="no VTEP address is allocated to the node"))
    elif not iface:
        findings.append(DriftFinding(kind="mtu", message=f"no underlay interface in {intent.underlay_cidr}"))
    else:
        files = render_node_files(
            intent, NodeRenderInput(hostname=facts.hostname, vtep_ip=vtep_ip, underlay_iface=iface)
        ).as_dict()
        want_sha = sha256(files["frr.conf"])
        findings += _file_findings(facts, files)
        want = DesiredNetwork(
            vtep_ip=vtep_ip,
            vnis=intent.vnis,
            overlay_mtu=overlay_mtu(intent.vxlan_mtu, under_mtu),
            managed_vnis=intent.vnis,
            keep=foreign_devices(facts, intent.vnis),  # as the apply: not Karios's, not drift
        )
        findings += _network_findings(network_commands(facts, want))
    steps = postdeploy_checklist(
        facts,
        evpn_summary_json,
        peer_ip=intent.peer_ip,
        vnis=intent.vnis,
        vxlan_mtu=intent.vxlan_mtu,
        underlay_iface=iface or None,
        expected_vtep_ip=vtep_ip,
    )
    for st in steps:
        if st.step_id in _CHECK_KINDS and st.status is StepStatus.FAILED:
            if st.step_id == "evpn_routes" and _kinds(findings) & _NO_SESSION:
                continue  # no routes follows from no session: one finding is enough
            if st.step_id == "bgp_established" and bgp_admin_shutdown(evpn_summary_json, intent.peer_ip):
                message = f"BGP neighbor {intent.peer_ip} administratively shut down"
                findings.append(DriftFinding(kind="bgp shutdown", message=message))
                continue
            findings.append(DriftFinding(kind=_CHECK_KINDS[st.step_id], message=st.message))
    looked = remote_vteps is not None and intent.advertise_all_vni and not _kinds(findings) & _NO_SESSION
    missing = missing_vteps(remote_vteps or {}, set(expected_vteps), intent.vnis) if looked else {}
    findings += missing_findings(missing)
    return NodeDrift(
        node_ip=node_ip,
        fqdn=facts.hostname,
        findings=tuple(findings),
        frr_config_sha256=sha256(facts.files.get("frr.conf")),
        intent_sha256=want_sha,
        looked=looked,
        missing=missing,
    )
