"""The audit trail: every state-changing request through the gateway, recorded once.

What is recorded: a write (POST/PUT/PATCH/DELETE) on a route that needs an operator token
(``Depends(require(...))``), whatever its answer — the 401/403 of a failed authentication too
(actor ``unknown`` when no token was recognised; a 403 names the token whose role was too low).
The console's sign-in and sign-out are recorded too (``SESSION_ROUTES``: the actor is the token
that signed in or out; a rejected sign-in is a 401 of actor ``unknown``). Writes that only read
(``READ_ONLY_WRITES``: the progress queries, plan, diff) and the installer's callbacks (job tokens,
not operators) are not audit events.

A record holds the time, the actor (token name and role), the method and route *template*
(``/controlnode/tokens/{name}``, never the raw path or query string), the target (path
parameter, else an identifying field of the JSON body: ``bmc_IP``, ``node_ip``, ``name`` …), the
job id a 2xx answer names, the HTTP status, the trace id of the request span and the
``X-Request-ID`` header. Never a body, a header, a token or a password: only the whitelisted
identifying fields below are read from a body (:func:`target_of`).

Latency: :class:`AuditTrail` (pure ASGI, innermost layer, inside the request span) logs one
``audit`` line at INFO when the answer has been sent and hands the record to
:class:`AuditWriter`, which inserts queued records in batches in the background (``gateway.audit_log``).
If the database is away the writer keeps up to ``MAX_PENDING`` records and retries; the log line
is written either way.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from fastapi.routing import APIRoute
from opentelemetry import trace
from sqlmodel import Field, SQLModel, col, select
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.api_gateway.auth import Principal, required_role
from karios.api_gateway.models import SCHEMA
from karios.common.db import Database
from karios.common.errors import ValidationFailed
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: POST routes that change nothing (queries with a body): not audit events.
READ_ONLY_WRITES = frozenset(
    {
        "/controlnode/provision/progress",
        "/controlnode/provision/progress/all",
        "/controlnode/fabric-config/plan",
        "/controlnode/fabric-config/diff",
        "/console/fabric/diff",
    }
)
#: The console's session routes: who signed in (or failed to: actor ``unknown``, 401) and out.
SESSION_ROUTES = frozenset({"/console/login", "/console/logout"})
#: Path parameters naming what a request acts on, in order of preference.
TARGET_PARAMS = ("bmc_ip", "job_id", "id", "node_ip", "name")
#: JSON body fields naming the target (identifiers only: never a secret-bearing field).
TARGET_FIELDS = ("bmc_IP", "bmc_ip", "node_ip", "job_id", "name")
UNKNOWN_ACTOR = "unknown"
BODY_LIMIT = 64 * 1024  # request bodies larger than this are not searched for a target
ANSWER_LIMIT = 16 * 1024  # nor answers for a job id
MAX_PENDING = 10_000
_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._:@-]{0,199}$")
_JOB_ID = re.compile(r"^[0-9a-fA-F-]{8,64}$")


def _now() -> datetime:
    return datetime.now(UTC)


class AuditRecord(SQLModel, table=True):
    """One audited request (``gateway.audit_log``; migration 0006)."""

    __tablename__ = "audit_log"
    __table_args__ = {"schema": SCHEMA}

    id: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger(), primary_key=True))
    at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    actor: str = Field(max_length=200)
    role: str | None = Field(default=None, max_length=32)
    method: str = Field(max_length=8)
    route: str = Field(max_length=300)
    target: str | None = Field(default=None, max_length=200)
    job_id: str | None = Field(default=None, max_length=64)
    status: int
    trace_id: str | None = Field(default=None, max_length=32)
    request_id: str | None = Field(default=None, max_length=128)
    client: str | None = Field(default=None, max_length=64)


# -- what a request is ---------------------------------------------------------------------
def audited_route(route: BaseRoute | None, method: str) -> bool:
    """A write on a route that needs an operator token, and not a query-with-a-body; and the
    console's sign-in and sign-out (their token is in a form or a cookie, not a ``require``)."""
    if method not in WRITE_METHODS or not isinstance(route, APIRoute) or route.path in READ_ONLY_WRITES:
        return False
    return route.path in SESSION_ROUTES or _needs_token(route)


