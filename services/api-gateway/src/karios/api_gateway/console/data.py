"""What the console pages read: the gateway's own read model (SQL) and the same bus queries the
REST routes make. A service that does not answer becomes a note on the page, never a 500."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from sqlmodel import col, select

from karios.api_gateway.readmodel import JobRow, ProvisionProgress, job_json, progress_json
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
from karios.common.contracts.nodes import ComputeNode, ComputeNodePage, ComputeNodesQuery
from karios.common.contracts.provision import QueueQuery
from karios.common.errors import KariosError, NotFound

T = TypeVar("T")
RECENT_JOBS = 50
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


async def recent_jobs(request: Request, limit: int = RECENT_JOBS) -> list[dict[str, Any]]:
    async with _rt(request).db.session() as s:
        rows = (await s.exec(select(JobRow).order_by(col(JobRow.created_at).desc()).limit(limit))).all()
    return [job_json(r) for r in rows]


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


async def fabric_state(request: Request, notes: Notes) -> FabricState:
    rt = _rt(request)
    q = rt.bus.subjects.query
    config = await notes.get(
        "fabric config", rt.bus.request(q("fabric", "config"), FabricConfigQuery(), reply=FabricConfigView)
    )
    latest = await notes.get(
        "last fabric job", rt.bus.request(q("fabric", "latest"), FabricLatestQuery(), reply=FabricJobView)
    )
    drift = await notes.get(
        "drift check", rt.bus.request(q("fabric", "drift"), FabricDriftQuery(), reply=FabricDriftView)
    )
    return FabricState(config, latest, drift, await compute_nodes(request, notes))


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
