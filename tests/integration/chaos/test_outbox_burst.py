"""The outbox relay under a burst and its faults (issue 28 item 2, ADR 0002), on the real NATS and
PostgreSQL.

- a burst of commands, each committed in its own transaction while two relays run: every command
  is stored in JetStream once and published once (claims with SKIP LOCKED: no double sends);
- the insert's NOTIFY wakes the relay: with a 30 s poll, a command is on the bus within
  milliseconds of its commit; with LISTEN unavailable, the poll still relays;
- a relay SIGKILLed between its publish and its mark: the next relay re-publishes after the lease
  and JetStream drops the copy (``Nats-Msg-Id``): one message in the stream, one delivery;
- a dead bus: the round is rescheduled (one UPDATE) and relayed when its retry comes due; a row the
  service cannot read goes to the DLQ table.

"Published" counts every publish on a core NATS subscription to the subject (it sees a copy
JetStream drops); "stored" counts deliveries by a JetStream consumer of the command stream.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
import sqlalchemy as sa

from karios.api_gateway.outbox import CommandOutbox, RelayConfig, dlq_table, outbox_table
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import StartProvision
from karios.common.db import Database
from karios.common.outbox import MSG_ID_HEADER, OutboxRow
from tests.fixtures.outbox import Published, command, gateway_database
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration
#: The backstop poll in these tests: anything relayed sooner was woken by NOTIFY.
POLL_S = 30.0

#: A gateway relay in its own process that SIGKILLs itself after JetStream acked its round and
#: before the round is marked sent (``before_mark``).
DOOMED_RELAY = r"""
import asyncio, os, signal, sys
from karios.api_gateway.outbox import CommandOutbox
from karios.common.bus.runtime import Bus
from karios.common.db import Database
from karios.common.settings import KariosSettings

async def main():
    nats_url, database_url, prefix = sys.argv[1:4]
    s = KariosSettings(dev_mode=True, nats_url=nats_url, database_url=database_url, bus_prefix=prefix)
    bus, db = Bus.from_settings(s, "doomed"), Database(s.database_url)
    await bus.start()
    outbox = CommandOutbox(bus, db.engine, before_mark=lambda: os.kill(os.getpid(), signal.SIGKILL))
    await outbox.start()
    while not (outbox.listening and outbox.idle_waits):
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
async def gateway_db(settings) -> AsyncIterator[Database]:
    async with gateway_database(settings, pool_size=16) as db:
        yield db


@pytest.fixture
async def bus(settings) -> AsyncIterator[Bus]:
    """The test's own bus (declares the streams); relays get their own."""
    b = Bus.from_settings(settings, "test")
    await b.start()
    yield b
    await b.stop()


@pytest.fixture
async def watch(settings, bus) -> AsyncIterator[tuple[Published, Published]]:
    """(published: core subscription, stored: JetStream consumer) on ``cmd.provision.start``."""
    published, stored = Published(), Published()
    subject = bus.subjects.cmd("provision", "start")
    nc = await nats.connect(settings.nats_url)
    await nc.subscribe(subject, cb=published.cb)
    await nc.jetstream().subscribe(subject, cb=stored.cb, stream=bus.subjects.cmd_stream)
    await nc.flush()
    yield published, stored
    await nc.close()


class Relays:
    """Gateway relays in this process, each with its own bus and database connections."""

    def __init__(self, settings) -> None:  # type: ignore[no-untyped-def]
        self.settings = settings
        self.running: list[tuple[Bus, Database, CommandOutbox]] = []

    async def start(self, config: RelayConfig, *, connected: bool = True) -> CommandOutbox:
        bus = Bus.from_settings(self.settings, f"gw-{len(self.running)}")
        if connected:
            await bus.start()
        db = Database(self.settings.database_url)
        outbox = CommandOutbox(bus, db.engine, config=config)
        self.running.append((bus, db, outbox))
        await outbox.start()
        await wait_until(lambda: outbox.idle_waits > 0, timeout=30, what="the relay idle")
        return outbox

    async def stop(self) -> None:
        for bus, db, outbox in self.running:
            await outbox.stop()
            await bus.stop()
            await db.close()
        self.running.clear()


@pytest.fixture
async def relays(settings) -> AsyncIterator[Relays]:
    r = Relays(settings)
    yield r
    await r.stop()


