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


class Reply(BaseModel):
    """Envelope of a request/reply answer: either ``result`` or ``error``."""

    ok: bool
    result: Any = None
    error: ErrorBody | None = None
