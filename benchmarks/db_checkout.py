"""What a pool checkout costs: SQLAlchemy's pre-ping against the closed-connection check.

Every service runs its transactions through :class:`karios.common.db.Database`. Its pool used
``pool_pre_ping``: asyncpg's ping is ``BEGIN; ; ROLLBACK;`` (three round trips, for pgbouncer's
transaction mode) before every transaction. Now a checkout asks asyncpg whether the server closed
the connection (no round trip). This runs the same short transactions both ways on the real
PostgreSQL — C tasks at once, each N transactions of one prepared statement, the pool's default
size — and prints transactions/s, CPU per transaction of this process and of the PostgreSQL
backends, and the simple-protocol statements sent per transaction (asyncpg's query logger).

    uv run python benchmarks/db_checkout.py [--tasks 40] [--transactions 50]

``KARIOS_PG_ADMIN_URL`` (default the local PostgreSQL); a database of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import psutil
import sqlalchemy as sa
from sqlalchemy import event

from karios.common.db import Database
from karios.common.db import session as db_session

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repo root: benchmarks.launch
from benchmarks.launch import cpu_seconds, scratch_database  # noqa: E402

ADMIN_URL = os.environ.get("KARIOS_PG_ADMIN_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
STATEMENT = sa.text("SELECT count(*) FROM pg_class WHERE relkind = 'r'")


async def run(url: str, mode: str, tasks: int, transactions: int) -> dict[str, float]:
    db = Database(url, pool_size=12)
    if mode == "pre-ping":  # how the pool ran before: SQLAlchemy's ping on every checkout
        event.remove(db.engine.sync_engine.pool, "checkout", db_session._replace_closed)
        db.engine.sync_engine.pool._pre_ping = True
    sent: list[str] = []
    backends: list[psutil.Process] = []

    @event.listens_for(db.engine.sync_engine, "connect")
    def _log(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.driver_connection.add_query_logger(lambda r: sent.append(r.query))
        backends.append(psutil.Process(dbapi_connection.driver_connection.get_server_pid()))

    async def one() -> None:
        for _ in range(transactions):
            async with db.session() as s, s.begin():
                await s.execute(STATEMENT)

    await asyncio.gather(*(one() for _ in range(min(tasks, 12))))  # warm: the pool's connections exist
    sent.clear()
    me = psutil.Process()
    c0, b0, w0 = sum(me.cpu_times()[:2]), cpu_seconds(backends), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(tasks)))
    wall = time.perf_counter() - w0
    cpu, server = sum(me.cpu_times()[:2]) - c0, cpu_seconds(backends) - b0
    await db.close()
    n = tasks * transactions
    return {
        "tps": n / wall,
        "client_ms": cpu / n * 1000,
        "server_ms": server / n * 1000,
        "statements": len(sent) / n,
        "wall": wall,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--transactions", type=int, default=50)
    args = ap.parse_args()
    async with scratch_database(ADMIN_URL, "karios_bench_checkout") as (_, url):
        results = {
            mode: await run(url, mode, args.tasks, args.transactions) for mode in ("pre-ping", "closed check")
        }
    n = args.tasks * args.transactions
    cpus = psutil.cpu_count()
    print(f"\n{n} transactions ({args.tasks} tasks × {args.transactions}), pool of 12, {cpus} CPUs\n")
    print(
        "| checkout | wall s | transactions/s | CPU ms per transaction: client | PostgreSQL "
        "| simple statements per transaction |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['wall']:.2f} | {r['tps']:,.0f} | {r['client_ms']:.3f} | {r['server_ms']:.3f} "
            f"| {r['statements']:.1f} |"
        )
    before, after = results["pre-ping"], results["closed check"]
    client, server = before["client_ms"] / after["client_ms"], before["server_ms"] / after["server_ms"]
    print(
        f"\nratio (pre-ping / closed check): CPU per transaction, client {client:.2f}x, PostgreSQL "
        f"{server:.2f}x; transactions/s {after['tps'] / before['tps']:.2f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
