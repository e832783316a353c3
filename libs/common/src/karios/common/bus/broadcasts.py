"""Broadcast messages every replica of a service hears (core NATS, no stream).

A broadcast is an invalidation hint, not a record: whoever changes the data commits it first,
then broadcasts; a replica that misses one is still bounded by its cache TTL.
"""

from __future__ import annotations

from karios.common.contracts.base import Event


class ApiTokenChanged(Event):
    """An API token was replaced or revoked: every gateway replica drops it from its token cache."""

    TYPE = "karios.gateway.api_token_changed.v1"

    name: str
