"""How an event on the bus maps to SSE channels and an SSE event name (pure).

Channels a UI subscribes to: ``provision``, ``fabric``, ``job:<id>``, ``node:<ip>``.
"""

from __future__ import annotations

from typing import Any

# SSE event names the seed's UI listens for, by domain.
_EVENT_NAME_BY_DOMAIN = {"fabric": "fabric_switch"}
_CHANNEL_BY_DOMAIN = {
    "provision": "provision",
    "installer": "provision",
    "inventory": "provision",
    "fabric": "fabric",
}


def route_event(domain: str, fact: str, data: dict[str, Any]) -> tuple[str, set[str]]:
    """Return (SSE event name, channels) for an event of ``domain``/``fact`` carrying ``data``."""
    channels: set[str] = set()
    if domain in _CHANNEL_BY_DOMAIN:
        channels.add(_CHANNEL_BY_DOMAIN[domain])
    for key in ("job_id", "parent_id", "apply_job_id"):
        if data.get(key):
            channels.add(f"job:{data[key]}")
    for key in ("node_ip", "bmc_ip"):
        if data.get(key):
            channels.add(f"node:{data[key]}")
    name = _EVENT_NAME_BY_DOMAIN.get(domain) or fact.replace(".", "_")
    return name, channels


def channel_matches(wanted: set[str] | None, channels: set[str]) -> bool:
    """An empty filter means every channel."""
    return not wanted or bool(wanted & channels)
