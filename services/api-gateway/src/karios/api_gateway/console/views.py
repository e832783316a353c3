"""The console's view models (pure): state → what a page shows, role → which controls exist,
fabric nodes → topology coordinates. No I/O, no clock; the routes load, these decide."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from ipaddress import ip_address
from typing import Any

from karios.api_gateway.auth import Role
from karios.common.contracts.discovery import DiscoveredServer
from karios.common.contracts.fabric_rollout import FabricDriftView, FabricJobView, FabricPreflightResult
from karios.common.contracts.hardware import HardwareRecord
from karios.common.contracts.inventory import BmcHardware, NodeSummary
from karios.common.contracts.nodes import ComputeNode
from karios.common.contracts.provision import JobRequestView
from karios.common.hardware_diff import HardwareDiff, hardware_diff
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
    retry_job: bool = False  # operator: POST /controlnode/provision (the ended job's request again)
    adopt_discovered: bool = False  # operator: POST /controlnode/discovered/{id}/adopt

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
        retry_job=operator,
        adopt_discovered=operator,
    )


def safe_next(path: str) -> str:
    """Where a login may send the browser back to: a console page of this host ("" otherwise),
    never another site (``//evil``, ``/console/../``, a scheme) nor the login page itself."""
    if not path.startswith("/console/") or len(path) > 500:
        return ""
    if any(c in path for c in ("\\", "\r", "\n", "\t")) or "//" in path or "/../" in path or "/./" in path:
        return ""
    page = path.split("?", 1)[0]
    if page in ("/console/login", "/console/logout") or page.startswith("/console/static/"):
        return ""
    return path


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


#: The job history's status filter (the seed's job ``status`` values).
JOB_STATUSES = ("running", "completed", "failed", "cancelled", "stuck")
#: Ended jobs a retry may start again (a completed job is re-provisioned the same way).
RETRYABLE = frozenset({"failed", "cancelled", "stuck"})
#: ``ProvisionRequest`` fields a retry sends again when the request had them (no secrets: the
#: provisioner never answers them; a request that had a password asks for it again).
RETRY_FIELDS = (
    "vendor",
    "hostname",
    "debian_version",
    "arch",
    "os_username",
    "selected_disks",
    "pool_type",
    "pool_backend",
    "selected_nic",
    "selected_nic_mac",
    "ssh_authorized_keys",
    "install_method",
    "image",
    "mirror",
    "http_proxy",
    "gpu_passthrough",
    "controlnode_host",
    "controlnode_port",
    "prefix_id",
)


@dataclass(frozen=True)
class JobFacts:
    """What the job page says about a job's request: host, OS, method, vendor, who started it."""

    hostname: str
    os: str
    method: str
    vendor: str
    started_by: str
    started_at: str


def job_facts(job: dict[str, Any], req: JobRequestView | None, actor: str, role: str, at: str) -> JobFacts:
    """The request side of a job page; "" where the provisioner or the audit trail does not know."""
    os = ""
    method = ""
    if req is not None and req.job_type == "provision":
        os = f"image {req.image}" if req.image else f"Debian {req.debian_version}"
        method = req.method or req.install_method
        if req.install_method and req.method and req.install_method != req.method:
            method = f"{req.method} (asked: {req.install_method})"
    elif req is not None:
        method = req.method
    return JobFacts(
        hostname=(req.hostname if req else "") or job.get("resource_name", ""),
        os=os,
        method=method,
        vendor=req.vendor if req else "",
        started_by=f"{actor} ({role})" if actor and role else actor,
        started_at=short_time(at) if at else "",
    )


@dataclass(frozen=True)
class Retry:
    """A retry control: the ``POST /controlnode/provision`` body asking for the same job again,
    and the secrets the person must type again (the console never holds them)."""

    body: dict[str, Any]
    needs_os_password: bool
    needs_root_pass: bool


def retry_of(job: dict[str, Any], req: JobRequestView | None, controls: Controls) -> Retry | None:
    """The retry of an ended provision job (failed, cancelled, stuck) for a role that may
    provision; None when there is nothing to retry or the request is not known."""
    if not controls.retry_job or req is None or req.job_type != "provision":
        return None
    if job.get("status") not in RETRYABLE or job.get("job_type") != "provision":
        return None
    body: dict[str, Any] = {"bmc_IP": req.bmc_ip}
    for name in RETRY_FIELDS:
        value = getattr(req, name)
        if value not in ("", None, []):
            body[name] = value
    # No-effect fields travel in the job's metadata; they go back as the request fields they were.
    body.update({k: v for k, v in req.metadata.items() if k not in body and isinstance(v, str | int)})
    return Retry(body=body, needs_os_password=req.has_os_password, needs_root_pass=req.has_root_pass)


# -- servers -------------------------------------------------------------------------------

#: The servers view's state filter: the last job's status, or "none" (never a job).
SERVER_STATES = ("none", *JOB_STATUSES)


@dataclass(frozen=True)
class ServerLine:
    """One server (by BMC address): what the inventory knows, its last job, its hardware."""

    bmc_ip: str
    hostname: str
    vendor: str
    node_ip: str
    serial: str
    sources: tuple[str, ...]  # registry | compute node | jobs
    last_job: JobLine | None
    hardware: str = ""  # a one-line summary of the last inspection ("" not inspected)
    power: str = ""
    diff: HardwareDiff | None = None  # the inspection against the inventory (None: not compared)

    @property
    def out_of_sync(self) -> str:
        """``2 differences`` when the BMC and the inventory disagree, else ''."""
        n = self.diff.differences if self.diff and not self.diff.in_sync else 0
        return f"{n} difference{'s' if n != 1 else ''}" if n else ""

    @property
    def differences(self) -> list[str]:
        """One line per difference (``disks: 61X0A002TCD8 only on the BMC``)."""
        return diff_texts(self.diff) if self.diff else []

    @property
    def state(self) -> str:
        return self.last_job.status if self.last_job else "none"


def server_lines(
    registry: list[NodeSummary], compute: list[ComputeNode], last_jobs: list[dict[str, Any]]
) -> list[ServerLine]:
    """Every server any source names, by BMC address (sorted), with its newest job. A compute
    node without a BMC address is listed by its node address."""
    acc: dict[str, dict[str, Any]] = {}

    def add(key: str, source: str, **known: str) -> None:
        row = acc.setdefault(key, {"sources": [], "hostname": "", "vendor": "", "node_ip": "", "serial": ""})
        if source not in row["sources"]:
            row["sources"].append(source)
        for k, v in known.items():
            row[k] = row[k] or v

    for n in registry:
        known = {"hostname": n.hostname or n.fqdn, "vendor": n.vendor, "node_ip": n.node_ip}
        add(n.bmc_ip, "registry", serial=n.serial_number, **known)
    for c in compute:
        add(c.bmc_ip or c.node_ip, "compute node", hostname=c.hostname, node_ip=c.node_ip)
    jobs = {j["bmc_ip"]: _line(j, 0, Controls()) for j in last_jobs if j.get("bmc_ip")}
    for j in last_jobs:
        if j.get("bmc_ip"):
            add(j["bmc_ip"], "jobs", hostname=j.get("resource_name", ""))
    return [
        ServerLine(
            bmc_ip=ip,
            hostname=r["hostname"],
            vendor=r["vendor"],
            node_ip=r["node_ip"],
            serial=r["serial"],
            sources=tuple(r["sources"]),
            last_job=jobs.get(ip),
        )
        for ip, r in sorted(acc.items(), key=lambda kv: _ip_key(kv[0]))
    ]


def filter_servers(lines: list[ServerLine], q: str = "", state: str = "") -> list[ServerLine]:
    """The servers whose BMC, hostname, node address, serial or vendor contains ``q`` (any
    case) and whose last job's status is ``state`` ("none": never a job; "": any)."""
    needle = q.strip().lower()

    def hit(s: ServerLine) -> bool:
        text = " ".join((s.bmc_ip, s.hostname, s.node_ip, s.serial, s.vendor)).lower()
        return (not needle or needle in text) and (not state or s.state == state)

    return [s for s in lines if hit(s)]


def with_hardware(
    lines: list[ServerLine],
    records: dict[str, HardwareRecord],
    inventory: dict[str, BmcHardware] | None = None,
) -> list[ServerLine]:
    """``lines`` with the summary of each one's hardware record, and its diff against the
    inventory's record of the server when ``inventory`` has one."""
    out = []
    for s in lines:
        rec = records.get(s.bmc_ip)
        if rec is None:
            out.append(s)
            continue
        inv = (inventory or {}).get(s.bmc_ip)
        out.append(
            replace(
                s,
                hardware=hardware_summary(rec),
                power=rec.system.power_state,
                serial=s.serial or rec.system.serial,
                vendor=s.vendor or rec.driver,
                diff=hardware_diff(rec, inv) if inv is not None else None,
            )
        )
    return out


def diff_texts(diff: HardwareDiff) -> list[str]:
    """Each difference of ``diff`` as one short line."""
    out: list[str] = []
    for name in ("serial", "disks", "nics", "gpus"):
        c = getattr(diff, name)
        out += [f"{name}: {i.key} only on the BMC" for i in c.only_bmc]
        out += [f"{name}: {i.key} only in the inventory" for i in c.only_inventory]
        out += [
            f"{name}: {p.key} "
            + ", ".join(f"{d.field} {d.bmc} (BMC) vs {d.inventory}" for d in p.differences)
            for p in c.differ
        ]
    return out


def hardware_summary(rec: HardwareRecord) -> str:
    """``Dell PowerEdge R650 · 2 CPU · 256 GiB · 4 drives · 1 GPU`` from an inspection."""
    parts = [" ".join(p for p in (rec.system.manufacturer, rec.system.model) if p)]
    cpus = rec.processor_count if rec.processor_count is not None else len(rec.processors)
    if cpus:
        parts.append(f"{cpus} CPU")
    if rec.memory_total_gib:
        parts.append(f"{rec.memory_total_gib:g} GiB")
    if rec.drives:
        parts.append(f"{len(rec.drives)} drive{'s' if len(rec.drives) != 1 else ''}")
    if rec.gpus:
        parts.append(f"{len(rec.gpus)} GPU")
    return " · ".join(p for p in parts if p) or "inspected"


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, its 1-based number, whether pages come before / after."""

    items: list[Any]
    number: int
    has_prev: bool
    has_next: bool


def page_of(items: list[Any], number: int, size: int) -> Page:
    """Page ``number`` (1-based) of ``items``, ``size`` per page; past the end: an empty last page."""
    start = (number - 1) * size
    return Page(items[start : start + size], number, number > 1, len(items) > start + size)


# -- discovered servers --------------------------------------------------------------------


@dataclass(frozen=True)
class DiscoveredLine:
    id: str
    status: str
    boot_mac: str
    serial: str
    ip: str
    summary: str
    hostname: str
    last_seen: str
    adoptable: bool


def discovered_lines(servers: list[DiscoveredServer], controls: Controls) -> list[DiscoveredLine]:
    """Discovered servers (newest report first) with a summary of what they reported."""
    out = []
    for d in servers:
        parts = [" ".join(p for p in (d.system.manufacturer, d.system.model) if p)]
        if d.processor_model:
            parts.append(d.processor_model)
        if d.memory_mib:
            parts.append(f"{d.memory_mib / 1024:g} GiB")
        if d.drives:
            parts.append(f"{len(d.drives)} drive{'s' if len(d.drives) != 1 else ''}")
        out.append(
            DiscoveredLine(
                id=d.id,
                status=d.status,
                boot_mac=d.boot_mac,
                serial=d.serial,
                ip=d.ip,
                summary=" · ".join(p for p in parts if p),
                hostname=d.hostname,
                last_seen=short_time(d.last_seen),
                adoptable=controls.adopt_discovered and d.status == "discovered",
            )
        )
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


#: The fabric create form: (field, label, initial value, placeholder). The API checks every
#: value (``POST /controlnode/fabric-config``); the page shows its 422 beside the field it names.
FABRIC_CREATE_FIELDS = (
    ("as", "Node AS", "", "65000"),
    ("fabric_switch_as", "Switch AS", "", "65000 (same AS: iBGP)"),
    ("fabric_switch_name", "Switch name", "", "spine1"),
    ("fabric_switch_nos", "Switch NOS", "sonic", ""),
    ("fabric_switch_role", "Switch role", "spine", ""),
    ("fabric_switch_peering_ip", "Switch peering IP", "", "10.0.0.1"),
    ("management_cidr", "Management CIDR", "", "192.168.111.0/24"),
    ("router_id_cidr", "VTEP pool", "", "10.255.0.1/24"),
    ("vxlan_mtu", "VXLAN MTU", "9000", "1500..9216"),
    ("ospf_enabled", "OSPF underlay", "true", ""),
    ("expected_nodes", "Expected nodes", "", "1..1000"),
)
FABRIC_CREATE_CHOICES = {
    "fabric_switch_nos": ("sonic", "cumulus", "nxos", "eos", "other"),
    "fabric_switch_role": ("spine", "leaf", "border-leaf"),
    "ospf_enabled": ("true", "false"),
}


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
