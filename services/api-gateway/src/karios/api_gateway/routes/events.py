"""``GET /controlnode/events`` — Server-Sent Events with a channel filter."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.events import SSEResponse
from karios.common.errors import ServiceUnavailable, ValidationFailed

router = APIRouter(prefix="/controlnode", tags=["events"])

_CHANNEL_KINDS = ("provision", "fabric")
_CHANNEL_PREFIXES = ("job:", "node:")


def parse_channels(raw: list[str] | None) -> set[str] | None:
    wanted: set[str] = set()
    for item in raw or []:
        for ch in item.split(","):
            ch = ch.strip()
            if not ch:
                continue
            if ch not in _CHANNEL_KINDS and not (
                ch.startswith(_CHANNEL_PREFIXES) and len(ch.split(":", 1)[1]) > 0
            ):
                raise ValidationFailed(
                    f"channel: unknown channel {ch!r} (provision, fabric, job:<id>, node:<ip>)",
                    field="channel",
                )
            wanted.add(ch)
    return wanted or None


@router.get(
    "/events",
    summary="Server-Sent Events stream",
    description=(
        "Relays Karios events. `channel` (repeatable or comma-separated): `provision`, `fabric`, "
        "`job:<id>`, `node:<ip>`; none means all. Each event's `id` is its stream sequence: reconnect "
        "with `Last-Event-ID` to receive exactly the events missed. The first frame (`: connected`) of a "
        "stream opened without `Last-Event-ID` carries only an `id`: the sequence the stream starts after, "
        "so a client resumes without a gap even before its first event. A client that falls behind receives "
        "an `event: reconnect` and should reconnect with `Last-Event-ID`. Browsers may pass the token "
        "as `access_token` query parameter (EventSource cannot set headers)."
    ),
    response_class=StreamingResponse,
)
async def events(
    request: Request,
    channel: list[str] | None = Query(None),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    _p: Principal = Depends(require(Role.viewer, query_token=True)),
) -> SSEResponse:
    wanted = parse_channels(channel)
    # A malformed Last-Event-ID (not ASCII digits) is treated as absent, as the SSE spec's
    # clients expect: the stream starts with new events instead of failing the reconnect.
    raw_id = (last_event_id or "").strip()
    resume = int(raw_id) if raw_id.isascii() and raw_id.isdigit() and len(raw_id) <= 19 else None
    if not request.app.state.runtime.bus.connected:
        # Nothing to stream from: a clear 503 + Retry-After (EventSource retries by itself).
        raise ServiceUnavailable("the event stream is unavailable while the message bus reconnects")
    return SSEResponse(request.app.state.relay, wanted, resume)
