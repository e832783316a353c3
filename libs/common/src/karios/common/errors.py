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


class StorageFull(ServiceUnavailable):
    """The disk under the database, or the message store, is full: writes fail until an operator
    frees space. The service stays up and says so (``/readyz`` check ``storage``, the
    ``karios_storage_full`` gauge); reads keep working, a write is worth retrying once space is back."""

    code = "STORAGE_FULL"
    retry_after: ClassVar[int] = 30


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
    StorageFull,
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


#: SQLSTATE 53100 ``disk_full``: a data file, its free-space map or a temporary file could not
#: grow ("could not extend file …: No space left on device"). (WAL that cannot grow is a PANIC:
#: the server restarts, which callers see as a database away.)
SQLSTATE_DISK_FULL = "53100"
#: The rest of class 53 (``insufficient_resources``, ``out_of_memory``, ``too_many_connections``,
#: ``configuration_limit_exceeded``): the server is short of something for now, try again later.
SQLSTATE_RESOURCES_CLASS = "53"
#: JetStream API error codes of a store with no room: insufficient resources (10023), account
#: resource limits (10002), storage / memory resources exceeded (10047 / 10028).
JETSTREAM_FULL_CODES = frozenset({10002, 10023, 10028, 10047})
#: JetStream "stream store failed" (10077): full when its text says so ("maximum bytes exceeded",
#: "no space left on device"), anything else (a store closing) is a plain 503.
JETSTREAM_STORE_FAILED = 10077
_FULL_WORDS = ("no space", "insufficient", "exceeded", "storage resources", "disk full")


def resource_error(exc: BaseException) -> ServiceUnavailable | None:
    """:class:`StorageFull` when ``exc`` (or its cause) says the database's disk or the message
    store is full, :class:`ServiceUnavailable` for another shortage of the database (the rest of
    SQLSTATE class 53); ``None`` otherwise.

    Pure: reads the driver's attributes (asyncpg's and SQLAlchemy's ``sqlstate``, nats-py's
    ``err_code`` and ``description``), never imports a driver.
    """
    seen: BaseException | None = exc
    for _ in range(5):  # the driver error is at most a few ``__cause__`` / ``orig`` links down
        if seen is None:
            return None
        if isinstance(seen, StorageFull):
            return seen
        sqlstate = getattr(seen, "sqlstate", None)
        if isinstance(sqlstate, str):
            if sqlstate == SQLSTATE_DISK_FULL:
                return StorageFull(
                    "the database's disk is full: writes fail until space is freed; try again later",
                    details={"store": "database"},
                )
            if sqlstate.startswith(SQLSTATE_RESOURCES_CLASS):
                return ServiceUnavailable(f"the database is out of resources (SQLSTATE {sqlstate})")
        if _jetstream_full(getattr(seen, "err_code", None), getattr(seen, "description", None)):
            return StorageFull(
                "the message store is full: writes fail until space is freed; try again later",
                details={"store": "bus"},
            )
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return None


def _jetstream_full(err_code: object, description: object) -> bool:
    if not isinstance(err_code, int):
        return False
    if err_code in JETSTREAM_FULL_CODES:
        return True
    text = description.lower() if isinstance(description, str) else ""
    return err_code == JETSTREAM_STORE_FAILED and any(word in text for word in _FULL_WORDS)


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
