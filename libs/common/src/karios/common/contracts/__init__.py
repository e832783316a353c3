"""Typed, versioned payloads for every command, event and query on the bus."""

from karios.common.contracts.base import CONTRACTS, Command, Contract, ErrorBody, Event, Query, Reply

__all__ = ["CONTRACTS", "Command", "Contract", "ErrorBody", "Event", "Query", "Reply"]