def _needs_token(route: APIRoute) -> bool:
    """Whether a ``require(...)`` dependency guards ``route`` (looked up once, kept on the route)."""
    found = getattr(route, "_karios_needs_token", None)
    if found is None:
        stack, found = list(route.dependant.dependencies), False
        while stack and not found:
            dep = stack.pop()
            found = required_role(dep.call) is not None
            stack.extend(dep.dependencies)
        route._karios_needs_token = found  # type: ignore[attr-defined]
    return bool(found)


def _ident(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and _ID.match(value) else None


def target_of(path_params: dict[str, Any], body: bytes | None) -> str | None:
    """What the request acts on: a path parameter, else an identifying field of a JSON body."""
    for name in TARGET_PARAMS:
        if (v := _ident(path_params.get(name))) is not None:
            return v
    data = _json_object(body)
    if data is not None:
        for name in TARGET_FIELDS:
            if (v := _ident(data.get(name))) is not None:
                return v
    return None


def job_id_of(path_params: dict[str, Any], route: str, answer: bytes | None) -> str | None:
    """The job a request created or acted on: ``job_id``/``id`` of a job route or of the answer."""
    for name in ("job_id", "id"):
        v = path_params.get(name)
        if isinstance(v, str) and _JOB_ID.match(v) and ("/job" in route or name == "job_id"):
            return v
    data = _json_object(answer)
    if data is not None:
        for name in ("job_id", "id"):
            v = data.get(name)
            if isinstance(v, str) and _JOB_ID.match(v):
                return v
    return None


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def _header(scope: Scope, name: bytes, limit: int) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            text = v.decode("latin-1")[:limit]
            return text if text.isprintable() else None
    return None


# -- the middleware --------------------------------------------------------------------------
class AuditTrail:
    """Pure ASGI layer: record each audited request after its answer (see the module doc).

    Added innermost (``app.user_middleware.append``), so the request span is current and the
    route is matched when it looks; the actor is what :func:`karios.api_gateway.auth.require`
    left in ``request.state.principal``.
    """

    def __init__(self, app: ASGIApp, writer: AuditWriter) -> None:
        self.app, self.writer = app, writer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        body = bytearray()
        answer = bytearray()
        status = 500  # an exception no handler took
        json_answer = False

        async def tee_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(body) <= BODY_LIMIT:
                body.extend(message.get("body", b""))
            return message

        async def tee_send(message: Message) -> None:
            nonlocal status, json_answer
            if message["type"] == "http.response.start":
                status = message["status"]
                for k, v in message.get("headers", ()):
                    if k.lower() == b"content-type":
                        json_answer = 200 <= status < 300 and v.startswith(b"application/json")
            elif message["type"] == "http.response.body" and json_answer and len(answer) <= ANSWER_LIMIT:
                answer.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, tee_receive, tee_send)
        finally:
            route = scope.get("route")
            if audited_route(route, scope["method"]):
                assert isinstance(route, APIRoute)
                self._record(scope, route.path, status, bytes(body), bytes(answer))

    def _record(self, scope: Scope, route: str, status: int, body: bytes, answer: bytes) -> None:
        try:
            principal = scope.get("state", {}).get("principal")
            params = scope.get("path_params", {})
            client = scope.get("client")
            rec = AuditRecord(
                actor=principal.name if isinstance(principal, Principal) else UNKNOWN_ACTOR,
                role=principal.role.name if isinstance(principal, Principal) else None,
                method=scope["method"],
                route=route,
                target=target_of(params, body if len(body) <= BODY_LIMIT else None),
                job_id=job_id_of(params, route, answer if len(answer) <= ANSWER_LIMIT else None),
                status=status,
                trace_id=_trace_id(),
                request_id=_header(scope, b"x-request-id", 128),
                client=str(client[0])[:64] if client else None,
            )
        except Exception as exc:  # the audit never breaks a request
            log.warning("audit record not built", error=f"{type(exc).__name__}: {exc}"[:300])
            return
        log.info(
            "audit",
            actor=rec.actor,
            role=rec.role,
            method=rec.method,
            route=rec.route,
            target=rec.target,
            job_id=rec.job_id,
            status=rec.status,
            request_id=rec.request_id,
            client=rec.client,
        )
        self.writer.submit(rec)


