"""The generic outbox (``karios.common.outbox``) as each service configures it: its own schema,
queue and relayed command types; a command another service relays is refused at ``add``."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway import outbox as gateway
from karios.common.bus.runtime import Bus
from karios.common.contracts.fabric_rollout import StartFabricApply
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.common.outbox import MSG_ID_HEADER, OutboxRow
from karios.common.settings import KariosSettings
from karios.fabric_worker import outbox as fabric

SETTINGS = KariosSettings(_env_file=None, dev_mode=True, nats_url="nats://127.0.0.1:1", bus_prefix="u")  # type: ignore[call-arg]
APPLY = StartFabricApply(job_id="j1", node_ip="", caller="t")
PROVISION = StartProvision(job_id="j2", spec=ProvisionSpec(bmc_ip="10.0.0.1", vendor="dell", hostname="n1"))


def test_each_service_has_its_own_tables_and_queue() -> None:
    assert (gateway.outbox_table.schema, fabric.outbox_table.schema) == ("gateway", "fabric")
    assert gateway.outbox_table.name == fabric.outbox_table.name == "command_outbox"
    bus = Bus.from_settings(SETTINGS, "t")
    engine = create_async_engine("postgresql+asyncpg://u@127.0.0.1:1/none")  # never connected
    assert gateway.CommandOutbox(bus, engine).queue == "u.cmd"
    assert fabric.fabric_outbox(bus, engine).queue == "u.cmd.fabric"
    sql = str(fabric.waiting_job_ids())
    assert "fabric.command_outbox" in sql and "IS NOT NULL" in sql  # NOT IN-safe subquery


async def test_a_command_the_service_does_not_relay_is_refused() -> None:
    bus = Bus.from_settings(SETTINGS, "t")
    box = fabric.fabric_outbox(bus, create_async_engine("postgresql+asyncpg://u@127.0.0.1:1/none"))
    with pytest.raises(ValueError, match="not relayed"):
        await box.add(None, PROVISION, "u.cmd.provision.start", entity="j2", msg_id="j2")  # type: ignore[arg-type]
    row = OutboxRow(
        type=APPLY.TYPE, subject="u.cmd.fabric.apply", msg_id="j1", data=APPLY.model_dump(mode="json")
    )
    assert row.command(fabric.RELAYED) == APPLY
    with pytest.raises(ValueError, match="relays no command"):
        row.command(gateway.RELAYED)
    assert MSG_ID_HEADER == "karios-msg-id"  # the header the reconcile and the reaper read
