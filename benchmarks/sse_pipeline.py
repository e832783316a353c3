"""Event pipeline benchmark: worker publishes → JetStream → gateway relay → N SSE clients.

Prints a table: for N = 1, 100, 1000 SSE clients, deliveries/s and p50/p99 latency from
publish to receipt by the client, beside raw nats-py publish→subscribe on the same server.

    uv run python benchmarks/sse_pipeline.py [--events 200] [--rate 100] [--clients 1,100,1000]

Uses the NATS/PostgreSQL of KARIOS_NATS_URL / KARIOS_DATABASE_URL (default 127.0.0.1).
The gateway runs as its own process (`karios run api-gateway`), as in production.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid

import nats

from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Event
from karios.common.settings import KariosSettings

TOKEN = "kt_bench-" + uuid.uuid4().hex


class BenchTick(Event):
    TYPE = "karios.bench.tick.v1"
    seq: int
    sent_ns: int
    job_id: str = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def sse_client(
    port: int, n_expected: int, latencies: list[float], ready: asyncio.Event, done: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(
        f"GET /controlnode/events?channel=provision HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    got = 0
    try:
        while got < n_expected:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b": connected"):
                ready.set()
            if line.startswith(b"data: "):
                # Cheap extraction (a JSON parse per delivery would make the client the bottleneck).
                at = line.find(b'"sent_ns":')
                if at < 0:
                    continue
                end = line.find(b",", at)
                sent = int(line[at + 10 : end if end > 0 else line.find(b"}", at)])
                latencies.append((time.time_ns() - sent) / 1e6)
                got += 1
    finally:
        done.append(got)
        writer.close()


async def run_sse(n_clients: int, events: int, rate: float, port: int, settings: KariosSettings) -> dict:
    latencies: list[float] = []
    done: list[int] = []
    readies = [asyncio.Event() for _ in range(n_clients)]
    tasks = []
    for i in range(n_clients):
        tasks.append(asyncio.create_task(sse_client(port, events, latencies, readies[i], done)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    bus = Bus.from_settings(settings, "bench-worker")
    await bus.start()
    t0 = time.perf_counter()
    for i in range(events):
        await bus.publish_event(
            BenchTick(seq=i, sent_ns=time.time_ns()), bus.subjects.evt("provision", "bench", "bench")
        )
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    except TimeoutError:
        for t in tasks:
            t.cancel()
    elapsed = time.perf_counter() - t0
    await bus.stop()
    return {
        "n": n_clients,
        "deliveries": len(latencies),
        "expected": n_clients * events,
        "rate": len(latencies) / elapsed,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
    }


async def run_raw(events: int, rate: float, url: str) -> dict:
    nc = await nats.connect(url)
    subj = f"bench.raw.{uuid.uuid4().hex}"
    latencies: list[float] = []
    got = asyncio.Event()

    async def cb(msg) -> None:  # type: ignore[no-untyped-def]
        latencies.append((time.time_ns() - int(msg.data)) / 1e6)
        if len(latencies) >= events:
            got.set()

    await nc.subscribe(subj, cb=cb)
    t0 = time.perf_counter()
    for i in range(events):
        await nc.publish(subj, str(time.time_ns()).encode())
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    await asyncio.wait_for(got.wait(), 30)
    elapsed = time.perf_counter() - t0
    await nc.close()
    return {
        "n": 1,
        "deliveries": len(latencies),
        "expected": events,
        "rate": len(latencies) / elapsed,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--rate", type=float, default=100.0, help="events per second published")
    ap.add_argument("--clients", default="1,100,1000")
    ap.add_argument("--limit-ms", type=float, default=100.0, help="p99 publish→delivery limit (issue 14)")
    args = ap.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "KARIOS_DEV_MODE": "1",
        "KARIOS_BUS_PREFIX": prefix,
        "KARIOS_BOOTSTRAP_ADMIN_TOKEN": TOKEN,
        "KARIOS_LOG_LEVEL": "WARNING",
    }
    env.setdefault("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
    env.setdefault("KARIOS_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/karios_bench")
    port = free_port()
    settings = KariosSettings(
        dev_mode=True,
        nats_url=env["KARIOS_NATS_URL"],
        database_url=env["KARIOS_DATABASE_URL"],
        bus_prefix=prefix,
    )
    gw = subprocess.Popen(
        [sys.executable, "-m", "karios.cli", "run", "api-gateway", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        rows = [("raw nats-py pub→sub", await run_raw(args.events, args.rate, env["KARIOS_NATS_URL"]))]
        for n in [int(x) for x in args.clients.split(",")]:
            rows.append((f"SSE, {n} client(s)", await run_sse(n, args.events, args.rate, port, settings)))
    finally:
        gw.terminate()
        try:
            gw.wait(30)
        except subprocess.TimeoutExpired:
            gw.kill()
        nc = await nats.connect(env["KARIOS_NATS_URL"])
        js = nc.jetstream()
        for s in ("CMD", "EVT", "DLQ"):
            with contextlib.suppress(Exception):
                await js.delete_stream(f"{prefix.upper()}_{s}")
        await nc.close()
    print(f"\nEvent pipeline, {args.events} events at {args.rate:.0f}/s published, {os.cpu_count()} CPUs\n")
    limit = f"p99/{args.limit_ms:.0f}ms"
    print(
        f"| {'path':24s} | {'delivered':>15s} | {'deliveries/s':>12s} | {'p50 ms':>8s} | {'p99 ms':>8s} |"
        f" {limit:>10s} |"
    )
    print(f"|{'-' * 26}|{'-' * 17}|{'-' * 14}|{'-' * 10}|{'-' * 10}|{'-' * 12}|")
    for name, r in rows:
        delivered = f"{r['deliveries']:>7d}/{r['expected']:<7d}"
        print(
            f"| {name:24s} | {delivered} | {r['rate']:>12.0f} | {r['p50']:>8.2f} | {r['p99']:>8.2f} |"
            f" {r['p99'] / args.limit_ms:>10.2f} |"
        )
    print("ratio p99/limit: <= 1 meets the limit (publish→delivery, load generator in this process,")
    print("the gateway in its own)")


if __name__ == "__main__":
    try:  # the clients run on the same 2 cores as the gateway: give them the fast loop too
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