# -- the writer ------------------------------------------------------------------------------
class AuditWriter:
    """Inserts submitted records in batches in the background; :meth:`stop` writes what is left."""

    def __init__(self, db: Database, *, batch: int = 200, retry_s: float = 1.0) -> None:
        self.db, self.batch, self.retry_s = db, batch, retry_s
        self._pending: deque[AuditRecord] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._dropped = 0
        self._writing = 0  # batches being inserted now

    @property
    def idle(self) -> bool:
        """Nothing pending and nothing being written: every submitted record is stored (or dropped)."""
        return not self._pending and not self._writing

    def submit(self, rec: AuditRecord) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self._dropped += 1
            if self._dropped in (1, 10, 100) or self._dropped % 1000 == 0:
                log.warning(
                    "audit records dropped (database unavailable); their audit log lines remain",
                    dropped=self._dropped,
                )
        self._pending.append(rec)
        self._wake.set()

    async def start(self) -> None:
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 (a bound on the last writes)
        """Write what is pending (within ``timeout``), then end the writer."""
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._task)
        except TimeoutError:
            await cancel_and_wait(self._task)
        self._task = None
        if self._pending:
            log.warning("audit records not written at stop", count=len(self._pending))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                try:
                    await self.flush()
                except Exception as exc:
                    log.warning("audit records not written yet", error=f"{type(exc).__name__}: {exc}"[:300])
                    await asyncio.sleep(self.retry_s)
            if self._closing:
                return

    async def flush(self) -> None:
        """Write everything pending now (a failed batch goes back to the front of the queue)."""
        while self._pending:
            rows = [self._pending.popleft() for _ in range(min(self.batch, len(self._pending)))]
            self._writing += 1
            try:
                async with self.db.session() as s, s.begin():
                    s.add_all(rows)
            except BaseException:
                self._pending.extendleft(reversed(rows))
                raise
            finally:
                self._writing -= 1


# -- reading ---------------------------------------------------------------------------------
_DURATION = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None, *, field: str = "since") -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or an age: ``30m``, ``2h``, ``7d``."""
    text = text.strip()
    try:
        if m := _DURATION.match(text):
            return (now or _now()) - timedelta(**{_UNIT[m.group(2)]: int(m.group(1))})
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ValidationFailed(
            f"{field}: an ISO 8601 time (2026-01-31T12:00:00Z) or an age (30m, 2h, 7d), not {text[:40]!r}",
            field=field,
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@dataclass(frozen=True)
class AuditQuery:
    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    method: str | None = None
    action: str | None = None
    target: str | None = None
    status: int | None = None
    before: int | None = None
    limit: int = 100


async def query_audit(db: Database, q: AuditQuery) -> tuple[list[AuditRecord], int | None]:
    """Records matching ``q``, newest first, and the ``before`` cursor of the next page (or None)."""
    stmt = select(AuditRecord)
    if q.since is not None:
        stmt = stmt.where(col(AuditRecord.at) >= q.since)
    if q.until is not None:
        stmt = stmt.where(col(AuditRecord.at) < q.until)
    if q.actor:
        stmt = stmt.where(col(AuditRecord.actor) == q.actor)
    if q.method:
        stmt = stmt.where(col(AuditRecord.method) == q.method.upper())
    if q.action:
        word = q.action.strip()
        if word.upper() in WRITE_METHODS:
            stmt = stmt.where(col(AuditRecord.method) == word.upper())
        else:
            method, _, route = word.partition(" ")
            if route and method.upper() in WRITE_METHODS:
                stmt = stmt.where(col(AuditRecord.method) == method.upper())
                word = route.strip()
            pattern = "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            stmt = stmt.where(col(AuditRecord.route).like(pattern, escape="\\"))
    if q.target:
        stmt = stmt.where(col(AuditRecord.target) == q.target)
    if q.status is not None:
        stmt = stmt.where(col(AuditRecord.status) == q.status)
    if q.before is not None:
        stmt = stmt.where(col(AuditRecord.id) < q.before)
    stmt = stmt.order_by(col(AuditRecord.id).desc()).limit(q.limit + 1)
    async with db.session() as s:
        rows = list((await s.exec(stmt)).all())
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    return rows, (rows[-1].id if more and rows else None)
