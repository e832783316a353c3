"""Commit → JetStream latency of the command outbox during a burst (issue 28 item 2: p99 < 1 s).

For each relay count (default 1 and 2): that many relays run, each in its own process as a
gateway replica runs it — the gateway's own :class:`CommandOutbox` (LISTEN/NOTIFY wake-up, batches
claimed with SKIP LOCKED, published concurrently, marked in one statement) with its real
``on_relayed_many`` (the read model's touch of the relayed jobs' rows, one statement per batch).
Then a burst of N provisions is committed
as the route commits them — each its own transaction (job row + outbox row), from ``--writers``
concurrent writers, as fast as PostgreSQL takes them. Each command's latency runs from its commit
returning to its delivery by a JetStream consumer of the command stream (so it was stored); each
relay reports how many commands it published (their sum = the burst: no double sends).

Real NATS and PostgreSQL (``KARIOS_NATS_URL``, ``KARIOS_PG_ADMIN_URL``, default the local ones), a
database of its own, dropped afterwards; each run has its own subject prefix and streams, deleted too.

    uv run python benchmarks/outbox_relay.py --commands 1000 --relays 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import nats
import sqlalchemy as sa

import karios.api_gateway
from karios.api_gateway.outbox import CommandOutbox, outbox_table
from karios.api_gateway.readmodel import JobRow, ProvisionProjector
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.common.db import Database
from karios.common.db.migrate import upgrade
from karios.common.settings import KariosSettings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repo root: benchmarks.launch
from benchmarks.launch import scratch_database  # noqa: E402

MIGRATIONS = Path(karios.api_gateway.__file__).parent / "migrations"
LIMIT_S = 1.0  # issue 28 item 2: p99 commit → JetStream


def _settings(nats_url: str, database_url: str, prefix: str) -> KariosSettings:
    return KariosSettings(
        dev_mode=True, nats_url=nats_url, database_url=database_url, bus_prefix=prefix, log_json=False
    )


async def relay_child(nats_url: str, database_url: str, prefix: str, name: str) -> None:
    """One relay (a gateway replica's), until SIGTERM; prints ``ready`` once it LISTENs."""
    settings = _settings(nats_url, database_url, prefix)
    bus, db = Bus.from_settings(settings, name), Database(settings.database_url)
    await bus.start()
    projector = ProvisionProjector(bus, db, lost_after=600)
    outbox = CommandOutbox(bus, db.engine, on_relayed_many=projector.relayed_many)  # as the gateway's app
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await outbox.start()
    while not outbox.listening:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    cpu0 = time.process_time()
    await stop.wait()
    await outbox.stop()
    relayed = int(outbox.m_relayed.labels(StartProvision.TYPE)._value.get())
    print(f"relayed {relayed} {time.process_time() - cpu0:.3f}", flush=True)
    await bus.stop()
    await db.close()


async def _spawn(n: int, nats_url: str, database_url: str, prefix: str) -> list[asyncio.subprocess.Process]:
    procs = []
    for i in range(n):
        args = ["--child", nats_url, database_url, prefix, f"relay-{i}"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        if line.strip() != b"ready":
            raise RuntimeError(f"a relay did not start: {line!r}")
    return procs


def _uptime() -> str:
    with contextlib.suppress(OSError):
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def _pct(sorted_ms: list[float], p: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, max(0, round(p / 100 * len(sorted_ms)) - 1))]


async def one_run(
    nats_url: str,
    database_url: str,
    commands: int,
    relays: int,
    writers: int,
    one_commit: bool,
) -> dict:
    prefix = f"obench{uuid.uuid4().hex[:8]}"
    settings = _settings(nats_url, database_url, prefix)
    bus, db = Bus.from_settings(settings, "gw-bench"), Database(settings.database_url, pool_size=writers)
    await bus.start()  # declares the streams
    subject = bus.subjects.cmd("provision", "start")
    writer = CommandOutbox(bus, db.engine)  # add() only: the relays are the child processes
    jobs = [f"{prefix}-{i}" for i in range(commands)]
    committed: dict[str, float] = {}
    stored: dict[str, float] = {}
    in_stream: Counter[str] = Counter()
    relayed: list[int] = []
    cpu_s: list[float] = []  # each relay's CPU time from ready to stop
    done = asyncio.Event()

    async def on_stored(msg) -> None:  # type: ignore[no-untyped-def]
        mid = (msg.headers or {}).get("Nats-Msg-Id", "")
        stored.setdefault(mid, time.perf_counter())
        in_stream[mid] += 1
        if len(stored) >= commands:
            done.set()

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.subscribe(subject, cb=on_stored, stream=bus.subjects.cmd_stream)  # explicit ack (work queue)
    await nc.flush()
    procs = await _spawn(relays, nats_url, database_url, prefix)
    spec = ProvisionSpec(bmc_ip="10.96.0.1", vendor="dell", hostname="n")
    queue: asyncio.Queue[str] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)

    async def write_all_at_once() -> None:  # every command visible at the same instant: the worst case
        async with db.session() as s:
            async with s.begin():
                for job in jobs:
                    s.add(JobRow(id=job, bmc_ip="10.96.0.1", message="Queued"))
                    cmd = StartProvision(job_id=job, spec=spec)
                    await writer.add(s, cmd, subject, entity=job, msg_id=job)
            committed.update(dict.fromkeys(jobs, time.perf_counter()))

    async def write() -> None:
        while not queue.empty():
            job = queue.get_nowait()
            async with db.session() as s:
                async with s.begin():
                    s.add(JobRow(id=job, bmc_ip="10.96.0.1", message="Queued"))
                    await writer.add(
                        s, StartProvision(job_id=job, spec=spec), subject, entity=job, msg_id=job
                    )
                committed[job] = time.perf_counter()

    load = os.getloadavg()
    try:
        t0 = time.perf_counter()
        if one_commit:
            await write_all_at_once()
        else:
            await asyncio.gather(*(write() for _ in range(writers)))
        burst_s = time.perf_counter() - t0
        await asyncio.wait_for(done.wait(), timeout=300)
        all_s = time.perf_counter() - t0
        while True:  # every row marked sent
            async with db.session() as s:
                q = (
                    sa.select(sa.func.count())
                    .select_from(outbox_table)
                    .where(outbox_table.c.queue == writer.queue)
                )
                if int((await s.exec(q)).one()[0]) == 0:
                    break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a late duplicate, if any, reaches the counters
        ms = sorted((stored[j] - committed[j]) * 1000 for j in jobs)
        return {
            "load": load,
            "burst_s": burst_s,
            "all_s": all_s,
            "p50": _pct(ms, 50),
            "p95": _pct(ms, 95),
            "p99": _pct(ms, 99),
            "max": ms[-1],
            "mean": statistics.fmean(ms),
            "relayed": relayed,
            "cpu_s": cpu_s,
            "stored_once": sum(1 for j in jobs if in_stream[j] == 1),
        }
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), timeout=15)
                for line in out.decode().splitlines():
                    if line.startswith("relayed"):
                        relayed.append(int(line.split()[1]))
                        cpu_s.append(float(line.split()[2]))
            except TimeoutError:
                proc.kill()
        await nc.close()
        async with db.session() as s, s.begin():
            await s.exec(sa.delete(JobRow).where(JobRow.id.in_(jobs)))  # type: ignore[attr-defined]
        await db.close()
        for stream in (bus.subjects.cmd_stream, bus.subjects.evt_stream, bus.subjects.dlq_stream):
            with contextlib.suppress(Exception):  # best effort: a stream never created
                await bus.js.delete_stream(stream)
        await bus.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--relays", default="1,2")
    ap.add_argument("--writers", type=int, default=32, help="concurrent transactions committing the burst")
    args = ap.parse_args()
    admin_url = os.environ.get("KARIOS_PG_ADMIN_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    nats_url = os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
    async with scratch_database(admin_url, "karios_bench_outbox") as (_, url):
        await asyncio.to_thread(upgrade, MIGRATIONS, url, "gateway")
        print(
            f"\noutbox relay: a burst of {args.commands} commands, commit → stored in JetStream "
            f"(limit p99 < {LIMIT_S:.0f} s); uptime: {_uptime()}"
        )
        print(
            "| relays | commits | load (1 min) | burst committed in (s) | all in JetStream (s) "
            "| p50 (ms) | p95 (ms) | p99 (ms) | max (ms) | p99 / 1 s | publishes (per relay) "
            "| in stream once | relay CPU / command |"
        )
        print(
            "| -----: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        )
        n = args.commands
        scenarios = [(False, f"{n} × 1 ({args.writers} writers)"), (True, f"1 × {n} (one transaction)")]
        for relays in (int(x) for x in args.relays.split(",")):
            for one_commit, label in scenarios:
                r = await one_run(nats_url, url, n, relays, args.writers, one_commit)
                _row(relays, label, r, n)


def _row(relays: int, label: str, r: dict, n: int) -> None:
    print(
        f"| {relays} | {label} | {r['load'][0]:.1f} | {r['burst_s']:.2f} | {r['all_s']:.2f} | {r['p50']:.1f} "
        f"| {r['p95']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['p99'] / 1000 / LIMIT_S:.3f} "
        f"| {' + '.join(map(str, r['relayed']))} = {sum(r['relayed'])} | {r['stored_once']}/{n} "
        f"| {sum(r['cpu_s']) / n * 1000:.2f} ms |",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        asyncio.run(relay_child(*sys.argv[2:6]))
    else:
        asyncio.run(main())
