"""What the console pages read: the gateway's own read model (SQL) and the same bus queries the
REST routes make. A service that does not answer becomes a note on the page, never a 500."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from sqlmodel import col, or_, select

from karios.api_gateway.audit import AuditRecord
from karios.api_gateway.readmodel import WORKER_JOB_TYPES, JobRow, ProvisionProgress, job_json, progress_json
from karios.common.contracts.discovery import DiscoveredList, DiscoveredQuery, DiscoveredServer
from karios.common.contracts.fabric import FabricConfigQuery, FabricConfigView
from karios.common.contracts.fabric_diff import FabricDiffQuery, FabricDiffView
from karios.common.contracts.fabric_rollout import (
    FabricDriftQuery,
    FabricDriftView,
    FabricJobView,
    FabricLatestQuery,
    FabricPreflightRequest,
    FabricPreflightResult,
)
from karios.common.contracts.hardware import HardwareQuery, HardwareRecord
from karios.common.contracts.inventory import BmcHardware, BmcHardwareQuery, NodeQuery, NodeSummary
from karios.common.contracts.nodes import ComputeNode, ComputeNodePage, ComputeNodesQuery
from karios.common.contracts.provision import JobRequestQuery, JobRequestView, QueueQuery
from karios.common.errors import KariosError, NotFound

T = TypeVar("T")
PAGE_SIZE = 50  # rows per page of the job history and the servers view
HARDWARE_TIMEOUT = 3.0  # one hardware record; a page asks for its rows' records side by side
HARDWARE_AT_ONCE = 16
SSH_TIMEOUT = 90.0  # preflight SSHes to every node (the REST route's bus timeout)


@dataclass
class Notes:
    """Why a part of the page is missing (a service down, …), shown instead of failing."""

    items: list[str] = field(default_factory=list)

    async def get(self, what: str, aw: Awaitable[T]) -> T | None:
        try:
            return await aw
        except NotFound:
            return None
        except KariosError as exc:
            self.items.append(f"{what}: {exc.message}")
            return None


def _rt(request: Request) -> Any:
    return request.app.state.runtime


@dataclass(frozen=True)
class JobFilter:
    """The job history's filter: free text (job id prefix, BMC, hostname), status, 1-based page."""

    q: str = ""
    status: str = ""
    page: int = 1
    size: int = PAGE_SIZE


async def job_history(request: Request, f: JobFilter) -> tuple[list[dict[str, Any]], bool]:
    """One page of jobs, newest first, matching ``f``; and whether an older page exists."""
    stmt = select(JobRow)
    if f.status:
        stmt = stmt.where(JobRow.status == f.status)
    if f.q:
        like = f"%{_escape_like(f.q)}%"
        stmt = stmt.where(
            or_(
                col(JobRow.id).startswith(f.q, autoescape=True),
                col(JobRow.bmc_ip).ilike(like, escape="\\"),
                col(JobRow.resource_name).ilike(like, escape="\\"),
            )
        )
    stmt = (
        stmt.order_by(col(JobRow.created_at).desc(), col(JobRow.id))
        .offset((f.page - 1) * f.size)
        .limit(f.size + 1)
    )
    async with _rt(request).db.session() as s:
        rows = (await s.exec(stmt)).all()
    return [job_json(r) for r in rows[: f.size]], len(rows) > f.size


async def recorded(request: Request, job_ids: list[str]) -> set[str]:
    """Which of ``job_ids`` the read model has (the others only the provisioner's queue knows yet)."""
    if not job_ids:
        return set()
    async with _rt(request).db.session() as s:
        return set((await s.exec(select(JobRow.id).where(col(JobRow.id).in_(job_ids)))).all())


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def last_job_per_bmc(request: Request) -> list[dict[str, Any]]:
    """Every BMC's newest provision/unprovision job (one row per BMC)."""
    stmt = (
        select(JobRow)
        .where(col(JobRow.job_type).in_(WORKER_JOB_TYPES), JobRow.bmc_ip != "")
        .order_by(col(JobRow.bmc_ip), col(JobRow.created_at).desc())
        .distinct(col(JobRow.bmc_ip))
    )
    async with _rt(request).db.session() as s:
        rows = (await s.exec(stmt)).all()
    return [job_json(r) for r in rows]


async def registry_nodes(request: Request, notes: Notes) -> list[NodeSummary]:
    """The servers the inventory's registry knows (``bmc_infos``, no secrets)."""
    rt = _rt(request)
    nodes = await notes.get(
        "registered servers (inventory)",
        rt.bus.request(rt.bus.subjects.query("inventory", "nodes"), NodeQuery()),
    )
    return [NodeSummary.model_validate(n) for n in nodes or []]


async def _per_bmc(
    request: Request,
    bmc_ips: Iterable[str],
    notes: Notes,
    what: str,
    subject: tuple[str, str],
    query: Callable[[str], Any],
    reply: type[T],
) -> dict[str, T]:
    """One bus query per BMC (``HARDWARE_AT_ONCE`` at a time); the answers that came, by BMC.
    A failure is one note per cause, however many rows it hit."""
    rt = _rt(request)
    gate = asyncio.Semaphore(HARDWARE_AT_ONCE)

    async def one(ip: str) -> tuple[str, T | None]:
        async with gate:
            got = await notes.get(
                what,
                rt.bus.request(
                    rt.bus.subjects.query(*subject), query(ip), reply=reply, timeout=HARDWARE_TIMEOUT
                ),
            )
        return ip, got

    found = await asyncio.gather(*(one(ip) for ip in bmc_ips))
    notes.items[:] = list(dict.fromkeys(notes.items))
    return {ip: got for ip, got in found if got is not None}


