"""``/console/…``: the web console's HTML pages and the fragments their script swaps in.

Pages render on the server (Jinja2) from the same read model and bus queries as the REST API;
the page script (``static/console.js``) keeps them live from SSE and sends writes to the REST
API itself with the console cookie and ``X-Karios-Console: 1`` (see ``auth.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from karios.api_gateway.auth import (
    CONSOLE_COOKIE,
    Principal,
    Role,
    console_cookie_token,
    require,
    same_origin,
    verify_token,
)
from karios.api_gateway.console import data, views
from karios.api_gateway.readmodel import WORKER_JOB_TYPES
from karios.common.contracts.fabric_rollout import FabricPreflightRequest
from karios.common.errors import KariosError, Unauthorized
from karios.common.limits import Ident

HERE = Path(__file__).parent
STATIC = HERE / "static"
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes a form POST send Origin: null
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
MAX_LOGIN_BODY = 4096
#: Query parameters of the lists (a bad one is the API's 422 naming it, never a 500).
Search = Annotated[str, Query(max_length=100, description="Text to look for")]
PageNo = Annotated[int, Query(ge=1, le=100_000, description="1-based page")]
PageSize = Annotated[int, Query(ge=1, le=500, description="Rows per page")]
JobStatus = Annotated[Literal["", *views.JOB_STATUSES], Query(description="Only jobs with this status")]  # type: ignore[valid-type]
ServerState = Annotated[
    Literal["", *views.SERVER_STATES],  # type: ignore[valid-type]
    Query(description="Only servers whose last job has this status (none: never a job)"),
]

router = APIRouter(prefix="/console", include_in_schema=False)
_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**ctx), status_code=status, headers=HEADERS)


async def _principal(request: Request) -> Principal | None:
    """The console user, from the cookie (None: not logged in, revoked, or cross-site)."""
    try:
        token = console_cookie_token(request)
    except Unauthorized:
        return None
    return await verify_token(request, token) if token else None


async def viewer(request: Request) -> Principal:
    """Any logged-in console user; otherwise a redirect to the login page."""
    p = await _principal(request)
    if p is None:
        # Back to this page after the login (a GET page, not a fragment the script fetches).
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        back = views.safe_next(here) if not request.url.path.endswith("/live") else ""
        where = "/console/login" + (f"?{urlencode({'next': back})}" if back else "")
        raise HTTPException(status_code=303, detail="log in first", headers={"Location": where})
    return p


def _page(name: str, p: Principal, active: str, **ctx: Any) -> HTMLResponse:
    return render(name, user=p, role=p.role.name, active=active, controls=views.controls_for(p.role), **ctx)


# -- login ---------------------------------------------------------------------------------


@router.get("")
async def index() -> RedirectResponse:
    return RedirectResponse("/console/jobs", status_code=303)


@router.get("/login")
async def login_form(request: Request, next: Annotated[str, Query(max_length=500)] = "") -> HTMLResponse:
    return render("login.html", error="", next=views.safe_next(next))


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return render("login.html", 403, error="cross-site login refused")
    raw = (await request.body())[:MAX_LOGIN_BODY].decode("utf-8", "replace")
    form = parse_qs(raw)
    token = (form.get("token") or [""])[0].strip()
    back = views.safe_next((form.get("next") or [""])[0])
    if not token:
        return render("login.html", 422, error="token: paste an API token (kt_…)", next=back)
    p = await verify_token(request, token)
    if p is None:
        return render("login.html", 401, error="token: rejected (unknown or revoked)", next=back)
    request.state.principal = p  # the actor of the audit record (api_gateway.audit)
    resp = RedirectResponse(back or "/console/jobs", status_code=303)
    resp.set_cookie(
        CONSOLE_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not same_origin(request):
        return render("login.html", 403, error="cross-site logout refused")
    # Who signs out, for the audit record only (a sign-out form sends no console header, so the
    # cookie is read here directly; nothing is authorised with it).
    cookie = request.cookies.get(CONSOLE_COOKIE)
    if cookie and (p := await verify_token(request, cookie)) is not None:
        request.state.principal = p
    resp = RedirectResponse("/console/login", status_code=303)
    resp.delete_cookie(CONSOLE_COOKIE, path="/", httponly=True, samesite="strict")
    return resp


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC_FILES:
        return Response("not found", status_code=404)
    return FileResponse(STATIC / name, media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})


# -- provisioning --------------------------------------------------------------------------


async def _jobs_ctx(request: Request, p: Principal, f: data.JobFilter) -> dict[str, Any]:
    notes = data.Notes()
    jobs, has_next = await data.job_history(request, f)
    # The provisioner's queue (positions, jobs it has and the read model not yet) on the first
    # unfiltered page only: a filter or an older page shows the history as recorded.
    first = f.page == 1 and not (f.q or f.status)
    queue = await data.queue(request, notes) if first else []
    # A queued job on an older page is listed there, not again on top of this one.
    on_page = {j["id"] for j in jobs}
    elsewhere = await data.recorded(request, [e["job_id"] for e in queue if e["job_id"] not in on_page])
    queue = [e for e in queue if e["job_id"] not in elsewhere]
    lines = views.job_lines(jobs, queue, views.controls_for(p.role))
    query: dict[str, Any] = {k: v for k, v in (("q", f.q), ("status", f.status)) if v}
    if f.size != data.PAGE_SIZE:
        query["size"] = f.size
    return {
        "jobs": lines,
        "notes": notes.items,
        "filter": f,
        "statuses": views.JOB_STATUSES,
        "page": views.Page(lines, f.page, f.page > 1, has_next),
        "query": urlencode({**query, **({"page": f.page} if f.page > 1 else {})}),
        "prev_url": "/console/jobs?" + urlencode({**query, "page": f.page - 1}),
        "next_url": "/console/jobs?" + urlencode({**query, "page": f.page + 1}),
    }


def job_filter(
    q: Search = "", status: JobStatus = "", page: PageNo = 1, size: PageSize = data.PAGE_SIZE
) -> data.JobFilter:
    """The job list's query parameters (a bad one: 422 naming it), for the page and its fragment."""
    return data.JobFilter(q.strip(), status, page, size)


