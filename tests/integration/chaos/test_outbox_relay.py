"""The gateway's command outbox on the real NATS and PostgreSQL (issue 12 item 4, ADR 0002).

- two relays (two gateway replicas) racing over one table publish every command once;
- the reconcile never fails a job whose command still waits in the outbox;
- the delay the relay adds between the commit and JetStream's ack (LISTEN/NOTIFY wake-up).

Every publish is counted on a core NATS subscription to the command subject: it sees each
publish, including one JetStream would drop as a duplicate, so "once" here is stricter than the
``Nats-Msg-Id`` safety net.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import nats
import pytest
import sqlalchemy as sa

from karios.api_gateway.outbox import CommandOutbox, outbox_table, waiting_msg_ids
from karios.api_gateway.readmodel import JobRow, ProvisionProjector
from karios.common.bus.runtime import Bus
from karios.common.db import Database
from karios.common.errors import ServiceUnavailable
from tests.fixtures.outbox import Published, command, gateway_database
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
async def gateway_db(settings) -> AsyncIterator[Database]:
    async with gateway_database(settings) as db:
        yield db


async def _pending(db: Database, queue: str) -> int:
    async with db.session() as s:
        q = sa.select(sa.func.count()).select_from(outbox_table).where(outbox_table.c.queue == queue)
        return int((await s.exec(q)).one()[0])


async def _relays(settings, n: int) -> list[tuple[Bus, Database, CommandOutbox]]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        bus, db = Bus.from_settings(settings, f"gw-{i}"), Database(settings.database_url)
        await bus.start()
        out.append((bus, db, CommandOutbox(bus, db.engine)))
    return out


async def _stop(relays) -> None:  # type: ignore[no-untyped-def]
    for bus, db, outbox in relays:
        await outbox.stop()
        await bus.stop()
        await db.close()


@pytest.mark.timeout(180)
async def test_two_relays_racing_publish_each_command_once(settings, gateway_db):
    relays = await _relays(settings, 2)
    (bus, _, first), (_, _, second) = relays
    subject = bus.subjects.cmd("provision", "start")
    seen = Published()
    nc = await nats.connect(settings.nats_url)
    await nc.subscribe(subject, cb=seen.cb)
    await nc.flush()
    relayed: Counter[str] = Counter()
    for name, outbox in (("first", first), ("second", second)):
        outbox.on_relayed = lambda _cmd, name=name: _count(relayed, name)
    try:
        # A backlog both relays find at start (what a restart after an outage meets) ...
        backlog = [f"backlog-{uuid.uuid4()}" for _ in range(40)]
        async with gateway_db.session() as s, s.begin():
            for job in backlog:
                await first.add(s, command(job), subject, entity=job, msg_id=job)
        await asyncio.gather(first.start(), second.start())
        # ... then commands committed one by one while both run (each commit wakes both).
        live = [f"live-{uuid.uuid4()}" for _ in range(40)]
        for job in live:
            async with gateway_db.session() as s, s.begin():
                await (first if len(job) % 2 else second).add(
                    s, command(job), subject, entity=job, msg_id=job
                )
        every = backlog + live
        await wait_until(lambda: all(seen.ids[j] for j in every), timeout=60, what="every command published")
        await _drained(gateway_db, first.queue)
        await nc.flush()  # a late duplicate, if any, reaches the counter before the assertions
        dup = {j: c for j, c in seen.ids.items() if c != 1}
        assert not dup, f"published more than once: {dup}"
        assert sorted(seen.ids) == sorted(every)
        # on_relayed runs after the mark, off the relay's path
        await wait_until(lambda: sum(relayed.values()) >= len(every), timeout=10, what="every on_relayed")
        assert sum(relayed.values()) == len(every)
        print(f"relays racing: {len(every)} commands, each published once; split {dict(relayed)}")
    finally:
        await nc.close()
        await _stop(relays)


async def _count(counter: Counter[str], name: str) -> None:
    counter[name] += 1


async def _drained(db: Database, queue: str) -> None:
    async def empty() -> bool:
        return await _pending(db, queue) == 0

    await wait_until(empty, timeout=30, what="the outbox drained")


@pytest.mark.timeout(180)
async def test_relay_delay_after_commit_is_small(settings, gateway_db):
    """The delay the outbox adds to a command: from the commit to the publish seen on NATS."""
    relays = await _relays(settings, 1)
    (bus, _, outbox) = relays[0]
    subject = bus.subjects.cmd("provision", "start")
    seen = Published()
    nc = await nats.connect(settings.nats_url)
    await nc.subscribe(subject, cb=seen.cb)
    await nc.flush()
    await outbox.start()
    delays: list[float] = []
    try:
        for _ in range(40):
            job = f"lat-{uuid.uuid4()}"
            async with gateway_db.session() as s:
                async with s.begin():
                    await outbox.add(s, command(job), subject, entity=job, msg_id=job)
                committed = time.perf_counter()
            await wait_until(lambda job=job: job in seen.at, timeout=15, interval=0.002, what="the publish")
            delays.append((seen.at[job] - committed) * 1000)
        await _drained(gateway_db, outbox.queue)
    finally:
        await nc.close()
        await _stop(relays)
    delays.sort()
    p50, p95 = statistics.median(delays), delays[int(len(delays) * 0.95) - 1]
    # A measurement, not an assertion (the machine is shared): compare with the poller's 0.5-5 s.
    print(
        f"commit → publish seen: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {delays[-1]:.1f} ms, n={len(delays)}"
    )


async def _old_queued_job(db: Database, job_id: str) -> None:
    async with db.session() as s, s.begin():
        old = datetime.now(UTC) - timedelta(hours=1)
        s.add(JobRow(id=job_id, bmc_ip="10.96.0.2", message="Queued", created_at=old, updated_at=old))


async def test_the_reconcile_never_fails_a_job_whose_command_waits_in_the_outbox(settings, gateway_db):
    """A bus outage is not a loss: the command in the outbox will be relayed; once it is, the
    job's clock restarts (the relay touches ``updated_at``)."""
    (bus, _, outbox), *_ = relays = await _relays(settings, 1)
    waiting, unsent = f"waiting-{uuid.uuid4()}", f"unsent-{uuid.uuid4()}"
    projector = ProvisionProjector(bus, gateway_db, lost_after=60, waiting=waiting_msg_ids)
    try:
        await _old_queued_job(gateway_db, waiting)
        await _old_queued_job(gateway_db, unsent)
        async with gateway_db.session() as s, s.begin():
            await outbox.add(
                s, command(waiting), bus.subjects.cmd("provision", "start"), entity=waiting, msg_id=waiting
            )
        assert await projector.reconcile([waiting]) == []  # skipped: no provisioner is even asked
        with pytest.raises(ServiceUnavailable):  # the other one is a candidate: the provisioners are asked
            await projector.reconcile([unsent])
        before = datetime.now(UTC)
        await projector.relayed_many([command(waiting)])
        async with gateway_db.session() as s:
            assert (await s.get(JobRow, waiting)).updated_at >= before  # type: ignore[union-attr]
            assert (await s.get(JobRow, unsent)).updated_at < before  # type: ignore[union-attr]
    finally:
        await _stop(relays)
