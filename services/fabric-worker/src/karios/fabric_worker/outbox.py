"""The fabric-worker's transactional outbox (issue 12 item 4, ADR 0002): the generic outbox of
:mod:`karios.common.outbox` on the tables of schema ``fabric`` (migration ``0006``).

``req.fabric.request_apply`` writes the queued apply job row and its ``cmd.fabric.apply`` in ONE
transaction (:meth:`RolloutRepository.queue_job` with ``then=``): a worker that dies between the
commit and the publish leaves the command in the outbox, and the relay of the next replica to
start (or of a live peer) publishes it — the apply runs once. The reaper leaves a queued job whose
command still waits here alone (:func:`waiting_job_ids`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from karios.common import outbox as common
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Command
from karios.common.contracts.fabric_rollout import StartFabricApply
from karios.fabric_worker.models import SCHEMA

outbox_table, dlq_table = common.outbox_tables(SCHEMA)
RELAYED: dict[str, type[Command]] = {StartFabricApply.TYPE: StartFabricApply}


def fabric_outbox(
    bus: Bus,
    engine: Any,
    registry: CollectorRegistry | None = None,
    config: common.RelayConfig | None = None,
) -> common.CommandOutbox:
    """The worker's outbox (the same relay as the gateway's); its queue is ``<prefix>.cmd.fabric``
    (apart from the gateway's)."""
    return common.CommandOutbox(
        bus,
        engine,
        tables=(outbox_table, dlq_table),
        relayed=RELAYED,
        name="fabric-worker",
        queue=f"{bus.subjects.prefix}.cmd.fabric",
        registry=registry,
        config=config,
    )


def waiting_job_ids() -> sa.Select[Any]:
    """Job ids whose command still waits in the outbox (not yet published)."""
    ids = common.waiting_msg_ids(outbox_table)
    return ids.where(outbox_table.c.headers[common.MSG_ID_HEADER].astext.is_not(None))  # NOT IN-safe
