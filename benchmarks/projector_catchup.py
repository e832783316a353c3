"""How fast the gateway's read model catches up on a backlog of provision events.

A backlog builds whenever the projector stops while jobs run: a gateway restart or upgrade, a
PostgreSQL failover, a storm of thousands of jobs (~5 events each). Until it is projected,
``GET /controlnode/job/{id}`` and the progress routes show stale states. This publishes N events
(N/5 jobs × queued … booting) to the real event stream with no projector running, then starts
the gateway's :class:`ProvisionProjector` on a database of its own and times it to the last
event applied — twice: as it runs (``apply_many``: a fetch of up to 50 events in one
transaction) and one transaction per event (``apply_progress`` behind a one-by-one consumer, how
the projector ran before). Both must leave the same rows; the table prints events/s, CPU per
event of this process (projector + client) and of PostgreSQL's backends, and the ratio.

    uv run python benchmarks/projector_catchup.py [--events 10000]

Real NATS and PostgreSQL (``KARIOS_NATS_URL``, ``KARIOS_PG_ADMIN_URL``, default the local ones);
a database and a subject prefix of its own for each mode, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from pathlib import Path

import psutil
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import karios.api_gateway
from karios.api_gateway.readmodel import CONSUMER, JobRow, ProvisionProjector, apply_progress
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import JobProgress
from karios.common.db import Database
from karios.common.db.migrate import upgrade
from karios.common.settings import KariosSettings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repo root: benchmarks.launch
from benchmarks.launch import cpu_seconds, scratch_database  # noqa: E402

MIGRATIONS = Path(karios.api_gateway.__file__).parent / "migrations"
STAGES = [("queued", "Queued", 0), ("building_media", "Building ISO", 10), ("mounting", "Mounting ISO", 30)]
STAGES += [("booting", "Booting", 60), ("installing", "Installing OS", 80)]


class OneByOne(ProvisionProjector):
    """The projector as it ran before: one transaction per event (same rules, same consumer)."""

    async def start(self) -> None:
        async def one(ev: JobProgress, env) -> None:  # type: ignore[no-untyped-def]
            await apply_progress(self.db, env.id, ev, env.stream_seq, env.time)

        self._consumers.append(
            await self.bus.pull_events(CONSUMER, self.bus.subjects.events_of("provision"), JobProgress, one)
        )


def _backends(admin_pid_of: dict[int, psutil.Process], dbname: str) -> list[psutil.Process]:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "postgres:" in cmd and f" {dbname} " in f" {cmd} ":
            admin_pid_of.setdefault(p.pid, p)
    return list(admin_pid_of.values())


async def one_mode(admin_url: str, nats_url: str, events: int, batched: bool) -> dict:
    async with scratch_database(admin_url, "karios_bench_proj") as (dbname, url):
        settings = KariosSettings(
            dev_mode=True, nats_url=nats_url, database_url=url, bus_prefix=f"pbench{uuid.uuid4().hex[:8]}"
        )
        bus, db = Bus.from_settings(settings, "gw-bench"), Database(url)
        try:
            await asyncio.to_thread(upgrade, MIGRATIONS, url, "gateway")
            await bus.start()
            jobs = events // len(STAGES)
            async with db.session() as s, s.begin():  # the rows the POSTs wrote
                for j in range(jobs):
                    s.add(JobRow(id=f"job-{j}", bmc_ip=f"10.{j // 65536}.{j // 256 % 256}.{j % 256}"))
            sends = []
            for k, (state, stage, pct) in enumerate(STAGES):  # a storm's order: every job's stage k, then k+1
                for j in range(jobs):
                    ev = JobProgress(
                        job_id=f"job-{j}",
                        bmc_ip="",
                        job_type="provision",
                        state=state,
                        status="running",
                        stage=stage,
                        percent=pct,
                        message=f"{stage} ({k})",
                    )
                    sends.append(
                        bus.publish_event(ev, bus.subjects.evt("provision", f"job.{state}", ev.job_id))
                    )
                    if len(sends) >= 500:
                        await asyncio.gather(*sends)
                        sends = []
            await asyncio.gather(*sends)
            seen: dict[int, psutil.Process] = {}
            _backends(seen, dbname)
            me = psutil.Process()
            pg0, me0 = cpu_seconds(_backends(seen, dbname)), cpu_seconds([me])
            projector = (ProvisionProjector if batched else OneByOne)(bus, db, reconcile_every=3600)
            t0 = time.monotonic()
            await projector.start()
            count = sa.text("SELECT count(*) FROM gateway.provision_progresses")
            engine = create_async_engine(url)
            try:
                while True:
                    await asyncio.sleep(0.2)
                    _backends(seen, dbname)
                    async with engine.connect() as c:
                        done = (await c.execute(count)).scalar_one()
                    if done >= jobs * len(STAGES):
                        break
                wall = time.monotonic() - t0
                pg, mine = cpu_seconds(_backends(seen, dbname)) - pg0, cpu_seconds([me]) - me0
                async with engine.connect() as c:
                    shown = (
                        await c.execute(sa.text("SELECT job_status, count(*) FROM gateway.jobs GROUP BY 1"))
                    ).all()
            finally:
                await engine.dispose()
                await projector.stop()
            return {"wall": wall, "pg": pg, "me": mine, "n": jobs * len(STAGES), "shown": dict(shown)}
        finally:
            with contextlib.suppress(Exception):
                for stream in (bus.subjects.cmd_stream, bus.subjects.evt_stream, bus.subjects.dlq_stream):
                    await bus.js.delete_stream(stream)
            await bus.stop()
            await db.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10000)
    a = ap.parse_args()
    admin_url = os.environ.get("KARIOS_PG_ADMIN_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    nats_url = os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
    results = {}
    for batched in (False, True):
        results[batched] = await one_mode(admin_url, nats_url, a.events, batched)
    print(
        f"\nread model catch-up: a backlog of {results[True]['n']} provision events, "
        f"{psutil.cpu_count()} CPUs\n"
    )
    print("| projector | wall s | events/s | CPU ms per event: projector | PostgreSQL | job rows shown |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for batched, label in (
        (False, "one transaction per event (before)"),
        (True, "one per fetch (apply_many)"),
    ):
        r = results[batched]
        print(
            f"| {label} | {r['wall']:.1f} | {r['n'] / r['wall']:.0f} | {r['me'] / r['n'] * 1000:.2f} "
            f"| {r['pg'] / r['n'] * 1000:.2f} | {r['shown']} |"
        )
    one, many = results[False], results[True]
    print(f"\nspeed-up (events/s, one per fetch ÷ one per event): {one['wall'] / many['wall']:.1f}x")
    assert one["shown"] == many["shown"], "the two projections must leave the same job states"


if __name__ == "__main__":
    asyncio.run(main())
