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
import time
import uuid

import psutil
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from karios.common.db import Database
from karios.common.db import session as db_session

ADMIN_URL = os.environ.get("KARIOS_PG_ADMIN_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
STATEMENT = sa.text("SELECT count(*) FROM pg_class WHERE relkind = 'r'")


def _backend_cpu(pids: set[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def run(url: str, mode: str, tasks: int, transactions: int) -> dict[str, float]:
    db = Database(url, pool_size=12)
    if mode == "pre-ping":  # how the pool ran before: SQLAlchemy's ping on every checkout
        event.remove(db.engine.sync_engine.pool, "checkout", db_session._replace_closed)
        db.engine.sync_engine.pool._pre_ping = True
    sent: list[str] = []
    pids: set[int] = set()

    @event.listens_for(db.engine.sync_engine, "connect")
    def _log(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.driver_connection.add_query_logger(lambda r: sent.append(r.query))
        pids.add(dbapi_connection.driver_connection.get_server_pid())

    async def one() -> None:
        for _ in range(transactions):
            async with db.session() as s, s.begin():
                await s.execute(STATEMENT)

    await asyncio.gather(*(one() for _ in range(min(tasks, 12))))  # warm: the pool's connections exist
    sent.clear()
    me = psutil.Process()
    c0, b0, w0 = sum(me.cpu_times()[:2]), _backend_cpu(pids), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(tasks)))
    wall = time.perf_counter() - w0
    cpu, backends = sum(me.cpu_times()[:2]) - c0, _backend_cpu(pids) - b0
    await db.close()
    n = tasks * transactions
    return {
        "tps": n / wall,
        "client_ms": cpu / n * 1000,
        "server_ms": backends / n * 1000,
        "statements": len(sent) / n,
        "wall": wall,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--transactions", type=int, default=50)
    args = ap.parse_args()
    name = f"karios_bench_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    async with admin.connect() as c:
        await c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        results = {
            mode: await run(url, mode, args.tasks, args.transactions) for mode in ("pre-ping", "closed check")
        }
    finally:
        async with admin.connect() as c:
            await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
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
