"""The router gate (karios.common.routegate) selects what FastAPI's own scan selects, for every path."""

from __future__ import annotations

import re

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import _IncludedRouter
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Match

from karios.api_gateway.app import create_app
from karios.common.routegate import gate_included_routers, literal_prefix
from karios.common.settings import KariosSettings

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
SAMPLES = ("10.0.0.1", "x", "abc-123", "0", "a%2Fb", "")


@pytest.fixture(scope="module")
def gateway() -> FastAPI:
    return create_app(KariosSettings(dev_mode=True))


def _scope(path: str, method: str) -> dict:
    return {"type": "http", "path": path, "root_path": "", "method": method, "headers": []}


def _select(app: FastAPI, scope: dict, gated: bool) -> tuple[int, Match] | None:
    """The index of the route the application's router takes (first FULL, else first PARTIAL),
    as FastAPI's ``APIRouter.app`` loop does, with the gates or with each router's own scan."""
    partial = None
    for i, route in enumerate(app.router.routes):
        if gated or not isinstance(route, _IncludedRouter):
            match, _ = route.matches(dict(scope))
        else:
            match, _ = type(route).matches(route, dict(scope))
        if match == Match.FULL:
            return i, match
        if match == Match.PARTIAL and partial is None:
            partial = (i, match)
    return partial


def _paths(app: FastAPI) -> list[str]:
    """Every operation's path with its parameters filled in several ways, and near misses."""
    out: set[str] = set()
    for path in app.openapi()["paths"]:
        for sample in SAMPLES:
            filled = re.sub(r"\{[^}]+\}", sample, path)
            out |= {filled, filled + "/", filled.rstrip("/") + "x"}
            out.add(filled[:-1] if len(filled) > 1 else filled)
        out.add(literal_prefix(path))
    return sorted(out | {"/", "/nope", "/controlnode", "/controlnode/", "/controlnode/nodes//x"})


def test_every_included_router_of_the_gateway_is_gated(gateway: FastAPI) -> None:
    included = [r for r in gateway.router.routes if isinstance(r, _IncludedRouter)]
    assert included and all("matches" in vars(r) for r in included)
    assert gate_included_routers(gateway) == 0  # once only


def test_gated_selection_equals_fastapis_on_every_route_and_method(gateway: FastAPI) -> None:
    paths = _paths(gateway)
    assert len(paths) > 300
    found = 0
    for path in paths:
        for method in METHODS:
            scope = _scope(path, method)
            want = _select(gateway, scope, gated=False)
            assert _select(gateway, scope, gated=True) == want, (method, path)
            found += want is not None
    assert found > 100  # the comparison covers matches, not only misses


PARTS = ["controlnode", "nodes", "fabric-config", "jobs", "10.0.0.1", "x", ""]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(PARTS), max_size=6),
    st.sampled_from(METHODS),
)
def test_gated_selection_equals_fastapis_on_any_path(gateway: FastAPI, parts: list[str], method: str) -> None:
    scope = _scope("/" + "/".join(parts), method)
    assert _select(gateway, scope, gated=True) == _select(gateway, scope, gated=False)


def test_a_router_with_a_parameter_first_is_gated_by_its_literal_text() -> None:
    app = FastAPI()
    router = APIRouter()

    @router.get("/items/{item}")
    def item(item: str) -> str:
        return item

    @router.get("/{anything}/tail")
    def tail(anything: str) -> str:
        return anything

    app.include_router(router)
    assert gate_included_routers(app) == 1
    (included,) = [r for r in app.router.routes if isinstance(r, _IncludedRouter)]
    assert included.matches.prefixes == ("/", "/items/")  # type: ignore[attr-defined]
    assert included.matches(_scope("/zzz/tail", "GET"))[0] == Match.FULL