async def _commit(db: Database, outbox: CommandOutbox, subject: str, jobs: list[str]) -> float:
    """``jobs``' commands in ONE transaction; the time its commit returned."""
    async with db.session() as s:
        async with s.begin():
            for job in jobs:
                await outbox.add(s, command(job), subject, entity=job, msg_id=job)
        return time.perf_counter()


async def _rows(db: Database, where: sa.ColumnElement[bool] | None = None) -> list[sa.Row]:
    async with db.session() as s:
        q = sa.select(outbox_table)
        return list((await s.exec(q if where is None else q.where(where))).all())  # type: ignore[call-overload]


async def _drained(db: Database) -> None:
    async def empty() -> bool:
        return not await _rows(db)

    await wait_until(empty, timeout=30, what="the outbox drained")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


@pytest.mark.timeout(180)
async def test_a_burst_reaches_jetstream_exactly_once_with_two_relays(
    settings, gateway_db, bus, watch, relays
):
    published, stored = watch
    config = RelayConfig(poll_s=POLL_S)
    first, second = await relays.start(config), await relays.start(config)
    subject = bus.subjects.cmd("provision", "start")
    jobs = [f"burst-{i}-{uuid.uuid4().hex[:8]}" for i in range(400)]
    committed: dict[str, float] = {}
    todo = list(jobs)

    async def writer() -> None:  # each command its own transaction, as the route commits it
        while todo:
            job = todo.pop()
            committed[job] = await _commit(gateway_db, first, subject, [job])

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(16)))
    burst_s = time.perf_counter() - t0
    # Well inside the 30 s poll: only NOTIFY can have woken the relays.
    await wait_until(lambda: all(j in stored.at for j in jobs), timeout=25, what="every command stored")
    await _drained(gateway_db)
    await wait_until(lambda: sum(published.ids.values()) >= len(jobs), timeout=5, what="the publishes seen")
    assert {j: c for j, c in published.ids.items() if c != 1} == {}, "a command was published twice"
    assert {j: c for j, c in stored.ids.items() if c != 1} == {}, "a command was stored twice"
    assert sorted(stored.ids) == sorted(jobs)
    split = [int(o.m_relayed.labels(StartProvision.TYPE)._value.get()) for o in (first, second)]
    assert sum(split) == len(jobs)
    ms = [(stored.at[j] - committed[j]) * 1000 for j in jobs]
    # A measurement (the machine is shared): issue 28's limit is p99 < 1 s.
    print(
        f"burst of {len(jobs)} (committed in {burst_s:.2f} s, 16 writers), 2 relays {split}: commit → "
        f"stored p50 {statistics.median(ms):.1f} ms, p99 {_pct(ms, 99):.1f} ms, max {max(ms):.1f} ms"
    )


@pytest.mark.timeout(120)
async def test_notify_wakes_the_relay_long_before_the_poll(gateway_db, bus, watch, relays):
    published, _ = watch
    outbox = await relays.start(RelayConfig(poll_s=POLL_S))
    assert outbox.listening
    subject = bus.subjects.cmd("provision", "start")
    delays = []
    idle = outbox.idle_waits  # asleep: only a NOTIFY (or the 30 s poll) wakes it
    for i in range(10):
        job = f"wake-{i}-{uuid.uuid4().hex[:8]}"
        committed = await _commit(gateway_db, outbox, subject, [job])
        await wait_until(lambda job=job: job in published.at, timeout=10, interval=0.002, what="the publish")
        delays.append(published.at[job] - committed)
        await wait_until(lambda idle=idle: outbox.idle_waits > idle, what="the relay asleep again")
        idle = outbox.idle_waits
    assert max(delays) < 5.0, delays  # the poll would have taken up to 30 s
    p50, top = statistics.median(delays) * 1000, max(delays) * 1000
    print(f"NOTIFY wake-up, commit → on the bus: p50 {p50:.1f} ms, max {top:.1f} ms (poll: {POLL_S:.0f} s)")