@router.get("/jobs")
async def jobs_page(
    request: Request, f: data.JobFilter = Depends(job_filter), p: Principal = Depends(viewer)
) -> HTMLResponse:
    ctx = await _jobs_ctx(request, p, f)
    return _page("jobs.html", p, "jobs", vendors=views.VENDOR_CHOICES, events=views.PROVISION_EVENTS, **ctx)


@router.get("/jobs/live")
async def jobs_live(
    request: Request, f: data.JobFilter = Depends(job_filter), p: Principal = Depends(viewer)
) -> HTMLResponse:
    return _page("_jobs_live.html", p, "jobs", **await _jobs_ctx(request, p, f))


async def _job_ctx(request: Request, p: Principal, job_id: str) -> dict[str, Any] | None:
    job = await data.job(request, job_id)
    if job is None:
        return None
    controls = views.controls_for(p.role)
    notes = data.Notes()
    req = await data.job_request(request, job_id, notes) if job["job_type"] in WORKER_JOB_TYPES else None
    who = await data.started_by(request, job)
    facts = views.job_facts(
        job,
        req,
        actor=who.actor if who else "",
        role=(who.role or "") if who else "",
        at=who.at.isoformat() if who else "",
    )
    return {
        "job": job,
        "line": views.job_lines([job], [], controls)[0],
        "timeline": views.stage_timeline(await data.progresses(request, job_id)),
        "facts": facts,
        "retry": views.retry_of(job, req, controls),
        "notes": notes.items,
    }


