"""HTTP routes of the gateway, one module per area of the seed API.

Every module here that defines ``router`` is included by the app factory, so adding an
area of the API is adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil

from fastapi import APIRouter


def ROUTERS() -> list[APIRouter]:
    found = []
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        router = getattr(module, "router", None)
        if isinstance(router, APIRouter):
            found.append(router)
    return found
