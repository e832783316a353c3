"""A job's view never goes back: the gateway's projector on the real NATS and PostgreSQL.

Both gateway replicas pull batches of the shared ``gateway-provision-projector`` consumer. When
one dies holding a batch, the other applies the later events at once and the dead one's come
back ``ack_wait`` later. Seen in the cluster test (a CI run): jobs whose BMC had been reset
showed ``queued`` for good — the redelivered first event had overwritten ``booting``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from sqlmodel import select

import karios.api_gateway
from karios.api_gateway.readmodel import (
    CONSUMER,
    JobRow,
    ProvisionProgress,
    ProvisionProjector,
    apply_progress,
)
from karios.common.bus.consumers import PullConsumer
from karios.common.bus.envelope import RawEnvelope
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import JobProgress
from karios.common.db import Database
from karios.common.db.migrate import upgrade
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration
MIGRATIONS = Path(karios.api_gateway.__file__).parent / "migrations"
ACK_WAIT = 2.0
BMC = "10.97.0.1"


def event(job_id: str, state: str, stage: str, percent: int) -> JobProgress:
    return JobProgress(
        job_id=job_id,
        bmc_ip=BMC,
        job_type="provision",
        state=state,
        status="running",
        stage=stage,
        percent=percent,
        message=stage,
    )


@pytest.fixture
async def bus_db(settings) -> AsyncIterator[tuple[Bus, Database]]:
    await asyncio.to_thread(upgrade, MIGRATIONS, settings.database_url, "gateway")
    bus, db = Bus.from_settings(settings, "gw-order"), Database(settings.database_url)
    await bus.start()
    yield bus, db
    await bus.stop()
    await db.close()


async def history(db: Database, job_id: str) -> list[ProvisionProgress]:
    """The job's progress records as every route lists them (oldest first)."""
    async with db.session() as s:
        q = select(ProvisionProgress).where(ProvisionProgress.job_id == job_id).order_by(ProvisionProgress.id)
        return list((await s.exec(q)).all())


async def test_an_event_redelivered_from_a_dead_replica_does_not_take_a_job_back(bus_db, settings):
    bus, db = bus_db
    job = f"order-{uuid.uuid4()}"
    async with db.session() as s, s.begin():  # the row the gateway writes when it accepts the POST
        s.add(JobRow(id=job, bmc_ip=BMC, message="Queued"))

    async def publish(state: str, stage: str, percent: int) -> int:
        ack = await bus.publish_event(
            event(job, state, stage, percent), bus.subjects.evt("provision", f"job.{state}", job), entity=job
        )
        return int(ack.seq)

    # Replica A pulls the job's first event (the projector's own consumer) and dies before its ack.
    shape = PullConsumer(
        bus.js,
        bus.subjects.evt_stream,
        CONSUMER,
        bus.subjects.events_of("provision"),
        JobProgress,
        lambda *_: asyncio.sleep(0),
        ack_wait=ACK_WAIT,
    )
    await publish("queued", "Queued", 0)
    nc = await nats.connect(settings.nats_url)
    replica_a = await nc.jetstream().pull_subscribe(
        shape.subject, durable=CONSUMER, stream=shape.stream, config=shape.config()
    )
    held = await replica_a.fetch(1, timeout=10)
    assert [RawEnvelope.model_validate_json(m.data).data["state"] for m in held] == ["queued"]
    await nc.close()  # killed: no ack, no nak — JetStream hands it out again after ack_wait

    # The job goes on; replica B applies the later events at once, the first one ACK_WAIT later.
    await publish("mounting", "Mounting ISO", 30)
    last = await publish("booting", "Booting", 60)
    projector = ProvisionProjector(bus, db, ack_wait=ACK_WAIT)
    await projector.start()

    async def all_acked() -> bool:  # the redelivered event too: handled and acked
        info = await bus.js.consumer_info(shape.stream, CONSUMER)
        return info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq >= last

    try:
        await wait_until(all_acked, timeout=30, what="every event applied, the held one acked last")
    finally:
        await projector.stop()

    async with db.session() as s:
        row = await s.get(JobRow, job)
    assert row is not None
    assert (row.job_status, row.progress, row.message, row.event_seq) == ("booting", 60, "Booting", last)
    # The superseded "Queued" left no record after "Booting": the latest progress is the job's.
    assert [p.stage for p in await history(db, job)] == ["Mounting ISO", "Booting"]


async def test_after_the_stream_is_recreated_new_events_still_apply(bus_db):
    """A stream recreated empty (a lost NATS store) restarts its sequence: a new event has a lower
    sequence than the one shown but a later sending time, and is applied; a redelivery is not."""
    _bus, db = bus_db
    job, t0 = f"reset-{uuid.uuid4()}", datetime.now(UTC)
    async with db.session() as s, s.begin():
        s.add(JobRow(id=job, bmc_ip=BMC, message="Queued"))

    async def shown() -> tuple[str, int]:
        async with db.session() as s:
            row = await s.get(JobRow, job)
        assert row is not None
        return row.job_status, row.event_seq

    assert await apply_progress(db, f"{job}-m1", event(job, "mounting", "Mounting ISO", 30), 900, t0)
    assert not await apply_progress(
        db, "m0", event(job, "queued", "Queued", 0), 899, t0 - timedelta(seconds=1)
    )
    assert await shown() == ("mounting", 900)
    assert await apply_progress(
        db, f"{job}-m2", event(job, "booting", "Booting", 60), 3, t0 + timedelta(seconds=5)
    )
    assert await shown() == ("booting", 3)
    assert [p.stage for p in await history(db, job)] == ["Mounting ISO", "Booting"]
