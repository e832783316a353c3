"""CloudEvents-style envelope carried by every command and event on the bus.

``id`` (UUIDv7) doubles as ``Nats-Msg-Id`` so JetStream's duplicate window drops a
re-published message. ``correlationid`` follows one user action through every service: the
gateway opens a :func:`correlation_scope` per request (its ``X-Correlation-Id``), every consumer
one per delivery (the message's own ``correlationid``), and :func:`wrap` takes it from there;
``causationid`` names the message that caused this one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import uuid6
from pydantic import BaseModel, ConfigDict, Field

from karios.common.telemetry import current_traceparent

T = TypeVar("T", bound=BaseModel)

HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_TYPE = "ce-type"
HEADER_TRACEPARENT = "traceparent"


def new_id() -> str:
    return str(uuid6.uuid7())


_CORRELATION: ContextVar[str | None] = ContextVar("karios_correlationid", default=None)


def current_correlation() -> str | None:
    """The correlation id of the user action this code runs for (None outside any)."""
    return _CORRELATION.get()


@contextmanager
def correlation_scope(correlationid: str | None) -> Iterator[str | None]:
    """Every message wrapped inside the block (and in tasks started from it) carries
    ``correlationid``; ``None`` or "" leaves the enclosing one in place."""
    if not correlationid:
        yield _CORRELATION.get()
        return
    token = _CORRELATION.set(correlationid)
    try:
        yield correlationid
    finally:
        _CORRELATION.reset(token)


class Envelope(BaseModel, Generic[T]):
    model_config = ConfigDict(extra="ignore")

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=new_id)
    type: str
    source: str
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    subject: str = ""
    correlationid: str = ""
    causationid: str | None = None
    traceparent: str | None = None
    datacontenttype: Literal["application/json"] = "application/json"
    data: T
    # Where a consumer read it: the stream sequence (0: not read from a stream). Set on delivery,
    # never sent: a read model orders one entity's events by it (a redelivery keeps its sequence).
    stream_seq: int = Field(default=0, exclude=True)

    def headers(self) -> dict[str, str]:
        h = {HEADER_MSG_ID: self.id, HEADER_TYPE: self.type}
        if self.traceparent:
            h[HEADER_TRACEPARENT] = self.traceparent
        return h


def wrap(
    data: BaseModel,
    *,
    source: str,
    subject: str = "",
    cause: Envelope[Any] | None = None,
    correlationid: str | None = None,
    msg_id: str | None = None,
) -> Envelope[Any]:
    """Wrap a contract payload. Correlation: the explicit one, else the ``cause``'s, else the
    enclosing :func:`correlation_scope`'s, else a new action (the message's own id)."""
    type_name = getattr(type(data), "TYPE", None)
    if not type_name:
        raise TypeError(f"{type(data).__name__} is not a bus contract (no TYPE)")
    eid = msg_id or new_id()
    corr = correlationid or (cause.correlationid if cause else None) or _CORRELATION.get() or eid
    return Envelope[type(data)](  # type: ignore[misc]
        id=eid,
        type=type_name,
        source=source,
        subject=subject,
        correlationid=corr,
        causationid=cause.id if cause else None,
        traceparent=current_traceparent(),
        data=data,
    )


class RawEnvelope(Envelope[Any]):
    """An envelope whose ``data`` is kept as a plain dict (generic consumers: SSE, read models)."""

    data: dict[str, Any]  # type: ignore[assignment]
