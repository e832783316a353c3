"""Routing by literal prefix first: every request skips the routers that cannot hold its path.

FastAPI 0.165 keeps each ``include_router`` as one entry of the application's route list and
finds a request's route by asking every entry in turn; an entry asks each of its routes (a
regular expression each, with its own bookkeeping in the scope). The gateway's ~100 operations in
14 routers made that about a third of a request's CPU (py-spy under wrk, 100 connections:
``_IncludedRouter.matches`` 25 % of the process for ``GET /controlnode/tokens/self``), for every
route alike.

:func:`gate_included_routers` gives each included router a gate: the literal prefixes of its
routes' paths (up to the first ``{``), checked with one ``str.startswith`` before the router
looks at its routes. A route's regular expression can only match a path that begins with that
literal text, so a router whose prefixes do not begin the path answers ``Match.NONE`` exactly as
its own scan would; the first match, 405 (a path match under another method), 404 and the
trailing-slash redirect are unchanged (``tests/unit/common/test_routegate.py`` compares both on
every route of every service). A router with a route whose path is not known literally (a
mount, a frontend group) keeps no gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, _IncludedRouter
from starlette._utils import get_route_path
from starlette.routing import Match, Route
from starlette.types import Scope

_Matcher = Callable[[Scope], tuple[Match, Scope]]


def literal_prefix(path: str) -> str:
    """The text every path this route template matches begins with."""
    cut = path.find("{")
    return path if cut < 0 else path[:cut]


def _paths(router: _IncludedRouter) -> Iterable[str | None]:
    """The effective path of every route the included router can select (None: not literal)."""
    candidates: list[Any] = [*router.effective_candidates(), *router.effective_low_priority_routes()]
    for c in candidates:
        if isinstance(c, _IncludedRouter):
            yield from _paths(c)
        elif isinstance(c.original_route, APIRoute | Route) and c.path:
            yield c.path
        else:
            yield None


def router_prefixes(router: _IncludedRouter) -> tuple[str, ...] | None:
    """The literal prefixes of the router's routes, or None when one route is not literal."""
    prefixes: set[str] = set()
    for path in _paths(router):
        if path is None:
            return None
        prefixes.add(literal_prefix(path))
    return tuple(sorted(prefixes))


def _gated(matches: _Matcher, prefixes: tuple[str, ...]) -> _Matcher:
    def gate(scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not get_route_path(scope).startswith(prefixes):
            return Match.NONE, {}
        return matches(scope)

    gate.prefixes = prefixes  # type: ignore[attr-defined]
    return gate


def gate_included_routers(app: FastAPI) -> int:
    """Gate every router included in ``app`` (call once all are included); returns how many."""
    gated = 0
    for route in app.router.routes:
        if not isinstance(route, _IncludedRouter) or "matches" in vars(route):
            continue
        prefixes = router_prefixes(route)
        if prefixes:
            # An instance attribute: the router's own method stays what FastAPI calls inside it.
            route.matches = _gated(route.matches, prefixes)  # type: ignore[method-assign]
            gated += 1
    return gated
