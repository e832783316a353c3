"""The NATS connection's fault rules: how long to wait between reconnects, which errors mean
"the bus is away right now" (the caller answers 503 + ``Retry-After``, never 500)."""

from __future__ import annotations

import random
from typing import Any

import nats.errors
import nats.js.errors

UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
    nats.js.errors.ServiceUnavailableError,
    # A stream with no leader for a moment (a cluster node died, the replicas elect a new one).
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
)

#: Reconnect delays: 0.1 s doubling to a 2 s cap, with jitter (many replicas do not stampede).
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 2.0


def reconnect_backoff(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
    """nats-py ``reconnect_to_server_handler``: keep the client's choice of server, pick the delay."""
    attempts = min((getattr(s, "reconnects", 0) for s in servers), default=0)
    delay = min(RECONNECT_MAX_S, RECONNECT_FIRST_S * 2 ** min(attempts, 10))
    return None, delay * random.uniform(0.8, 1.2)
