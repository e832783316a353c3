"""Operator authentication: bearer tokens, stored hashed, each with one role.

Roles are ordered: ``viewer`` < ``operator`` < ``fabric_admin``. Every ``/controlnode``
endpoint declares the least role it needs with ``Depends(require(Role.X))``; installer
callbacks declare none.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import select

from karios.api_gateway.models import ApiToken
from karios.common.db import Database
from karios.common.errors import Forbidden, Unauthorized


class Role(enum.IntEnum):
    viewer = 1
    operator = 2
    fabric_admin = 3


TOKEN_PREFIX = "kt_"  # noqa: S105 (a prefix, not a secret)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # Tokens are 256-bit random values, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


async def create_token(db: Database, name: str, role: Role, token: str | None = None) -> str:
    """Store a token (generated unless given) under ``name``; replaces an existing one of that name."""
    token = token or new_token()
    async with db.session() as s, s.begin():
        row = (await s.exec(select(ApiToken).where(ApiToken.name == name))).first()
        if row is None:
            s.add(ApiToken(name=name, role=role.name, token_hash=hash_token(token)))
        else:
            row.role, row.token_hash, row.revoked = role.name, hash_token(token), False
    return token


async def authenticate(db: Database, token: str) -> Principal | None:
    async with db.session() as s:
        row = (await s.exec(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))).first()
    if row is None or row.revoked:
        return None
    return Principal(row.name, Role[row.role])


_bearer = HTTPBearer(auto_error=False, description="Karios API token (kt_…)")


def require(role: Role):  # type: ignore[no-untyped-def]
    async def dependency(
        request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)
    ) -> Principal:
        token = creds.credentials if creds else request.query_params.get("access_token")
        if not token:
            raise Unauthorized("missing bearer token")
        db: Database = request.app.state.runtime.db
        principal = await authenticate(db, token)
        if principal is None:
            raise Unauthorized("invalid or revoked token")
        if principal.role < role:
            raise Forbidden(f"this endpoint needs role {role.name}; token has {principal.role.name}")
        return principal

    return dependency
