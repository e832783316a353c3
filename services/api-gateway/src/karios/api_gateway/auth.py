"""Operator authentication: bearer tokens, stored hashed, each with one role.

Roles are ordered: ``viewer`` < ``operator`` < ``fabric_admin``. Every ``/controlnode``
endpoint declares the least role it needs with ``Depends(require(Role.X))``; installer
callbacks declare none.

A verified token is cached for ``token_cache_ttl`` seconds (:class:`TokenCache`), so a stalled
database does not hang every authenticated request. Rotating or revoking a token broadcasts
:class:`ApiTokenChanged`; every gateway replica drops that token at once (the TTL bounds a
missed broadcast).

The token goes in the ``Authorization`` header. Only the SSE endpoint also takes it as the
``access_token`` query parameter (``require(..., query_token=True)``): browsers' EventSource
cannot set headers, and a query string ends up in access logs and browser history.

The web console (``/console``) keeps the token in an ``HttpOnly; SameSite=Strict`` cookie
(:data:`CONSOLE_COOKIE`). The cookie is a credential only for same-origin use: never when the
browser says the request is cross-site (``Sec-Fetch-Site``), and on a write (not GET/HEAD) only
with the ``X-Karios-Console: 1`` header (a cross-site form cannot send it) and a matching
``Origin`` when one is sent. A Bearer header, when present, always wins.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from karios.api_gateway.models import ApiToken
from karios.common.bus.broadcasts import ApiTokenChanged
from karios.common.bus.runtime import Bus
from karios.common.cache import SingleFlightCache
from karios.common.db import Database
from karios.common.errors import Conflict, Forbidden, NotFound, ServiceUnavailable, Unauthorized
from karios.common.telemetry import get_logger

log = get_logger(__name__)


class Role(enum.IntEnum):
    viewer = 1
    operator = 2
    fabric_admin = 3


TOKEN_PREFIX = "kt_"  # noqa: S105 (a prefix, not a secret)
#: How long an unknown token's rejection is remembered (a new token works after at most this).
NEGATIVE_TTL_S = 1.0


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # Tokens are 256-bit random values, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


def token_changed_subject(bus: Bus) -> str:
    return bus.subjects.broadcast("gateway", "api_token_changed")


async def _announce(bus: Bus | None, name: str) -> None:
    """Tell every gateway replica; if the bus is away, their cache TTL still bounds the change."""
    if bus is None:
        return
    try:
        await bus.broadcast(ApiTokenChanged(name=name), token_changed_subject(bus))
    except ServiceUnavailable:
        log.warning("token change not broadcast (bus unavailable); caches expire by TTL", token_name=name)


async def create_token(
    db: Database,
    name: str,
    role: Role,
    token: str | None = None,
    *,
    bus: Bus | None = None,
    replace: bool = True,
) -> str:
    """Store a token (generated unless given) under ``name``. A live token of that name is
    replaced, or with ``replace=False`` (``POST /controlnode/tokens``) refused with
    :class:`Conflict`; a revoked one's name may be used again."""
    token = token or new_token()
    try:
        async with db.session() as s, s.begin():
            row = (await s.exec(select(ApiToken).where(ApiToken.name == name).with_for_update())).first()
            if row is None:
                s.add(ApiToken(name=name, role=role.name, token_hash=hash_token(token)))
            elif not replace and not row.revoked:
                raise _name_taken(name)
            else:
                row.role, row.token_hash, row.revoked = role.name, hash_token(token), False
    except IntegrityError as exc:  # the same name created at the same moment by another request
        raise _name_taken(name) from exc
    await _announce(bus, name)
    return token


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"an API token named {name!r} exists: rotate it (karios token rotate {name}) or revoke it first",
        field="name",
    )


async def rotate_token(
    db: Database, name: str, role: Role | None = None, *, bus: Bus | None = None
) -> tuple[Role, str]:
    """A new secret for the token called ``name``: its role kept unless given, a revoked one live
    again, the old secret refused on every replica at once. Returns the role and the new token."""
    token = new_token()
    async with db.session() as s, s.begin():
        row = (await s.exec(select(ApiToken).where(ApiToken.name == name).with_for_update())).first()
        if row is None:
            raise NotFound(f"no API token named {name!r}", field="name")
        row.role = (role or Role[row.role]).name
        row.token_hash, row.revoked = hash_token(token), False
        kept = Role[row.role]
    await _announce(bus, name)
    return kept, token


