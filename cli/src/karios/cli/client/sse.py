"""The gateway's Server-Sent Events as Python dicts, resuming with ``Last-Event-ID`` on a drop."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from karios.cli.client.api import Api, CliError


@dataclass
class SseEvent:
    id: int | None
    name: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def payload(self) -> dict[str, Any]:
        """The event's own fields (the envelope's ``data``)."""
        inner = self.data.get("data")
        return inner if isinstance(inner, dict) else self.data


def parse_lines(lines: Iterator[str]) -> Iterator[SseEvent | None]:
    """SSE wire format → events; ``None`` for a comment (``: connected``, keep-alives); an event
    named ``""`` for a frame with an id and no data: the gateway's first frame, the stream's
    position when the client joined (the resume point before any event has arrived)."""
    ev_id: int | None = None
    name, data, id_seen = "message", [], False
    for line in lines:
        if line == "":
            if data:
                try:
                    body = json.loads("\n".join(data))
                except ValueError:
                    body = {"text": "\n".join(data)}
                yield SseEvent(ev_id, name, body if isinstance(body, dict) else {"value": body})
            elif id_seen:
                yield SseEvent(ev_id, "", {})
            name, data, id_seen = "message", [], False
            continue
        if line.startswith(":"):
            yield None
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "id" and value.isdigit():
            ev_id, id_seen = int(value), True
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)


def stream(
    api: Api,
    channels: list[str],
    *,
    on_connect: Callable[[], None] | None = None,
    last_event_id: int | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[SseEvent]:
    """Events on ``channels`` until ``stop()``; reconnects (with resume) after drops and 503s.
    ``on_connect`` runs once the stream is open, so a caller can read state without a gap."""
    params = [("channel", c) for c in channels]
    backoff, connected = 0.5, False
    while not stop():
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        try:
            with api.client.stream(
                "GET",
                "/controlnode/events",
                params=params,
                headers=headers,
                timeout=httpx.Timeout(30, read=20),
            ) as resp:
                if resp.status_code >= 400 and resp.status_code != 503:
                    resp.read()
                    api.check(resp, "GET", "/controlnode/events")
                if resp.status_code == 503:
                    raise httpx.TransportError("event stream unavailable (503)")
                backoff, connected = 0.5, True
                if on_connect is not None:
                    on_connect()
                    on_connect = None
                for ev in parse_lines(resp.iter_lines()):
                    if ev is not None:
                        if ev.id is not None:
                            last_event_id = ev.id
                        if ev.name == "":  # the position marker: a resume point, not an event
                            continue
                        if ev.name == "reconnect":
                            break
                        yield ev
                    if stop():
                        return
        except CliError:
            raise
        except httpx.ConnectError as exc:
            if not connected:  # never reached: say so (exit 2) instead of retrying for ever
                raise CliError(
                    f"cannot reach the gateway at {api.ctx.url} ({exc}); is `karios up` running, "
                    "or is the URL wrong (`karios login URL`)?",
                    2,
                ) from None
            if stop():
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        except httpx.HTTPError:
            if stop():
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
