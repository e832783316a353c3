"""Base of every bus contract: a typed, versioned Pydantic model with a CloudEvents ``type``."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

CONTRACTS: dict[str, type[Contract]] = {}


class Contract(BaseModel):
    """Subclasses set ``TYPE`` (``karios.<domain>.<name>.v<version>``)."""

    model_config = ConfigDict(extra="ignore")
    TYPE: ClassVar[str] = ""
    KIND: ClassVar[str] = ""  # command | event | query | reply

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("TYPE"):
            if cls.TYPE in CONTRACTS and CONTRACTS[cls.TYPE] is not cls:
                raise TypeError(f"duplicate contract type {cls.TYPE}")
            CONTRACTS[cls.TYPE] = cls


class Command(Contract):
    KIND = "command"


class Event(Contract):
    KIND = "event"


class Query(Contract):
    KIND = "query"


class ErrorBody(BaseModel):
    code: str
    message: str
    retryable: bool = False
    field: str | None = None
    details: Any = None
    # The sender's status: a code only the sender defines (e.g. a worker's NODE_UNREACHABLE)
    # keeps its 4xx/502 in a service that does not know the class, instead of becoming a 500.
    http_status: int | None = None

    @classmethod
    def of(cls, err: Any) -> ErrorBody:
        """The body of a :class:`~karios.common.errors.KariosError` (its status included)."""
        return cls(**err.to_dict(), http_status=err.http_status)


class Reply(BaseModel):
    """Envelope of a request/reply answer: either ``result`` or ``error``."""

    ok: bool
    result: Any = None
    error: ErrorBody | None = None
