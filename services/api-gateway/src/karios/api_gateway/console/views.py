"""The console's view models (pure): state → what a page shows, role → which controls exist,
fabric nodes → topology coordinates. No I/O, no clock; the routes load, these decide."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from ipaddress import ip_address
from typing import Any

from karios.api_gateway.auth import Role
from karios.common.contracts.fabric_rollout import FabricDriftView, FabricJobView, FabricPreflightResult
from karios.common.provisioning import TERMINAL_STATES, VENDORS

#: SSE event names of the ``provision`` channel (``job_<state>`` and the installer's ``job_step``).
_PROVISION_FACTS = (
    "queued",
    "building_media",
    "mounting",
    "booting",
    "installing",
    "first_boot",
    "completed",
    "failed",
    "cancelled",
    "stuck",
    "step",
    "resumed",
)
PROVISION_EVENTS = tuple(f"job_{s}" for s in _PROVISION_FACTS)
VENDOR_CHOICES = VENDORS


@dataclass(frozen=True)
class Controls:
    """Which write controls a page renders at all (a viewer gets none; the API refuses anyway)."""

    provision: bool = False  # operator: POST /controlnode/provision
    cancel_job: bool = False  # operator: POST /controlnode/job/{id}/cancel
    preflight: bool = False  # operator: POST /controlnode/fabric-config/preflight
    edit_fabric: bool = False  # operator: POST /controlnode/fabric-config (+ the ack flow)
    apply_fabric: bool = False  # fabric_admin: POST /controlnode/fabric-config/apply
    preview_diff: bool = False  # operator: POST /controlnode/fabric-config/diff (SSH, read-only)

    @property
    def any(self) -> bool:
        return any(self.__dict__.values())


def controls_for(role: Role) -> Controls:
    """The write controls of ``role``, mirroring the roles the API routes require."""
    operator = role >= Role.operator
    return Controls(
        provision=operator,
        cancel_job=operator,
        preflight=operator,
        edit_fabric=operator,
        apply_fabric=role >= Role.fabric_admin,
        preview_diff=operator,
    )


def status_class(status: str) -> str:
    """CSS class of a job / progress status."""
    return {
        "completed": "ok",
        "failed": "fail",
        "cancelled": "muted",
        "stuck": "warn",
        "running": "run",
    }.get(status, "muted")


# -- provisioning --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobLine:
    job_id: str
    bmc_ip: str
    job_type: str
    state: str  # the state machine's state (job_status)
    status: str
    progress: int
    message: str
    position: int  # queue position (0: active or ended)
    updated_at: str
    css: str
    cancellable: bool


def job_lines(jobs: list[dict[str, Any]], queue: list[dict[str, Any]], controls: Controls) -> list[JobLine]:
    """Recent jobs (``JobOut`` dicts, newest first) merged with the provisioner's queue entries
    (a queued job shows its position; a job only the queue knows is listed too)."""
    positions = {e["job_id"]: int(e.get("position") or 0) for e in queue}
    seen: set[str] = set()
    lines = []
    for j in jobs:
        seen.add(j["id"])
        lines.append(_line(j, positions.get(j["id"], 0), controls))
    for e in queue:
        if e["job_id"] not in seen:
            j = {
                "id": e["job_id"],
                "bmc_ip": e.get("bmc_ip", ""),
                "job_type": e.get("job_type", "provision"),
                "job_status": e.get("state", ""),
                "status": "running",
                "progress": 0,
                "message": "",
                "updated_at": e.get("created_at", ""),
            }
            lines.insert(0, _line(j, int(e.get("position") or 0), controls))
    return lines


def _line(j: dict[str, Any], position: int, controls: Controls) -> JobLine:
    return JobLine(
        job_id=j["id"],
        bmc_ip=j.get("bmc_ip", ""),
        job_type=j.get("job_type", ""),
        state=j.get("job_status", ""),
        status=j.get("status", ""),
        progress=int(j.get("progress") or 0),
        message=j.get("message", ""),
        position=position,
        updated_at=short_time(j.get("updated_at", "")),
        css=status_class(j.get("status", "")),
        cancellable=controls.cancel_job and j.get("status") not in TERMINAL_STATES,
    )


def last_job_by_bmc(lines: list[JobLine]) -> dict[str, JobLine]:
    """BMC address → its newest job (``lines`` newest first)."""
    out: dict[str, JobLine] = {}
    for line in lines:
        out.setdefault(line.bmc_ip, line)
    return out


@dataclass(frozen=True)
class TimelineStep:
    stage: str
    percent: int
    status: str
    message: str
    at: str
    css: str
    current: bool


def stage_timeline(progresses: list[dict[str, Any]]) -> list[TimelineStep]:
    """A job's progress records (oldest first) as a timeline; repeated reports of one stage are
    folded into its latest; the last step is the current one."""
    steps: list[TimelineStep] = []
    for p in progresses:
        step = TimelineStep(
            stage=p.get("stage", ""),
            percent=int(p.get("percent_complete") or 0),
            status=p.get("status", ""),
            message=p.get("message", ""),
            at=short_time(p.get("created_at", "")),
            css=status_class(p.get("status", "")),
            current=False,
        )
        if steps and steps[-1].stage == step.stage:
            steps[-1] = step
        else:
            steps.append(step)
    # A stage the job moved on from while running is done; the last one is where it is now.
    steps = [replace(s, css="ok") if s.status == "running" else s for s in steps[:-1]] + steps[-1:]
    if steps:
        steps[-1] = replace(steps[-1], current=True)
    return steps


def short_time(iso: str) -> str:
    """``2026-12-01T19:45:25.123+00:00`` → ``19:45:25`` (UTC as stored); unparsable text as is."""
    try:
        return datetime.fromisoformat(iso).strftime("%H:%M:%S")
    except (TypeError, ValueError):
        return iso


# -- fabric --------------------------------------------------------------------------------

#: state → (label, css class). "established": the last apply verified the node's BGP session
#: Established and EVPN up, or the last drift check (if newer) found nothing.
FABRIC_STATES = {
    "established": ("Established", "st-established"),
    "bgp_down": ("BGP down", "st-down"),
    "evpn_down": ("EVPN down", "st-warn"),
    "drifted": ("drifted", "st-warn"),
    "failed": ("apply failed", "st-down"),
    "applying": ("applying", "st-applying"),
    "removed": ("removed", "st-pending"),
    "pending": ("not applied", "st-pending"),
}
_BGP_KINDS = {"bgp session", "unreachable", "frr not running"}


@dataclass(frozen=True)
class FabricNode:
    node_ip: str
    fqdn: str
    vtep_ip: str
    state: str
    label: str
    css: str
    detail: str = ""
    mtu_note: str = ""  # preflight: this node's underlay MTU differs from the others'


def _when(iso: str) -> datetime | None:
    try:
        return datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None


def _ip_key(ip: str) -> tuple[int, int | str]:
    try:
        return (0, int(ip_address(ip)))
    except ValueError:
        return (1, ip)


def fabric_nodes(
    node_ips: dict[str, str],
    latest: FabricJobView | None,
    drift: FabricDriftView | None,
    preflight: FabricPreflightResult | None = None,
) -> list[FabricNode]:
    """Every fabric node (``node_ips``: ip → name, plus those the job, drift or preflight name)
    with its BGP/EVPN state from whichever is newer, the last job or the last drift check."""
    names = dict(node_ips)
    job_nodes = {n.node_ip: n for n in latest.nodes} if latest else {}
    drift_nodes = {n.node_ip: n for n in drift.nodes} if drift else {}
    pf_nodes = {n.node_ip: n for n in preflight.nodes} if preflight else {}
    for src in (job_nodes, drift_nodes, pf_nodes):
        for ip, n in src.items():
            if n.fqdn or ip not in names:
                names[ip] = n.fqdn or names.get(ip, "")
    running = latest is not None and latest.job_status == "running"
    job_at = _when(latest.updated_at) if latest else None
    drift_at = _when(drift.checked_at) if drift else None
    drift_newer = drift_at is not None and (job_at is None or drift_at > job_at)
    notes = _mtu_notes(preflight)
    out = []
    for ip in sorted(names, key=_ip_key):
        jn, dn = job_nodes.get(ip), drift_nodes.get(ip)
        state, detail = "pending", ""
        if running and jn is None:
            state = "applying"
        elif dn is not None and (drift_newer or jn is None):
            state, detail = _drift_state(dn)
        elif jn is not None and latest is not None:
            if latest.job_type == "fabric_teardown":
                state = "removed" if jn.ok else "failed"
            else:
                state = "established" if jn.ok else "failed"
            detail = jn.error
        label, css = FABRIC_STATES[state]
        out.append(
            FabricNode(
                node_ip=ip,
                fqdn=names[ip],
                vtep_ip=jn.vtep_ip if jn else "",
                state=state,
                label=label,
                css=css,
                detail=detail,
                mtu_note=notes.get(ip, ""),
            )
        )
    return out


def _drift_state(dn: Any) -> tuple[str, str]:
    if not dn.drifted:
        return "established", ""
    kinds = {f.kind for f in dn.findings}
    detail = "; ".join(f"{f.kind}: {f.message}" for f in dn.findings)
    if kinds & _BGP_KINDS:
        return "bgp_down", detail
    if "evpn" in kinds:
        return "evpn_down", detail
    return "drifted", detail


def _mtu_notes(pf: FabricPreflightResult | None) -> dict[str, str]:
    """node ip → "MTU 1500 ≠ 9000" for each node whose bridge MTU drifts from the consensus."""
    if pf is None:
        return {}
    # The outliers are the nodes to fix; mtu_drift (every node off a missing consensus) is the
    # fallback of a preflight that computed no outliers.
    common = _most_common([n.bridge_mtu for n in pf.nodes if n.bridge_mtu]) or pf.underlay_mtu
    notes = {}
    for d in pf.mtu_outliers or pf.mtu_drift:
        notes[d.node_ip] = f"MTU {d.bridge_mtu} ≠ {common}" if common else f"MTU {d.bridge_mtu}"
    return notes


def _most_common(values: list[int]) -> int:
    return max(sorted(set(values)), key=values.count) if values else 0


@dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclass(frozen=True)
class Topology:
    """Inline-SVG coordinates: the route reflector on top, the nodes in rows below it."""

    width: int
    height: int
    rr: Point
    rr_label: str
    rr_ip: str
    nodes: list[tuple[FabricNode, Point]] = field(default_factory=list)


NODE_SPACING = 180
PER_ROW = 6


def topology(nodes: list[FabricNode], rr_label: str, rr_ip: str) -> Topology:
    """Lay ``nodes`` out under the route reflector: up to ``PER_ROW`` per row, each row centred."""
    cols = max(1, min(PER_ROW, len(nodes)))
    width = max(520, cols * NODE_SPACING + 40)
    rows = max(1, -(-len(nodes) // PER_ROW))
    placed = []
    for i, n in enumerate(nodes):
        row, col = divmod(i, PER_ROW)
        in_row = min(PER_ROW, len(nodes) - row * PER_ROW)
        left = (width - in_row * NODE_SPACING) // 2 + NODE_SPACING // 2
        placed.append((n, Point(left + col * NODE_SPACING, 200 + row * 150)))
    return Topology(
        width=width,
        height=200 + rows * 150,
        rr=Point(width // 2, 60),
        rr_label=rr_label,
        rr_ip=rr_ip,
        nodes=placed,
    )


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff as (css class, line): added, removed, hunk header or context."""
    out = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            css = "d-file"
        elif line.startswith("+"):
            css = "d-add"
        elif line.startswith("-"):
            css = "d-del"
        elif line.startswith("@@"):
            css = "d-hunk"
        else:
            css = ""
        out.append((css, line))
    return out
