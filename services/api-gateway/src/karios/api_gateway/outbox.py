"""The gateway's transactional outbox (issue 12 item 4, ADR 0002): the generic outbox of
:mod:`karios.common.outbox` on the tables of schema ``gateway``, relaying ``cmd.provision.start``.

A route that changes state and implies a command (``POST /controlnode/provision``: job row +
``cmd.provision.start``) writes the command as a row of ``gateway.command_outbox`` in the SAME
transaction (:meth:`CommandOutbox.add`); 202 means "committed". The relay (woken by the insert's
NOTIFY on commit, batches claimed with SKIP LOCKED, published concurrently, marked in one statement),
its retries, the DLQ and the chaos hook are described in :mod:`karios.common.outbox`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from karios.api_gateway.models import SCHEMA
from karios.common import outbox as common
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Command
from karios.common.contracts.provision import StartProvision
from karios.common.outbox import (  # noqa: F401 (re-exported: the gateway's tests and app use them)
    KILL_AFTER_COMMIT_ENV,
    MSG_ID_HEADER,
    RETRY_MAX_S,
    RelayConfig,
    RelayRetry,
    kill_after_commit_hook,
)

outbox_table, dlq_table = common.outbox_tables(SCHEMA)
#: The commands the gateway sends through the outbox, by their contract TYPE.
RELAYED: dict[str, type[Command]] = {StartProvision.TYPE: StartProvision}


class OutboxRow(common.OutboxRow):
    """A gateway outbox row: gives back one of :data:`RELAYED`."""

    def command(self, relayed: dict[str, type[Command]] | None = None) -> Command:
        return super().command(relayed or RELAYED)


class CommandOutbox(common.CommandOutbox):
    """The gateway's outbox: :meth:`add` in a route's transaction, the relay started with the app."""

    def __init__(
        self,
        bus: Bus,
        engine: Any,
        *,
        on_relayed: common.Relayed | None = None,
        on_relayed_many: common.RelayedMany | None = None,
        registry: CollectorRegistry | None = None,
        config: RelayConfig | None = None,
        before_mark: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            bus,
            engine,
            tables=(outbox_table, dlq_table),
            relayed=RELAYED,
            name="api-gateway",
            on_relayed=on_relayed,
            on_relayed_many=on_relayed_many,
            registry=registry,
            config=config,
            before_mark=before_mark,
        )


def waiting_msg_ids() -> sa.Select[Any]:
    """Dedupe ids of commands still waiting in the outbox (a subquery for the reconcile)."""
    return common.waiting_msg_ids(outbox_table)