async def revoke_token(db: Database, name: str, *, bus: Bus | None = None) -> None:
    """Revoke the token called ``name`` (every replica stops accepting it at once)."""
    async with db.session() as s, s.begin():
        row = (await s.exec(select(ApiToken).where(ApiToken.name == name))).first()
        if row is None:
            raise NotFound(f"no API token named {name!r}", field="name")
        row.revoked = True
    await _announce(bus, name)


async def list_tokens(db: Database) -> list[ApiToken]:
    """Every token's name, role, creation time and revocation (never a hash or the token)."""
    async with db.session() as s:
        return list((await s.exec(select(ApiToken).order_by(ApiToken.name))).all())


async def authenticate(db: Database, token: str) -> Principal | None:
    async with db.session() as s:
        row = (await s.exec(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))).first()
    if row is None or row.revoked:
        return None
    return Principal(row.name, Role[row.role])


class TokenCache:
    """Verified tokens by hash for ``ttl`` seconds, single-flight; dropped by name on a broadcast."""

    def __init__(self, db: Database, ttl: float) -> None:
        self.db = db
        self._cache: SingleFlightCache[Principal] = SingleFlightCache(
            ttl=ttl, negative_ttl=min(ttl, NEGATIVE_TTL_S)
        )

    async def authenticate(self, token: str) -> Principal | None:
        key = hash_token(token)
        result = await self._cache.get_or_load(
            key, lambda: authenticate(self.db, token), tags=lambda p: (f"name:{p.name}",)
        )
        return result.value

    def cached(self, token: str) -> Principal | None:
        """The principal of ``token`` if it is verified and kept now; None otherwise (unknown,
        refused, or not asked yet: :meth:`authenticate` decides those)."""
        return self._cache.peek(hash_token(token))

    async def on_token_changed(self, msg: ApiTokenChanged) -> None:
        self._cache.invalidate([f"name:{msg.name}"])

    def listen(self, bus: Bus) -> None:
        """Subscribe to token changes (call before the bus starts)."""
        bus.broadcast_handler(token_changed_subject(bus), ApiTokenChanged, self.on_token_changed)


_bearer = HTTPBearer(auto_error=False, description="Karios API token (kt_…)")


def require(role: Role, *, query_token: bool = False):  # type: ignore[no-untyped-def]
    """Dependency: a principal with at least ``role``; ``query_token`` also accepts
    ``?access_token=`` (only the SSE endpoint: EventSource cannot send headers)."""

    async def dependency(
        request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)
    ) -> Principal:
        token = creds.credentials if creds else None
        if token is None and "access_token" in request.query_params:
            if not query_token:
                raise Unauthorized(
                    "access_token in the query string is only accepted by /controlnode/events; "
                    "send the token as 'Authorization: Bearer <token>'"
                )
            token = request.query_params["access_token"]
        if not token:
            token = console_cookie_token(request)
        if not token:
            raise Unauthorized("missing bearer token")
        principal = await _verify(request, token)
        if principal is None:
            raise Unauthorized("invalid or revoked token")
        request.state.principal = principal  # the actor of the audit record (api_gateway.audit)
        if principal.role < role:
            raise Forbidden(f"this endpoint needs role {role.name}; token has {principal.role.name}")
        return principal

    dependency.required_role = role  # type: ignore[attr-defined]  # read by api_gateway.fastpath
    return dependency


def required_role(dependency: object) -> Role | None:
    """The least role a :func:`require` dependency admits (None for any other callable)."""
    role = getattr(dependency, "required_role", None)
    return role if isinstance(role, Role) else None


CONSOLE_COOKIE = "karios_console"
CONSOLE_HEADER = "X-Karios-Console"
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def same_origin(request: Request) -> bool:
    """False when the browser marks the request cross-site or its ``Origin`` is another host."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") == host


def console_cookie_token(request: Request) -> str | None:
    """The console cookie's token, if this request may use it (see the module docstring)."""
    token = request.cookies.get(CONSOLE_COOKIE)
    if not token:
        return None
    if not same_origin(request):
        raise Unauthorized("the console cookie is refused on a cross-site request")
    if request.method not in _SAFE_METHODS and request.headers.get(CONSOLE_HEADER) != "1":
        raise Unauthorized(f"a write with the console cookie needs the header '{CONSOLE_HEADER}: 1'")
    return token


async def verify_token(request: Request, token: str) -> Principal | None:
    """The principal of ``token`` (cached), or None when unknown or revoked."""
    return await _verify(request, token)


async def _verify(request: Request, token: str) -> Principal | None:
    cache: TokenCache | None = getattr(request.app.state, "token_cache", None)
    if cache is not None:
        return await cache.authenticate(token)
    return await authenticate(request.app.state.runtime.db, token)
