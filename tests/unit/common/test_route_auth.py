"""Every /controlnode endpoint declares the operator role it needs, except the installer callbacks."""

from __future__ import annotations

from fastapi.routing import APIRoute

from karios.api_gateway.routes import ROUTERS

# Installer callbacks authenticate with the job token baked into the boot medium, not an operator token.
INSTALLER_CALLBACKS = {
    ("POST", "/controlnode/discovery/report"),  # the discovery token of the boot (issue 27 item 3)
    ("POST", "/controlnode/job/{id}/step"),
    ("POST", "/controlnode/job/{id}/complete"),
    ("POST", "/controlnode/firstboot"),
    ("POST", "/controlnode/job/{id}/phone-home"),  # cloud-init's first boot (?token=)
}


def _needs_role(route: APIRoute) -> bool:
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        call = getattr(dep, "call", None)
        if call is not None and getattr(call, "__qualname__", "").startswith("require.<locals>"):
            return True
        stack.extend(dep.dependencies)
    return False


def test_every_controlnode_route_requires_a_role_except_installer_callbacks():
    routes = [
        r
        for router in ROUTERS()
        for r in router.routes
        if isinstance(r, APIRoute) and r.path.startswith("/controlnode")
    ]
    assert len(routes) > 30  # the seed's API is all here
    open_routes = {(m, r.path) for r in routes for m in r.methods if not _needs_role(r)}
    assert open_routes == INSTALLER_CALLBACKS
