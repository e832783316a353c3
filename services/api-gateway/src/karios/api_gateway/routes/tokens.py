"""``/controlnode/tokens`` — API tokens managed through the gateway (the CLI's ``karios token``).

Creating, rotating, listing and revoking tokens needs a ``fabric_admin`` token (the highest
role); every role may ask who it is (``GET /controlnode/tokens/self``, what ``karios login``
checks). A token is shown once, in the answer that creates or rotates it; only its SHA-256 is
stored. Creating a token whose name a live token has is a 409 ``CONFLICT``: replacing one is the
explicit ``POST /controlnode/tokens/{name}/rotate`` (``karios token rotate NAME``). Rotation and
revocation reach every gateway replica at once (broadcast), or within the token cache TTL if the
bus is away.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from karios.api_gateway.auth import (
    Principal,
    Role,
    create_token,
    list_tokens,
    require,
    revoke_token,
    rotate_token,
)
from karios.common.http import ErrorResponse
from karios.common.limits import check_text

router = APIRouter(prefix="/controlnode", tags=["tokens"])

TokenName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"),
]
RoleName = Literal["viewer", "operator", "fabric_admin"]
_ERRORS = {
    401: {"model": ErrorResponse, "description": "No or unknown token"},
    403: {"model": ErrorResponse, "description": "The token's role may not do this"},
}


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName = Field(
        description="Unique name (letters, digits, . _ @ -); a live token of that name is a 409 (rotate it)"
    )
    role: RoleName = Field("operator", description="viewer | operator | fabric_admin")


class TokenRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: RoleName | None = Field(None, description="A new role; the token's own when absent")


class TokenCreated(BaseModel):
    name: str
    role: str
    token: str = Field(description="The token; shown only in this answer")


class TokenInfo(BaseModel):
    name: str
    role: str
    created_at: datetime | None = None
    revoked: bool = False


class WhoAmI(BaseModel):
    name: str
    role: str


@router.get("/tokens/self", response_model=WhoAmI, summary="Who the caller is", responses=_ERRORS)
async def whoami(p: Principal = Depends(require(Role.viewer))) -> WhoAmI:
    return WhoAmI(name=p.name, role=p.role.name)


@router.get("/tokens", response_model=list[TokenInfo], summary="List API tokens", responses=_ERRORS)
async def tokens(request: Request, _p: Principal = Depends(require(Role.fabric_admin))) -> list[TokenInfo]:
    rows = await list_tokens(request.app.state.runtime.db)
    return [TokenInfo(name=r.name, role=r.role, created_at=r.created_at, revoked=r.revoked) for r in rows]


@router.post(
    "/tokens",
    response_model=TokenCreated,
    status_code=201,
    summary="Create an API token; the token is shown once",
    responses={
        **_ERRORS,
        409: {"model": ErrorResponse, "description": "A live token has this name (rotate or revoke it)"},
        422: {"model": ErrorResponse, "description": "Invalid field (named in `field`)"},
    },
)
async def create(
    body: TokenCreate, request: Request, _p: Principal = Depends(require(Role.fabric_admin))
) -> TokenCreated:
    check_text(body.name)
    rt = request.app.state.runtime
    token = await create_token(rt.db, body.name, Role[body.role], bus=rt.bus, replace=False)
    return TokenCreated(name=body.name, role=body.role, token=token)


@router.post(
    "/tokens/{name}/rotate",
    response_model=TokenCreated,
    summary="Rotate an API token: a new secret under the same name (the old one stops working); shown once",
    responses={
        **_ERRORS,
        404: {"model": ErrorResponse, "description": "No token of that name"},
        422: {"model": ErrorResponse, "description": "Invalid field (named in `field`)"},
    },
)
async def rotate(
    request: Request,
    name: str = Path(min_length=1, max_length=200),
    body: TokenRotate | None = None,
    _p: Principal = Depends(require(Role.fabric_admin)),
) -> TokenCreated:
    rt = request.app.state.runtime
    wanted = Role[body.role] if body is not None and body.role is not None else None
    role, token = await rotate_token(rt.db, name, wanted, bus=rt.bus)
    return TokenCreated(name=name, role=role.name, token=token)


@router.delete(
    "/tokens/{name}",
    response_model=TokenInfo,
    summary="Revoke an API token",
    responses={**_ERRORS, 404: {"model": ErrorResponse, "description": "No token of that name"}},
)
async def revoke(
    request: Request,
    name: str = Path(min_length=1, max_length=200),
    _p: Principal = Depends(require(Role.fabric_admin)),
) -> TokenInfo:
    rt = request.app.state.runtime
    await revoke_token(rt.db, name, bus=rt.bus)
    row = next(r for r in await list_tokens(rt.db) if r.name == name)
    return TokenInfo(name=row.name, role=row.role, created_at=row.created_at, revoked=row.revoked)
