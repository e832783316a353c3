"""``/console/…``: the web console's HTML pages and the fragments their script swaps in.

Pages render on the server (Jinja2) from the same read model and bus queries as the REST API;
the page script (``static/console.js``) keeps them live from SSE and sends writes to the REST
API itself with the console cookie and ``X-Karios-Console: 1`` (see ``auth.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Request
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
        raise HTTPException(status_code=303, detail="log in first", headers={"Location": "/console/login"})
    return p


def _page(name: str, p: Principal, active: str, **ctx: Any) -> HTMLResponse:
    return render(name, user=p, role=p.role.name, active=active, controls=views.controls_for(p.role), **ctx)


# -- login ---------------------------------------------------------------------------------


@router.get("")
async def index() -> RedirectResponse:
    return RedirectResponse("/console/jobs", status_code=303)


@router.get("/login")
async def login_form(request: Request) -> HTMLResponse:
    return render("login.html", error="")


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return render("login.html", 403, error="cross-site login refused")
    raw = (await request.body())[:MAX_LOGIN_BODY].decode("utf-8", "replace")
    token = (parse_qs(raw).get("token") or [""])[0].strip()
    if not token:
        return render("login.html", 422, error="token: paste an API token (kt_…)")
    p = await verify_token(request, token)
    if p is None:
        return render("login.html", 401, error="token: rejected (unknown or revoked)")
    resp = RedirectResponse("/console/jobs", status_code=303)
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
    resp = RedirectResponse("/console/login", status_code=303)
    resp.delete_cookie(CONSOLE_COOKIE, path="/", httponly=True, samesite="strict")
    return resp


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC_FILES:
        return Response("not found", status_code=404)
    return FileResponse(STATIC / name, media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})


# -- provisioning --------------------------------------------------------------------------


async def _jobs_ctx(request: Request, p: Principal) -> dict[str, Any]:
    notes = data.Notes()
    queue = await data.queue(request, notes)
    lines = views.job_lines(await data.recent_jobs(request), queue, views.controls_for(p.role))
    return {"jobs": lines, "notes": notes.items}


@router.get("/jobs")
async def jobs_page(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    ctx = await _jobs_ctx(request, p)
    return _page("jobs.html", p, "jobs", vendors=views.VENDOR_CHOICES, events=views.PROVISION_EVENTS, **ctx)


@router.get("/jobs/live")
async def jobs_live(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    return _page("_jobs_live.html", p, "jobs", **await _jobs_ctx(request, p))


async def _job_ctx(request: Request, p: Principal, job_id: str) -> dict[str, Any] | None:
    job = await data.job(request, job_id)
    if job is None:
        return None
    controls = views.controls_for(p.role)
    return {
        "job": job,
        "line": views.job_lines([job], [], controls)[0],
        "timeline": views.stage_timeline(await data.progresses(request, job_id)),
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


@router.get("/nodes")
async def nodes_page(request: Request, p: Principal = Depends(viewer)) -> HTMLResponse:
    notes = data.Notes()
    fabric = await data.fabric_state(request, notes)
    names = {n.node_ip: n.hostname for n in fabric.nodes}
    states = {n.node_ip: n for n in views.fabric_nodes(names, fabric.latest, fabric.drift)}
    last_jobs = views.last_job_by_bmc(
        views.job_lines(await data.recent_jobs(request), [], views.controls_for(p.role))
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
        "config": cfg,
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