async def hardware(request: Request, bmc_ips: Iterable[str], notes: Notes) -> dict[str, HardwareRecord]:
    """The stored hardware record (last inspection) of each BMC that has one."""
    return await _per_bmc(
        request,
        bmc_ips,
        notes,
        "hardware records (provisioner)",
        ("provision", "hardware"),
        lambda ip: HardwareQuery(bmc_ip=ip),
        HardwareRecord,
    )


async def inventory_hardware(
    request: Request, bmc_ips: Iterable[str], notes: Notes
) -> dict[str, BmcHardware]:
    """The inventory's record (disks, NICs, GPUs, serial) of each BMC's server it has a device
    for: what a row's hardware record is compared with."""
    return await _per_bmc(
        request,
        bmc_ips,
        notes,
        "inventory records (inventory)",
        ("inventory", "bmc_hardware"),
        lambda ip: BmcHardwareQuery(bmc_ip=ip),
        BmcHardware,
    )


async def job_request(request: Request, job_id: str, notes: Notes) -> JobRequestView | None:
    """What the job was asked to do, without secrets (the provisioner's stored request)."""
    rt = _rt(request)
    return await notes.get(
        "the job's request (provisioner)",
        rt.bus.request(
            rt.bus.subjects.query("provision", "job_request"),
            JobRequestQuery(job_id=job_id),
            reply=JobRequestView,
        ),
    )


async def started_by(request: Request, job: dict[str, Any]) -> AuditRecord | None:
    """The audit record of the request that created ``job`` (who, when); None before the audit
    trail existed or when the record is not written yet."""
    stmt = (
        select(AuditRecord)
        .where(
            AuditRecord.target == job["bmc_ip"], AuditRecord.job_id == job["id"], AuditRecord.method == "POST"
        )
        .order_by(col(AuditRecord.id))
        .limit(1)
    )
    async with _rt(request).db.session() as s:
        return (await s.exec(stmt)).first()


async def discovered(request: Request, notes: Notes) -> list[DiscoveredServer]:
    """The servers that PXE-booted the discovery image (``GET /controlnode/discovered`` data)."""
    rt = _rt(request)
    found = await notes.get(
        "discovered servers (provisioner)",
        rt.bus.request(
            rt.bus.subjects.query("provision", "discovered"), DiscoveredQuery(), reply=DiscoveredList
        ),
    )
    return list(found.servers) if found else []


async def queue(request: Request, notes: Notes) -> list[dict[str, Any]]:
    rt = _rt(request)
    entries = await notes.get(
        "provision queue", rt.bus.request(rt.bus.subjects.query("provision", "queue"), QueueQuery())
    )
    return list(entries or [])


async def job(request: Request, job_id: str) -> dict[str, Any] | None:
    async with _rt(request).db.session() as s:
        row = await s.get(JobRow, job_id)
    return job_json(row) if row is not None else None


async def progresses(request: Request, job_id: str) -> list[dict[str, Any]]:
    async with _rt(request).db.session() as s:
        rows = (
            await s.exec(
                select(ProvisionProgress)
                .where(ProvisionProgress.job_id == job_id)
                .order_by(col(ProvisionProgress.id))
            )
        ).all()
    return [progress_json(r) for r in rows]


async def compute_nodes(request: Request, notes: Notes) -> list[ComputeNode]:
    rt = _rt(request)
    page = await notes.get(
        "compute nodes (inventory)",
        rt.bus.request(
            rt.bus.subjects.query("inventory", "compute_nodes"),
            ComputeNodesQuery(offset=0, limit=1000),
            reply=ComputeNodePage,
        ),
    )
    return list(page.items) if page else []


@dataclass
class FabricState:
    config: FabricConfigView | None
    latest: FabricJobView | None
    drift: FabricDriftView | None
    nodes: list[ComputeNode]
    config_absent: bool = False  # the fabric worker answered: no configuration stored (not: away)


async def fabric_state(request: Request, notes: Notes) -> FabricState:
    rt = _rt(request)
    q = rt.bus.subjects.query
    noted = len(notes.items)
    config = await notes.get(
        "fabric config", rt.bus.request(q("fabric", "config"), FabricConfigQuery(), reply=FabricConfigView)
    )
    absent = config is None and len(notes.items) == noted
    latest = await notes.get(
        "last fabric job", rt.bus.request(q("fabric", "latest"), FabricLatestQuery(), reply=FabricJobView)
    )
    drift = await notes.get(
        "drift check", rt.bus.request(q("fabric", "drift"), FabricDriftQuery(), reply=FabricDriftView)
    )
    return FabricState(config, latest, drift, await compute_nodes(request, notes), config_absent=absent)


async def preflight(request: Request, body: FabricPreflightRequest) -> FabricPreflightResult:
    rt = _rt(request)
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "preflight"), body, timeout=SSH_TIMEOUT, reply=FabricPreflightResult
    )


async def diff(request: Request) -> FabricDiffView:
    """What an apply would change on every node (as ``POST /controlnode/fabric-config/diff``)."""
    rt = _rt(request)
    return await rt.bus.request(
        rt.bus.subjects.query("fabric", "diff"), FabricDiffQuery(), timeout=SSH_TIMEOUT, reply=FabricDiffView
    )