@router.get("/jobs/{job_id}")
async def job_page(job_id: Ident, request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    ctx = await _job_ctx(request, p, job_id)
    if ctx is None:
        return _page("missing.html", p, "jobs", what=f"job {job_id}")
    return _page("job.html", p, "jobs", events=views.PROVISION_EVENTS, **ctx)


@router.get("/jobs/{job_id}/live")
async def job_live(job_id: Ident, request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    ctx = await _job_ctx(request, p, job_id)
    if ctx is None:
        return render("_error.html", 404, error={"code": "NOT_FOUND", "message": f"no job {job_id}"})
    return _page("_job_live.html", p, "jobs", **ctx)


# -- servers -------------------------------------------------------------------------------


@router.get("/servers")
async def servers_page(
    request: Request,
    q: Search = "",
    state: ServerState = "",
    page: PageNo = 1,
    size: PageSize = data.PAGE_SIZE,
    p: Principal = Depends(viewer),
) -> HTMLResponse:
    """Every server the inventory's registry, the fabric's compute nodes or a job names, with its
    last job and its hardware record (the page's rows only), searched and filtered."""
    notes = data.Notes()
    registry, compute, last_jobs = await asyncio.gather(
        data.registry_nodes(request, notes),
        data.compute_nodes(request, notes),
        data.last_job_per_bmc(request),
    )
    found = views.filter_servers(views.server_lines(registry, compute, last_jobs), q, state)
    shown = views.page_of(found, page, size)
    records = await data.hardware(request, [s.bmc_ip for s in shown.items], notes)
    inventory = await data.inventory_hardware(request, list(records), notes)
    shown = replace(shown, items=views.with_hardware(shown.items, records, inventory))
    query: dict[str, Any] = {k: v for k, v in (("q", q.strip()), ("state", state)) if v}
    if size != data.PAGE_SIZE:
        query["size"] = size
    return _page(
        "servers.html",
        p,
        "servers",
        servers=shown,
        total=len(found),
        q=q.strip(),
        state=state,
        states=views.SERVER_STATES,
        prev_url="/console/servers?" + urlencode({**query, "page": page - 1}),
        next_url="/console/servers?" + urlencode({**query, "page": page + 1}),
        notes=notes.items,
    )


@router.get("/discovered")
async def discovered_page(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    """Servers that PXE-booted the discovery image (``GET /controlnode/discovered``), adoptable."""
    notes = data.Notes()
    lines = views.discovered_lines(await data.discovered(request, notes), views.controls_for(p.role))
    return _page("discovered.html", p, "discovered", servers=lines, notes=notes.items)


@router.get("/nodes")
async def nodes_page(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    notes = data.Notes()
    fabric = await data.fabric_state(request, notes)
    names = {n.node_ip: n.hostname for n in fabric.nodes}
    states = {n.node_ip: n for n in views.fabric_nodes(names, fabric.latest, fabric.drift)}
    last_jobs = views.last_job_by_bmc(
        views.job_lines(await data.last_job_per_bmc(request), [], views.controls_for(p.role))
    )
    return _page(
        "nodes.html",
        p,
        "nodes",
        nodes=fabric.nodes,
        states=states,
        last_jobs=last_jobs,
        notes=notes.items,
    )


# -- fabric --------------------------------------------------------------------------------


async def _fabric_ctx(request: Request, p: Principal) -> dict[str, Any]:
    notes = data.Notes()
    fabric = await data.fabric_state(request, notes)
    pf = getattr(request.app.state, "console_preflight", None)
    nodes = views.fabric_nodes({n.node_ip: n.hostname for n in fabric.nodes}, fabric.latest, fabric.drift, pf)
    cfg = fabric.config
    topo = views.topology(
        nodes,
        rr_label=(cfg.fabric_switch_name or "route reflector") if cfg else "route reflector",
        rr_ip=(cfg.fabric_switch_peering_ip or "") if cfg else "",
    )
    return {
        "create_fields": views.FABRIC_CREATE_FIELDS,
        "create_choices": views.FABRIC_CREATE_CHOICES,
        "config": cfg,
        "config_absent": fabric.config_absent,
        "latest": fabric.latest,
        "drift": fabric.drift,
        "nodes": nodes,
        "topo": topo,
        "preflight": pf,
        "notes": notes.items,
    }


@router.get("/fabric")
async def fabric_page(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    ctx = await _fabric_ctx(request, p)
    return _page("fabric.html", p, "fabric", **ctx)


@router.get("/fabric/live")
async def fabric_live(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    return _page("_fabric_live.html", p, "fabric", **await _fabric_ctx(request, p))


@router.post("/fabric/preflight")
async def fabric_preflight(
    body: FabricPreflightRequest, request: Request, p: Principal = Depends(require(Role.operator))
) -> HTMLResponse:
    """Run the preflight (as ``POST /controlnode/fabric-config/preflight``) and answer the live
    fragment with its results; the last result stays on this replica's fabric page."""
    try:
        request.app.state.console_preflight = await data.preflight(request, body)
    except KariosError as exc:
        return render("_error.html", exc.http_status, error=exc.to_dict())
    return _page("_fabric_live.html", p, "fabric", **await _fabric_ctx(request, p))


@router.post("/fabric/diff")
async def fabric_diff(request: Request, p: Principal = Depends(require(Role.operator))) -> HTMLResponse:
    """The per-node preview of an apply (``POST /controlnode/fabric-config/diff``) as HTML."""
    try:
        view = await data.diff(request)
    except KariosError as exc:
        return render("_error.html", exc.http_status, error=exc.to_dict())
    return render("_diff.html", diff=view, lines=views.diff_lines)
