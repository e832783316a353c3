"""How fast the gateway's command outbox drains a backlog (issue 14: the slowest stage of the
1,000-host storm was "202 → command in JetStream", p50 25 s).

For each worker count: N ``cmd.provision.start`` rows are committed in one transaction (what a
batch of POSTs leaves when they arrive faster than the relay), then one relay — the gateway's
own :class:`CommandOutbox` with its real ``on_relayed`` (the read model's touch of the job row) —
is started and timed until every command was seen on NATS and the table is empty. Real NATS and
PostgreSQL (``KARIOS_NATS_URL``, ``KARIOS_PG_ADMIN_URL``, default the local ones) in a database
of its own, dropped afterwards; each run has its own subject prefix and streams, deleted too.

    uv run python benchmarks/outbox_relay.py --rows 1000 --workers 1,4,8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from pathlib import Path

import nats
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import karios.api_gateway
from karios.api_gateway.outbox import CommandOutbox, outbox_table
from karios.api_gateway.readmodel import JobRow, ProvisionProjector
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.common.db import Database
from karios.common.db.migrate import upgrade
from karios.common.settings import KariosSettings

MIGRATIONS = Path(karios.api_gateway.__file__).parent / "migrations"


async def one_run(base: KariosSettings, rows: int, workers: int) -> dict[str, float]:
    prefix = f"obench{uuid.uuid4().hex[:8]}"
    settings = base.model_copy(update={"bus_prefix": prefix})
    bus, db = Bus.from_settings(settings, "gw-bench"), Database(settings.database_url)
    await bus.start()
    projector = ProvisionProjector(bus, db, lost_after=600)
    outbox = CommandOutbox(bus, db.engine, on_relayed=projector.relayed, workers=workers)
    subject = bus.subjects.cmd("provision", "start")
    seen: set[str] = set()
    done = asyncio.Event()
    jobs = [f"{prefix}-{i}" for i in range(rows)]

    async def cb(msg) -> None:  # type: ignore[no-untyped-def]
        seen.add((msg.headers or {}).get("Nats-Msg-Id", ""))
        if len(seen) >= rows:
            done.set()

    nc = await nats.connect(settings.nats_url)
    await nc.subscribe(subject, cb=cb)
    await nc.flush()
    try:
        async with db.session() as s, s.begin():
            for job in jobs:
                s.add(JobRow(id=job, bmc_ip="10.96.0.1", message="Queued"))
                spec = ProvisionSpec(bmc_ip="10.96.0.1", vendor="dell", hostname="n")
                cmd = StartProvision(job_id=job, spec=spec)
                await outbox.add(s, cmd, subject, entity=job, msg_id=job)
        t0 = time.perf_counter()
        await outbox.start()
        await asyncio.wait_for(done.wait(), timeout=600)
        published = time.perf_counter() - t0
        while True:
            async with db.session() as s:
                q = sa.select(sa.func.count()).select_from(outbox_table)
                q = q.where(outbox_table.c.queue == outbox.queue)
                if int((await s.exec(q)).one()[0]) == 0:
                    break
            await asyncio.sleep(0.05)
        drained = time.perf_counter() - t0
        return {"published": published, "drained": drained, "rate": rows / published}
    finally:
        await outbox.stop()
        await nc.close()
        async with db.session() as s, s.begin():
            await s.exec(sa.delete(JobRow).where(JobRow.id.in_(jobs)))  # type: ignore[attr-defined]
        await db.close()
        js = bus.nc.jetstream() if getattr(bus, "nc", None) else None
        if js is not None:
            for stream in await js.streams_info():
                if stream.config.name.lower().startswith(prefix.lower()):
                    await js.delete_stream(stream.config.name)
        await bus.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--workers", default="1,4,8")
    args = ap.parse_args()
    admin_url = os.environ.get("KARIOS_PG_ADMIN_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    name = f"karios_bench_outbox_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as c:
        await c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    base = KariosSettings(
        dev_mode=True,
        nats_url=os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222"),
        database_url=url,
        log_json=False,
    )
    try:
        await asyncio.to_thread(upgrade, MIGRATIONS, base.database_url, "gateway")
        print(f"\noutbox backlog of {args.rows} commands, one relay (load average {os.getloadavg()[0]:.1f})")
        print("| workers | all published (s) | table empty (s) | commands/s |")
        print(f"| {'-' * 6}: | {'-' * 16}: | {'-' * 14}: | {'-' * 9}: |")
        for w in (int(x) for x in args.workers.split(",")):
            r = await one_run(base, args.rows, w)
            print(f"| {w:>7} | {r['published']:>17.2f} | {r['drained']:>15.2f} | {r['rate']:>10.0f} |")
    finally:
        async with admin.connect() as c:
            await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


if __name__ == "__main__":
    asyncio.run(main())
