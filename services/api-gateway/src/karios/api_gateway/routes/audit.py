"""``GET /controlnode/audit`` — the audit trail (the CLI's ``karios audit``).

Every state-changing request through the gateway is one record (:mod:`karios.api_gateway.audit`):
who (token name and role; ``unknown`` for a refused token), what (method and route template),
on what (target, job id), the answer's HTTP status, the trace id and the request id. Newest
first, paged with ``before`` (the ``next_before`` of the previous page). Reading it needs a
``fabric_admin`` token: the role that manages tokens.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from karios.api_gateway.audit import AuditQuery, AuditRecord, parse_since, query_audit
from karios.api_gateway.auth import Principal, Role, require
from karios.common.http import ErrorResponse
from karios.common.limits import SafeText

router = APIRouter(prefix="/controlnode", tags=["audit"])

MAX_LIMIT = 1000


class AuditEntry(BaseModel):
    id: int = Field(description="Record id; pass the last one of a page as `before` for the next page")
    time: datetime = Field(description="When the answer was sent (UTC)")
    actor: str = Field(description="Token name; `unknown` when no valid token was presented")
    role: str | None = Field(None, description="The token's role (viewer | operator | fabric_admin)")
    method: str = Field(description="HTTP method: POST | PUT | PATCH | DELETE")
    route: str = Field(description="Route template, e.g. /controlnode/tokens/{name} (never the raw path)")
    target: str | None = Field(
        None, description="What the request acted on: BMC IP, job id, node IP, token name"
    )
    job_id: str | None = Field(None, description="The job the request created or acted on, if any")
    status: int = Field(description="Result: the HTTP status of the answer")
    trace_id: str | None = Field(None, description="OpenTelemetry trace id of the request")
    request_id: str | None = Field(None, description="The request's X-Request-ID header, if sent")
    client: str | None = Field(None, description="Client address")


class AuditPage(BaseModel):
    records: list[AuditEntry]
    next_before: int | None = Field(None, description="`before` for the next (older) page; null on the last")


def _entry(r: AuditRecord) -> AuditEntry:
    assert r.id is not None
    return AuditEntry(
        id=r.id,
        time=r.at,
        actor=r.actor,
        role=r.role,
        method=r.method,
        route=r.route,
        target=r.target,
        job_id=r.job_id,
        status=r.status,
        trace_id=r.trace_id,
        request_id=r.request_id,
        client=r.client,
    )


@router.get(
    "/audit",
    response_model=AuditPage,
    summary="The audit trail: state-changing requests, newest first",
    responses={
        401: {"model": ErrorResponse, "description": "No or unknown token"},
        403: {"model": ErrorResponse, "description": "Needs a fabric_admin token"},
        422: {"model": ErrorResponse, "description": "Invalid filter (named in `field`)"},
    },
)
async def audit(
    request: Request,
    since: SafeText | None = Query(
        None, max_length=64, description="Records at or after: ISO 8601 time or an age (30m, 2h, 7d)"
    ),
    until: SafeText | None = Query(
        None, max_length=64, description="Records before: ISO 8601 time or an age"
    ),
    actor: SafeText | None = Query(
        None, max_length=200, description="Token name (`unknown`: refused tokens)"
    ),
    action: SafeText | None = Query(
        None,
        max_length=300,
        description="A method (DELETE), part of a route template (tokens), or both "
        "(`POST /controlnode/provision`)",
    ),
    method: str | None = Query(None, pattern=r"^(?i:post|put|patch|delete)$", description="HTTP method"),
    target: SafeText | None = Query(
        None, max_length=200, description="BMC IP, job id, node IP or token name"
    ),
    status: int | None = Query(None, ge=100, le=599, description="HTTP status of the answer"),
    before: int | None = Query(
        None, ge=1, le=2**63 - 1, description="Only records older than this id (paging)"
    ),
    limit: int = Query(100, ge=1, le=MAX_LIMIT, description=f"Page size (at most {MAX_LIMIT})"),
    _p: Principal = Depends(require(Role.fabric_admin)),
) -> AuditPage:
    q = AuditQuery(
        since=parse_since(since) if since else None,
        until=parse_since(until, field="until") if until else None,
        actor=actor,
        method=method,
        action=action,
        target=target,
        status=status,
        before=before,
        limit=limit,
    )
    rows, next_before = await query_audit(request.app.state.runtime.db, q)
    return AuditPage(records=[_entry(r) for r in rows], next_before=next_before)
