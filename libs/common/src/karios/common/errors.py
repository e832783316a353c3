"""One error family for the whole system.

Every error carries a stable ``code`` (what a client or operator can match on) and
``retryable`` (whether trying again later may succeed). The HTTP status and the bus
disposition are derived from these in exactly one place each: :func:`http_status_for`
and :func:`bus_disposition`.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class KariosError(Exception):
    """Base error: a stable machine code, a human message, optional details."""

    code: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, field: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.field is not None:
            body["field"] = self.field
        if self.details is not None:
            body["details"] = self.details
        return body


class ValidationFailed(KariosError):
    code = "VALIDATION_FAILED"
    http_status = 422


class NotFound(KariosError):
    code = "NOT_FOUND"
    http_status = 404


class Conflict(KariosError):
    code = "CONFLICT"
    http_status = 409


class Unauthorized(KariosError):
    code = "UNAUTHORIZED"
    http_status = 401


class Forbidden(KariosError):
    code = "FORBIDDEN"
    http_status = 403


class UpstreamError(KariosError):
    """A peer we depend on (NetBox, a BMC, a node) failed or answered garbage."""

    code = "UPSTREAM_ERROR"
    retryable = True
    http_status = 502


class ServiceUnavailable(KariosError):
    """A Karios service, the bus or the database did not answer in time (try again later)."""

    code = "SERVICE_UNAVAILABLE"
    retryable = True
    http_status = 503
    #: Seconds a client should wait before trying again (HTTP ``Retry-After``).
    retry_after: ClassVar[int] = 2


class PermanentFailure(KariosError):
    """A command that can never succeed as sent (terminate, do not retry)."""

    code = "PERMANENT_FAILURE"
    http_status = 422


class InternalError(KariosError):
    code = "INTERNAL"
    http_status = 500


_BY_CODE: dict[str, type[KariosError]] = {}


def register_error(cls: type[KariosError]) -> type[KariosError]:
    """Make an error class reconstructible from its code (errors cross the bus as dicts)."""
    _BY_CODE[cls.code] = cls
    return cls


for _cls in (
    ValidationFailed,
    NotFound,
    Conflict,
    Unauthorized,
    Forbidden,
    UpstreamError,
    ServiceUnavailable,
    PermanentFailure,
    InternalError,
):
    register_error(_cls)


def error_from_dict(body: dict[str, Any]) -> KariosError:
    """Rebuild an error sent by another service; unknown codes keep their code and status class."""
    cls = _BY_CODE.get(str(body.get("code")), InternalError)
    err = cls(str(body.get("message", "")), field=body.get("field"), details=body.get("details"))
    if cls is InternalError and body.get("code"):
        err.code = str(body["code"])  # type: ignore[misc]
        err.retryable = bool(body.get("retryable", False))  # type: ignore[misc]
        if isinstance(body.get("http_status"), int) and 400 <= body["http_status"] <= 599:
            err.http_status = body["http_status"]  # type: ignore[misc]
    return err


def public_error(exc: BaseException) -> KariosError:
    """What a caller may see of ``exc``: a :class:`KariosError` as is, anything else an opaque
    ``INTERNAL`` (no exception class, SQL, parameters or traceback — those go to the log)."""
    if isinstance(exc, KariosError):
        return exc
    return InternalError("internal error: the details are in the service log")


def describe_for_log(exc: BaseException) -> str:
    """A one-line description of ``exc`` for the log, with statement parameters left out.

    SQLAlchemy's message appends ``[SQL: …] [parameters: …]`` (token hashes, ciphertexts) and
    PostgreSQL's ``DETAIL`` repeats key values: keep the class, the first line of the driver's
    message and the statement text, never the parameters.
    """
    orig = getattr(exc, "orig", None)
    statement = getattr(exc, "statement", None)
    if orig is not None or statement is not None:
        first = str(orig if orig is not None else "").strip().splitlines()[:1]
        kind = type(orig).__name__ if orig is not None else type(exc).__name__
        text = f"{type(exc).__name__} ({kind}): {first[0] if first else ''}"
        return f"{text} [statement: {str(statement)[:300]}]" if statement else text
    first = str(exc).strip().splitlines()[:1]
    return f"{type(exc).__name__}: {first[0][:300] if first else ''}"


def http_status_for(err: KariosError) -> int:
    """The single mapping from error to HTTP status."""
    return err.http_status


class Disposition(enum.StrEnum):
    ACK = "ack"
    NAK = "nak"  # redeliver later
    TERM = "term"  # give up: dead-letter + .failed event


def bus_disposition(err: BaseException | None, *, delivered: int, max_deliver: int) -> Disposition:
    """The single mapping from a handler's outcome to what happens to the message."""
    if err is None:
        return Disposition.ACK
    retryable = err.retryable if isinstance(err, KariosError) else True
    if retryable and delivered < max_deliver:
        return Disposition.NAK
    return Disposition.TERM