@pytest.mark.timeout(120)
async def test_without_listen_the_poll_still_relays(gateway_db, bus, watch, relays, monkeypatch):
    published, _ = watch

    async def no_listen(self) -> None:  # type: ignore[no-untyped-def]
        return None

    monkeypatch.setattr(CommandOutbox, "_open_listen", no_listen)
    outbox = await relays.start(RelayConfig(poll_s=POLL_S, poll_without_listen_s=0.2))
    assert not outbox.listening
    job = f"polled-{uuid.uuid4().hex[:8]}"
    await _commit(gateway_db, outbox, bus.subjects.cmd("provision", "start"), [job])
    await wait_until(lambda: published.ids[job] == 1, timeout=10, what="the polled publish")
    await _drained(gateway_db)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_relay_killed_between_publish_and_mark_delivers_once(
    settings, gateway_db, bus, watch, relays
):
    published, _ = watch
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DOOMED_RELAY,
        settings.nats_url,
        settings.database_url,
        settings.bus_prefix,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert doomed.stdout is not None
        line = await asyncio.wait_for(doomed.stdout.readline(), timeout=60)
        assert line.strip() == b"ready", line
        subject = bus.subjects.cmd("provision", "start")
        jobs = [f"killed-{i}-{uuid.uuid4().hex[:8]}" for i in range(5)]
        writer = CommandOutbox(bus, gateway_db.engine)  # add() only
        await _commit(gateway_db, writer, subject, jobs)
        assert await asyncio.wait_for(doomed.wait(), timeout=30) == -9  # killed between publish and mark
    finally:
        if doomed.returncode is None:
            doomed.kill()
            await doomed.wait()
    await wait_until(lambda: all(published.ids[j] == 1 for j in jobs), timeout=10, what="the first publishes")
    left = await _rows(gateway_db)
    assert len(left) == len(jobs) and all(r.acquired_token is not None for r in left), "published, not marked"
    stream = bus.subjects.cmd_stream

    # The next relay claims the rows once their lease ran out and publishes them again ...
    await relays.start(RelayConfig(poll_s=0.2, lease_s=1.0))
    await _drained(gateway_db)
    assert all(published.ids[j] == 2 for j in jobs), published.ids  # really re-published ...
    # ... and JetStream dropped every copy: one message each in the stream, one delivery each.
    _, stored = watch
    await wait_until(lambda: all(stored.ids[j] for j in jobs), timeout=10, what="the deliveries")
    info = await bus.js.stream_info(stream)
    assert info.state.last_seq == len(jobs), "the stream stored a copy"  # this test's own stream
    assert {j: stored.ids[j] for j in jobs} == dict.fromkeys(jobs, 1)


@pytest.mark.timeout(120)
async def test_a_dead_bus_reschedules_the_round_and_an_unreadable_row_is_dead_lettered(
    gateway_db, bus, watch, relays
):
    published, _ = watch
    subject = bus.subjects.cmd("provision", "start")
    down = await relays.start(RelayConfig(poll_s=POLL_S), connected=False)
    jobs = [f"wait-{i}-{uuid.uuid4().hex[:8]}" for i in range(3)]
    bad = OutboxRow(type="karios.nope.v1", subject=subject, msg_id="bad", data={})
    async with gateway_db.session() as s, s.begin():
        for job in jobs:
            await down.add(s, command(job), subject, entity=job, msg_id=job)
        await down.client.insert(
            s, queue=down.queue, payload=bad.model_dump_json().encode(), headers={MSG_ID_HEADER: "bad"}
        )

    async def rescheduled() -> bool:
        rows = await _rows(gateway_db)
        return len(rows) == len(jobs) and all(
            r.attempts_count >= 1 and r.acquired_token is None for r in rows
        )

    await wait_until(rescheduled, timeout=10, what="the round rescheduled")
    assert down.m_waits._value.get() >= len(jobs)
    async with gateway_db.session() as s:
        dead = (await s.exec(sa.select(dlq_table))).all()  # type: ignore[call-overload]
    assert [(d.failure_reason, d.last_exception) for d in dead] == [("retry_terminal", "ValueError")]
    await relays.stop()
    # A relay on a live bus: the rows come due after their backoff (≤ 5 s), not after the 30 s poll.
    await relays.start(RelayConfig(poll_s=POLL_S))
    await wait_until(lambda: all(published.ids[j] == 1 for j in jobs), timeout=15, what="relayed once due")
    await _drained(gateway_db)
